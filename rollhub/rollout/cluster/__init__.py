"""Scale-out on Ray: env-manager shards over the run's engine fleet.

The single-machine classes (EnvManager, GroupBuffer, the EngineRouter every shard uses over
the fleet's servers) are reused as they are; the engine fleet itself is
rollhub.inference.engines (`engine.placement: ray` places its servers on Ray nodes). This
package only places env shards:

* `config.ClusterConfig`   -- the `cluster:` section of a train config (no Ray import);
* `env_shard.EnvShard`     -- Ray actor that owns one EnvManager and its envs;
* `backend.RayRollout`     -- the driver side: central GroupBuffer admission, dispatch,
  weight push through the fleet, fault handling and accounting. Same surface as EnvManager
  (`run`, `collect_batch`, `update_weights`, `summary`, `close`).

Nothing here imports Ray at module import time except `backend`'s helpers on use, so the
CLI and configs stay import-light.
"""
