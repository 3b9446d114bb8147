"""`cluster:` section of a train config: where rollout work runs.

`backend: local` (default) keeps everything in one asyncio process; `backend: ray`
places env-manager shards and engine servers as Ray actors (see docs/ray.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ClusterConfig:
    """Placement of rollout work. Only read when `backend == "ray"`; the engines' own knobs
    (threads, batch size) are the run's `engine:` section, the same as in a local run."""

    backend: Literal["local", "ray"] = "local"  # local: one process; ray: shards, engines and ranks as Ray actors
    address: str | None = (
        None  # Ray address ("auto", "ray://host:10001"); None = join RAY_ADDRESS or start a local instance
    )
    local_num_cpus: int | None = None  # num_cpus of a local Ray instance started by rollhub (None = all cores)
    num_env_shards: int = 2  # K EnvShard actors, each owning an EnvManager and its envs
    num_engines: int = 2  # M engine servers behind the router
    # rollhub = transformers engine behind `rollhub serve`'s HTTP app (CPU); sglang = sglang.launch_server
    engine: Literal["rollhub", "sglang"] = "rollhub"
    engine_num_cpus: float = 0.5  # Ray scheduling resources of one engine actor
    engine_num_gpus: float = 0.0  # set 1 (or tensor-parallel size) for SGLang on GPU nodes
    engine_extra_args: list[str] = field(default_factory=list)  # extra sglang.launch_server flags
    shard_num_cpus: float = 0.25  # Ray scheduling resources of one env shard
    shard_resources: dict[str, float] = field(default_factory=dict)  # custom resources, e.g. {"sandbox_host": 1}
    reap_orphan_sandboxes: bool = (
        False  # a starting shard removes its Docker host's containers whose owner died (a killed shard's)
    )
    weights_dir: str | None = None  # shared path all engine nodes can read; default RUN_DIR/weights
    keep_weight_versions: int = 2  # older pushed weight folders are deleted
    health_interval_s: float = 1.0  # how often the driver checks that engines are alive
    max_replacements: int = 16  # per run; beyond it a dead shard or engine stops the run
    startup_timeout_s: float = 600.0  # until an engine or shard actor reports it has started

    def validate(self) -> None:
        if self.num_env_shards < 1 or self.num_engines < 1:
            raise ValueError("cluster.num_env_shards and cluster.num_engines must be >= 1")
        if self.local_num_cpus is not None and self.local_num_cpus < 1:
            raise ValueError(f"cluster.local_num_cpus must be >= 1 or null (all cores), got {self.local_num_cpus}")
        requests = {"engine_num_cpus": self.engine_num_cpus, "engine_num_gpus": self.engine_num_gpus}
        requests |= {"shard_num_cpus": self.shard_num_cpus, **self.shard_resources}
        for name, amount in requests.items():
            if not amount >= 0:  # `not >=` so that nan fails too
                raise ValueError(f"cluster resource requests must be >= 0, got {name}={amount}")
        if self.keep_weight_versions < 1:
            raise ValueError("cluster.keep_weight_versions must be >= 1 (engines being replaced load the latest)")
        if not self.health_interval_s > 0:
            raise ValueError("cluster.health_interval_s must be > 0")
        if self.max_replacements < 0:
            raise ValueError("cluster.max_replacements must be >= 0")
        if not self.startup_timeout_s > 0:
            raise ValueError(f"cluster.startup_timeout_s must be > 0, got {self.startup_timeout_s}")
