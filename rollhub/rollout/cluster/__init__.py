"""Scale-out on Ray: env-manager shards, engine servers and a prefix-affine router.

The single-machine classes (EnvManager, GroupBuffer, HFEngine behind `rollhub serve`,
SGLangEngine, and the EngineRouter every shard uses over the M servers) are reused as they
are; this package only places them with Ray:

* `config.ClusterConfig`   -- the `cluster:` section of a train config (no Ray import);
* `engine_server.EngineServer` -- Ray actor that runs one engine server on its node;
* `env_shard.EnvShard`     -- Ray actor that owns one EnvManager and its envs;
* `backend.RayRollout`     -- the driver side: central GroupBuffer admission, dispatch,
  weight push, fault handling and accounting. Same surface as EnvManager
  (`run`, `collect_batch`, `update_weights`, `summary`, `close`).

Nothing here imports Ray at module import time except `backend`'s helpers on use, so the
CLI and configs stay import-light.
"""
