"""`cluster:` section of a train config: where env shards run.

`backend: local` (default) keeps every env in one asyncio process; `backend: ray` places
env-manager shards as Ray actors (see docs/ray.md). Engine servers are the `engine:`
section's (`engine.placement: ray` puts them on Ray nodes), never this section's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal


@dataclass
class ClusterConfig:
    """Placement of env shards and the Ray connection. Only read when `backend == "ray"` (the Ray
    connection also when `engine.placement == "ray"`)."""

    #: the engine knobs this section once had, refused with the `engine:` key that holds them now
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "num_engines": "engine.replicas",
        "engine": "engine.launch (rollhub or sglang)",
        "engine_num_cpus": "engine.ray_num_cpus",
        "engine_num_gpus": "engine.ray_num_gpus",
        "engine_extra_args": "engine.launch (a command template with the extra flags)",
        "weights_dir": "engine.weights_dir",
        "keep_weight_versions": "engine.weights_dir (the disk weight sync keeps the latest version only)",
        "health_interval_s": "engine.watchdog_interval_s",
    }

    backend: Literal["local", "ray"] = "local"  # local: one process; ray: env shards and trainer ranks as Ray actors
    address: str | None = (
        None  # Ray address ("auto", "ray://host:10001"); None = join RAY_ADDRESS or start a local instance
    )
    local_num_cpus: int | None = None  # num_cpus of a local Ray instance started by rollhub (None = all cores)
    num_env_shards: int = 2  # K EnvShard actors, each owning an EnvManager and its envs
    shard_num_cpus: float = 0.25  # Ray scheduling resources of one env shard
    shard_resources: dict[str, float] = field(default_factory=dict)  # custom resources, e.g. {"sandbox_host": 1}
    reap_orphan_sandboxes: bool = (
        False  # a starting shard removes its Docker host's containers whose owner died (a killed shard's)
    )
    max_replacements: int = 16  # shard replacements per run; beyond it a dead shard stops the run
    startup_timeout_s: float = 600.0  # until a shard or trainer rank actor reports it has started

    def validate(self) -> None:
        if self.num_env_shards < 1:
            raise ValueError("cluster.num_env_shards must be >= 1")
        if self.local_num_cpus is not None and self.local_num_cpus < 1:
            raise ValueError(f"cluster.local_num_cpus must be >= 1 or null (all cores), got {self.local_num_cpus}")
        requests = {"shard_num_cpus": self.shard_num_cpus, **self.shard_resources}
        for name, amount in requests.items():
            if not amount >= 0:  # `not >=` so that nan fails too
                raise ValueError(f"cluster resource requests must be >= 0, got {name}={amount}")
        if self.max_replacements < 0:
            raise ValueError("cluster.max_replacements must be >= 0")
        if not self.startup_timeout_s > 0:
            raise ValueError(f"cluster.startup_timeout_s must be > 0, got {self.startup_timeout_s}")
