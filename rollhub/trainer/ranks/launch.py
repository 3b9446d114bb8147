"""Starting trainer ranks: under torchrun, as local processes, or as a Ray actor group.

The job (`rollhub.trainer.job.run_training`) is handed in by the caller, the CLI: rank 0 runs
it with the `RankGroup`, the other ranks serve rank 0's commands (rollhub.trainer.ranks.group).

Ray (`cluster.backend: ray` with `trainer.world_size: N`): N `TrainerRank` actors are placed in
one placement group, one bundle per rank (`trainer.ray_num_cpus` / `trainer.ray_num_gpus` each:
one GPU per rank on GPU nodes), PACK strategy, so ranks share a node when one has room and
spread over nodes when not. Rank 0's actor picks the rendezvous (its node IP and a free port);
every actor sets the launch variables torchrun would (RANK, WORLD_SIZE, LOCAL_RANK 0, since Ray
gives each actor its own CUDA_VISIBLE_DEVICES, MASTER_ADDR/PORT) and runs the very code a
torchrun rank runs, `run_rank`: torch.distributed (NCCL on GPU, gloo on CPU) between the
actors, rank 0 leading the job. Rank 0 also owns rollout: with `cluster.backend: ray` its env
shards and engine servers are Ray actors of their own (rollhub.rollout.cluster), not captured
by the trainer's placement group. The driver only waits: it returns rank 0's summary, and
whatever ends the run (an error in any rank, Ctrl-C) it kills every actor of the group and
removes the placement group, so no rank is left waiting inside a collective.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from rollhub.core.errors import UserError
from rollhub.trainer.build import build_optimizer, build_policy, build_reference, sharded_config
from rollhub.trainer.config import RunConfig
from rollhub.trainer.ranks.group import RANK_ENV, RankGroup, init_ranks

logger = logging.getLogger(__name__)


class Job(Protocol):
    """What rank 0 runs: `rollhub.trainer.job.run_training`."""

    def __call__(
        self, config: RunConfig, *, resume: bool, progress: bool, print_fn: Callable[[str], None], ranks: RankGroup
    ) -> Awaitable[Any]: ...


def launched_ranks() -> int:
    """WORLD_SIZE when torchrun (or our own launcher) started this process as one of several ranks, else 0."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "0"))
    except ValueError:
        return 0
    return world if world > 1 and "RANK" in os.environ else 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the rendezvous of a group started here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _build_follower(config: RunConfig, payload: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A follower's shards: the same policy, optimizer and reference rank 0 builds (rollhub.trainer.build),
    empty until `RankGroup.attach` receives their weights from rank 0."""
    sharded = sharded_config(config)
    policy = build_policy(sharded, Path(payload["model_dir"]))
    optimizer = build_optimizer(policy, config)
    reference = build_reference(sharded, Path(payload["reference_dir"]), policy)
    return policy, optimizer, reference


def run_rank(
    config: RunConfig,
    job: Job | None,
    *,
    resume: bool,
    progress: bool = True,
    print_fn: Callable[[str], None] = print,
) -> Any:
    """This process as one trainer rank (launch variables set): rank 0 runs `job`, the others serve it.

    Returns rank 0's TrainingSummary, None on the other ranks (which never call `job`). On success rank 0 releases the
    followers; on an error it does not try to (they may be inside a collective that will never
    complete): its exit ends them (torchrun stops the group, local ranks die with their parent,
    the Ray driver kills the actor group).
    """
    import asyncio

    context = init_ranks(config.trainer.backend, config.trainer.collective_timeout_s, config.model.device)
    if config.trainer.world_size not in (1, context.world_size):
        raise UserError(
            f"trainer.world_size={config.trainer.world_size} but the launcher started {context.world_size} ranks; "
            "set one of them"
        )
    torch.set_num_threads(config.model.threads)
    group = RankGroup(context)
    if not context.is_leader:
        try:
            group.serve(lambda payload: _build_follower(config, payload))
        finally:
            dist.destroy_process_group()
        return None
    if job is None:
        raise RuntimeError("rank 0 was started without the job to run")
    summary = asyncio.run(job(config, resume=resume, progress=progress, print_fn=print_fn, ranks=group))
    group.stop()
    dist.destroy_process_group()
    return summary


def end_follower_process(code: int = 0) -> None:
    """End a follower rank's process now, after its group was destroyed, skipping interpreter teardown.

    Why not a normal exit: gloo's C++ objects (store client, transport threads) are finalised
    with the interpreter, and a follower whose rank 0 has already gone occasionally dies there
    with `terminate called without an active exception` (SIGABRT, exit 134) although all its
    work, `destroy_process_group` included, had finished: seen once in ~90 two-rank runs on
    this machine, and once in CI. Nothing is left to finalise that matters, so stdio and
    logging are flushed and the process ends with `os._exit`.
    """
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the process that started it dies (even by SIGKILL)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable; a killed rank 0 leaves this rank to its timeout")


#: the followers' entry: a fresh interpreter (not a multiprocessing child, so rank 0 may itself
#: be a daemonic process); argv[1] is the run folder, only so that `ps` shows whose rank it is
_FOLLOWER_CODE = "from rollhub.trainer.ranks.launch import local_follower_main; local_follower_main()"
PARENT_ENV = "ROLLHUB_RANK_PARENT"


def local_follower_main() -> None:
    """Entry of a follower process started by `train_with_local_ranks` (config pickled on stdin)."""
    import pickle
    import sys

    _die_with_parent()
    if str(os.getppid()) != os.environ.get(PARENT_ENV):  # the parent died before the death signal was armed
        os._exit(1)
    config = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run_rank(config, None, resume=False, progress=False)
    end_follower_process(0)


def train_with_local_ranks(
    config: RunConfig, job: Job, *, resume: bool, progress: bool = True, print_fn: Callable[[str], None] = print
) -> Any:
    """`trainer.world_size: N` on one machine: this process is rank 0, N - 1 new processes follow.

    The followers are killed with this process whatever ends it (PR_SET_PDEATHSIG), so a
    SIGKILLed run leaves no rank behind; `rollhub train --resume` starts a new group.
    """
    import pickle
    import subprocess
    import sys

    world = config.trainer.world_size
    port = free_port()
    launch = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    followers = []
    for rank in range(1, world):
        env = {**os.environ, **launch, "RANK": str(rank), "LOCAL_RANK": str(rank), PARENT_ENV: str(os.getpid())}
        proc = subprocess.Popen(
            [sys.executable, "-c", _FOLLOWER_CODE, str(config.run_dir)], stdin=subprocess.PIPE, env=env
        )
        proc.stdin.write(pickle.dumps(config))
        proc.stdin.close()
        followers.append(proc)
    saved = {name: os.environ.get(name) for name in RANK_ENV}
    os.environ.update(launch, RANK="0", LOCAL_RANK="0")
    try:
        summary = run_rank(config, job, resume=resume, progress=progress, print_fn=print_fn)
        codes = [proc.wait(timeout=60) for proc in followers]
        if any(codes):
            raise RuntimeError(f"trainer ranks exited with {codes} (see their logs above)")
        return summary
    finally:
        for proc in followers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if dist.is_initialized():
            dist.destroy_process_group()


def train_on_ranks(
    config: RunConfig, job: Job, *, resume: bool, progress: bool = True, print_fn: Callable[[str], None] = print
) -> Any:
    """`rollhub train` with ranks: under a launcher (torchrun, a Ray actor), or starting them itself.

    Returns rank 0's TrainingSummary, None on the other ranks.
    """
    if launched_ranks():
        return run_rank(config, job, resume=resume, progress=progress, print_fn=print_fn)
    if config.cluster.backend == "ray":
        return train_with_ray_actors(config, job, resume=resume)
    return train_with_local_ranks(config, job, resume=resume, progress=progress, print_fn=print_fn)


# --- Ray ---------------------------------------------------------------------------------


class TrainerRank:
    """One trainer rank inside a Ray actor (wrapped with `ray.remote` by `train_with_ray_actors`)."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: the address the group meets at (this node's IP, a port free on it now)."""
        import ray

        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def run(self, config: RunConfig, job: Job, resume: bool, master_addr: str, master_port: int) -> Any:
        """The same rank code as under torchrun; rank 0 returns the TrainingSummary, the others None."""
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",  # Ray gives each actor its own CUDA_VISIBLE_DEVICES
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return run_rank(config, job, resume=resume, progress=False)


def _absolute_paths(config: RunConfig) -> RunConfig:
    """The run and model folders as absolute paths: actors need not share the driver's working directory."""
    model = dataclasses.replace(config.model, path=str(Path(config.model.path).resolve()))
    return dataclasses.replace(config, run_dir=str(Path(config.run_dir).resolve()), model=model)


def train_with_ray_actors(config: RunConfig, job: Job, *, resume: bool) -> Any:
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
        runs = [actor.run.remote(config, job, resume, host, port) for actor in actors]
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
