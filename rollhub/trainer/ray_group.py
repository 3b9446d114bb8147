"""Trainer ranks as a Ray actor group (`cluster.backend: ray` with `trainer.world_size: N`).

N `TrainerRank` actors are placed in one placement group, one bundle per rank
(`trainer.ray_num_cpus` / `trainer.ray_num_gpus` each: one GPU per rank on GPU nodes), PACK
strategy, so ranks share a node when one has room and spread over nodes when not. Rank 0's
actor picks the rendezvous (its node IP and a free port); every actor sets the launch
variables torchrun would (RANK, WORLD_SIZE, LOCAL_RANK 0, since Ray gives each actor its
own CUDA_VISIBLE_DEVICES, MASTER_ADDR/PORT) and runs the very code a torchrun rank runs,
`rollhub.trainer.distributed.run_rank`: torch.distributed (NCCL on GPU, gloo on CPU) between
the actors, rank 0 leading the job. Rank 0 also owns rollout: with `cluster.backend: ray` its
env shards and engine servers are Ray actors of their own (rollhub.rollout.cluster), not
captured by the trainer's placement group.

The driver only waits: it returns rank 0's summary, and whatever ends the run (an error in
any rank, Ctrl-C) it kills every actor of the group and removes the placement group, so no
rank is left waiting inside a collective.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError

logger = logging.getLogger(__name__)


class TrainerRank:
    """One trainer rank inside a Ray actor (wrapped with `ray.remote` by `train_with_ray_actors`)."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: the address the group meets at (this node's IP, a port free on it now)."""
        import ray

        from rollhub.trainer.distributed import free_port

        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def run(self, config: Any, resume: bool, master_addr: str, master_port: int) -> Any:
        """The same rank code as under torchrun; rank 0 returns the TrainingSummary, the others None."""
        from rollhub.trainer.distributed import run_rank

        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",  # Ray gives each actor its own CUDA_VISIBLE_DEVICES
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return run_rank(config, resume=resume, progress=False)


def _absolute_paths(config: Any) -> Any:
    """The run and model folders as absolute paths: actors need not share the driver's working directory."""
    model = dataclasses.replace(config.model, path=str(Path(config.model.path).resolve()))
    return dataclasses.replace(config, run_dir=str(Path(config.run_dir).resolve()), model=model)


def train_with_ray_actors(config: Any, *, resume: bool) -> Any:
    """Run the job on `trainer.world_size` Ray actors; returns rank 0's TrainingSummary."""
    from rollhub.rollout.cluster.backend import ensure_ray, import_ray

    ray = import_ray()
    from ray.exceptions import RayTaskError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    trainer = config.trainer
    world = trainer.world_size
    config = _absolute_paths(config)
    started = ensure_ray(config.cluster)
    bundle = {"CPU": trainer.ray_num_cpus} | ({"GPU": trainer.ray_num_gpus} if trainer.ray_num_gpus else {})
    group = placement_group([dict(bundle) for _ in range(world)], strategy="PACK", name="")
    actors: list[Any] = []
    try:
        ready, _ = ray.wait([group.ready()], timeout=config.cluster.startup_timeout_s)
        if not ready:
            raise UserError(
                f"Ray could not place {world} trainer ranks of {bundle} each within "
                f"cluster.startup_timeout_s={config.cluster.startup_timeout_s}; check 'ray status' for free "
                "resources, or lower trainer.ray_num_cpus / trainer.ray_num_gpus"
            )
        remote = ray.remote(TrainerRank)
        for rank in range(world):
            strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=rank)
            options = {"num_cpus": trainer.ray_num_cpus, "num_gpus": trainer.ray_num_gpus}
            actors.append(remote.options(scheduling_strategy=strategy, **options).remote(rank, world))
        host, port = ray.get(actors[0].rendezvous.remote())
        runs = [actor.run.remote(config, resume, host, port) for actor in actors]
        pending = list(runs)
        while pending:  # the first failure ends the group (the others would wait in a collective)
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done[0])
        return ray.get(runs[0])
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, UserError):
            raise UserError(str(cause)) from None
        raise
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)
        if started:
            ray.shutdown()
