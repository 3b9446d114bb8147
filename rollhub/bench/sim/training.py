"""A thin training driver for scheduling benchmarks: the shipped loop, simulated costs.

What runs for real: the training loop itself (`rollhub.trainer.rl_loop`), `EnvManager`
(lockstep, env-level async, redundancy, weight updates), `GroupBuffer` (α admission,
redundant groups' slots, staleness drops), the agent layer with the real tokenizer, each
built from the run sections a training run with these knobs would have. What is simulated:
the engine (`LatencyModelEngine`), the envs (`bench/Latency*-v0`) and the learner, whose
step is a sleep of `train_step_s` (`SleepLearner`). Everything runs on the virtual-clock
loop, so a 900 s simulated step costs only the CPU the scheduling itself needs; that CPU
time is reported as the scheduler overhead.

As in a training run, lockstep collects each batch when the loop asks for it; otherwise the
manager fills the buffer in the background (with α = 0 it never runs ahead of the batch the
trainer is about to take) while the loop takes batches, trains and pushes weights (pause ->
abort -> update -> resume). Per-step waits and step ends come from the learner's and the
loop's after-step records, on the virtual clock.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rollhub.bench.sim.latency_model import LatencyParams, OutputLengths

logger = logging.getLogger(__name__)

# A GPU-class replica (simulated): ~30 ms/token alone, batch slowdown, fast prefill. Scale
# is what matters: generation takes seconds per turn while env steps take ~10 s, as in the
# ROLL Flash synthetic-latency experiment.
GPU_REPLICA = LatencyParams(
    prefill_base_s=0.02,
    prefill_per_token_s=0.00002,
    decode_base_s=0.03,
    decode_per_request_s=0.0003,
    max_batch=128,
    weight_update_s=2.0,
    prefill_blocks_decode=False,
    source="hand-set GPU-class replica (simulation)",
)


@dataclass
class SimRun:
    """One simulated training run (see module docstring)."""

    name: str = "run"
    env_id: str = "bench/LatencySokoban-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    mode: Literal["lockstep", "env_async"] = "env_async"
    groups: int = 32  # G: groups per training batch
    group_size: int = 8  # N
    extra_groups: int = 0  # g: redundant groups started per batch
    extra_per_group: int = 0  # r: redundant trajectories per group
    alpha: float = 0.0  # async ratio; 0 = sync training
    # Equal GPU budget, as in ROLL Flash: sync runs colocated (all `gpus` generate, then all
    # train); async splits them, `train_share` of the GPUs train while the rest generate.
    gpus: int = 16
    train_gpu_s: float = 640.0  # GPU-seconds of training per step (40 s on 16 GPUs)
    train_share: float = 0.5  # beta, async only
    steps: int = 4
    warmup_steps: int = 1
    latency: LatencyParams = GPU_REPLICA
    output_lengths: OutputLengths = OutputLengths(kind="lognormal", mean_tokens=100, sigma=0.6)
    max_new_tokens: int = 1024
    resume_mode: str = "partial"
    routing: str = "least_loaded"  # or "prompt_affinity": all samples of a prompt on one replica
    seed: int = 0

    def validate(self) -> None:
        if self.mode == "lockstep" and (self.alpha or self.extra_groups or self.extra_per_group):
            raise ValueError("lockstep is the sync baseline: alpha and redundancy must be 0")
        if self.steps <= self.warmup_steps:
            raise ValueError("steps must exceed warmup_steps")
        if self.alpha > 0 and self.gpus < 2:
            raise ValueError("async training needs >= 2 GPUs (one trains, one generates)")
        if not 0 < self.train_share < 1:
            raise ValueError("train_share must be in (0, 1)")

    @property
    def train_gpus(self) -> int:
        if self.alpha == 0:
            return self.gpus
        return min(self.gpus - 1, max(1, round(self.train_share * self.gpus)))

    @property
    def replicas(self) -> int:
        """Simulated inference GPUs (one engine replica each)."""
        return self.gpus if self.alpha == 0 else self.gpus - self.train_gpus

    @property
    def train_step_s(self) -> float:
        return self.train_gpu_s / self.train_gpus


@dataclass
class SimResult:
    name: str
    step_s: float  # mean simulated time per training step after warm-up
    step_times_s: list[float]
    trainer_idle_fraction: float
    mean_trajectory_s: float  # of trajectories that finished, after warm-up
    mean_longest_trajectory_s: float  # per step, sync runs only (0 otherwise)
    cpu_s_per_step: float  # real CPU the whole process used per step (simulators included)
    scheduler_cpu_s_per_step: float  # the same minus the simulators (engine model, sim tokenizer)
    peak_trajectories_in_flight: int
    train_step_s: float
    weight_update_s: float
    replicas: int
    redundant_cancelled: int
    dropped_stale: int
    mean_staleness: float
    engine_utilisation: float
    env_calls: int
    summary: dict[str, Any]
    # for the agentic bound (theory.AgenticWorkload), over the same finished trajectories as
    # mean_trajectory_s: time inside env reset/step (off the GPU), and over the trajectories
    # the trainer consumed: their generation's GPU work at the engine's best throughput
    mean_env_s: float = 0.0
    mean_gen_work_s: float = 0.0
    max_gen_work_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TimedEnv:
    """Wraps an env to record, on the loop's clock, when its episode started and ended."""

    def __init__(self, env: Any):
        self.env = env
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.env_calls = 0
        self.env_s = 0.0  # loop time spent inside reset/step: the trajectory's off-GPU latency

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    async def reset(self, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        self.started_at, self.finished_at, self.env_s = loop.time(), None, 0.0
        try:
            return await self.env.reset(**kwargs)
        finally:
            self.env_s += loop.time() - self.started_at

    async def step(self, action: str) -> Any:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            result = await self.env.step(action)
        finally:
            self.env_s += loop.time() - started
        self.env_calls += 1
        if result[2] or result[3]:
            self.finished_at = loop.time()
        return result

    async def close(self) -> None:
        await self.env.close()


def measured_speedup_bound(sync_run: SimResult, alpha: float) -> float:
    """Prop. 2 S(α) with the workload measured in a sync env-async run: a = mean trajectory
    time + training time (under processor sharing the mean latency is the balanced share
    N·μ_gen/K) and L_gen = the batch's longest trajectory."""
    from rollhub.bench import theory

    a = sync_run.mean_trajectory_s + sync_run.train_step_s
    return theory.speedup_bound_from_ratio(sync_run.mean_longest_trajectory_s / a, alpha)


def token_gpu_s(params: LatencyParams) -> float:
    """GPU-seconds one decoded token costs at the replica's best throughput: the minimum
    over batch sizes up to max_batch of iteration time / batch."""
    return min(params.iteration_s(b) / b for b in range(1, params.max_batch + 1))


def trajectory_gen_work_s(trajectory: Any, params: LatencyParams, per_token_s: float | None = None) -> float:
    """GPU work of one trajectory's generation at the best throughput: its decoded tokens,
    plus its prefills where they stall decoding (with prefill_blocks_decode=False they run
    beside the batch and cost latency, not throughput). Tokens discarded by aborts are not
    counted (they only add work)."""
    per_token = token_gpu_s(params) if per_token_s is None else per_token_s
    work = sum(len(turn.response_ids) for turn in trajectory.turns) * per_token
    if params.prefill_blocks_decode:
        work += sum(params.prefill_s(len(turn.prompt_ids)) for turn in trajectory.turns)
    return work


def measured_agentic_workload(sync_run: SimResult, samples_per_step: int, tail_s: float | None = None) -> Any:
    """theory.AgenticWorkload of a sync run (all K GPUs generate, then train): GPU work,
    env latency and mean wall time per trajectory as measured there, L = the measured
    collection time (its slowest trajectory), or `tail_s` (e.g. the lockstep run's, whose
    every trajectory waits for the slowest env at each turn)."""
    from rollhub.bench import theory

    return theory.AgenticWorkload(
        samples_per_step=samples_per_step,
        workers=sync_run.replicas,
        gen_s=sync_run.mean_gen_work_s,
        gen_tail_s=sync_run.max_gen_work_s,
        env_s=sync_run.mean_env_s,
        tail_s=sync_run.mean_longest_trajectory_s if tail_s is None else tail_s,
        train_s_per_sample=sync_run.train_step_s * sync_run.replicas / samples_per_step,
        push_s=sync_run.weight_update_s,
        wall_s=sync_run.mean_trajectory_s,
    )


def pipeline_floor_s(result: SimResult, sync_run: SimResult, alpha: float) -> float:
    """The best step time any scheduler could reach with this run's GPU split: the trainer
    cannot step faster than its own compute plus the weight push, and with (α+1)·B
    trajectories in flight, each lasting the mean trajectory time of the sync run, B of
    them finish at most every mean_trajectory / (α+1) seconds."""
    return max(result.train_step_s + result.weight_update_s, sync_run.mean_trajectory_s / (alpha + 1))


def make_tokenizer(kind: str = "sim") -> Any:
    """ "sim": the cheap SimTokenizer; "real": the committed BPE tokenizer of the tiny model."""
    if kind == "real":
        from rollhub.inference.models import build_tokenizer

        return build_tokenizer()
    if kind != "sim":
        raise ValueError(f"tokenizer must be 'sim' or 'real', got {kind!r}")
    from rollhub.bench.sim.tokenizer import SimTokenizer

    return SimTokenizer()


class SleepLearner:
    """A `rollhub.trainer.rl_loop.Learner` whose step is a sleep of `train_step_s` (simulated
    seconds on the virtual clock); it records, on the loop's clock, when each batch reached it
    and what the batch held."""

    def __init__(self, train_step_s: float) -> None:
        self.train_step_s = train_step_s
        self.batches: list[list[Any]] = []
        self.arrivals: list[float] = []  # loop time at which each batch reached the learner

    async def step(self, groups: list[Any], version: int) -> dict[str, Any]:
        self.arrivals.append(asyncio.get_running_loop().time())
        self.batches.append(groups)
        await asyncio.sleep(self.train_step_s)
        return {}

    async def weights(self) -> Any:
        return None  # the simulated engine loads nothing


async def train_simulated(
    learner: SleepLearner,
    manager: Any,
    buffer: Any,
    *,
    groups: int,
    steps: int,
    after_step: list[Any] | None = None,
) -> list[float]:
    """The shipped loop (`rl_loop`) with `learner`, the producer started and stopped around it as
    the training job does; returns the loop time at which each step ended (weights pushed)."""
    from rollhub.trainer.rl_loop import LoopState, rl_loop

    loop = asyncio.get_running_loop()
    step_ends: list[float] = []

    async def mark_end(state: Any, record: dict[str, Any]) -> None:
        step_ends.append(loop.time())

    stop = asyncio.Event()
    producer = None if buffer is None else asyncio.ensure_future(manager.run(stop))
    try:
        await rl_loop(
            learner,
            manager,
            buffer,
            LoopState(),
            groups_per_batch=groups,
            steps=steps,
            after_step=[mark_end, *(after_step or [])],
        )
    finally:
        stop.set()
        if producer is not None:
            await producer
    return step_ends


def rollout_sections(run: SimRun) -> dict[str, Any]:
    """The run sections (`env`, `rollout`, `agent`) a training run with these knobs would have."""
    from rollhub.rollout.agent import AgentConfig
    from rollhub.rollout.config import EnvConfig, RolloutConfig

    sync = run.alpha == 0
    concurrency = (
        (run.groups + run.extra_groups) * (run.group_size + run.extra_per_group) * (1 if sync else int(run.alpha + 2))
    )
    return {
        "env": EnvConfig(
            id=run.env_id, kwargs=dict(run.env_kwargs), train_seed_offset=run.seed * 100_000, max_concurrent=concurrency
        ),
        "rollout": RolloutConfig(
            group_size=run.group_size,
            groups_per_batch=run.groups,
            async_ratio=run.alpha,
            lockstep=run.mode == "lockstep",
            redundant_groups=run.extra_groups,
            redundant_trajectories=run.extra_per_group,
        ),
        "agent": AgentConfig(
            max_new_tokens=run.max_new_tokens, min_new_tokens=1, max_context_tokens=1 << 20, resume_mode=run.resume_mode
        ),
    }


def run_buffer(rollout: Any) -> Any:
    """The hand-off a training run builds for `rollout` (rollhub.trainer.build): none in lockstep;
    otherwise the α-bounded buffer with the redundant groups' own slots and the staleness rule."""
    from rollhub.rollout.buffer import GroupBuffer

    if rollout.lockstep:
        return None
    return GroupBuffer(
        rollout.groups_per_batch,
        rollout.async_ratio,
        redundant_groups=rollout.redundant_groups,
        staleness_rule=rollout.staleness_rule,
    )


async def simulate(run: SimRun, tokenizer: Any | None = None) -> SimResult:
    """Run `run` on the current (virtual-clock) loop."""
    from rollhub.bench.sim.latency_model import LatencyModelEngine
    from rollhub.envs.registry import make
    from rollhub.rollout.manager import EnvManager

    run.validate()
    tokenizer = tokenizer or make_tokenizer()
    if hasattr(tokenizer, "busy_s"):
        tokenizer.busy_s = 0.0
    loop = asyncio.get_running_loop()
    engine = LatencyModelEngine(
        run.latency,
        output_lengths=run.output_lengths,
        replicas=run.replicas,
        vocab_size=len(tokenizer),
        seed=run.seed,
        routing=run.routing,
    )
    envs: list[Any] = []

    def env_factory(env_id: str, **kwargs: Any) -> Any:
        if env_id.startswith("bench/"):
            kwargs = {**kwargs, "latency_seed": run.seed * 1_000_003 + len(envs), "time_scale": 1.0}
        env = TimedEnv(make(env_id, **kwargs))
        envs.append(env)
        return env

    sections = rollout_sections(run)
    buffer = run_buffer(sections["rollout"])
    manager = EnvManager(engine, tokenizer, **sections, buffer=buffer, env_factory=env_factory)
    learner = SleepLearner(run.train_step_s)
    env_marks = [0]  # envs made before each step's batch was asked for
    measured: dict[str, Any] = {}

    async def mark_envs(state: Any, record: dict[str, Any]) -> None:
        env_marks.append(len(envs))

    async def measure_last_step(state: Any, record: dict[str, Any]) -> None:
        """At the end of the last step, before the producer is stopped (its cancellations are shutdown,
        not the schedule's work)."""
        if state.version < run.steps:
            return
        measured["cpu"] = time.process_time() - cpu_start
        measured["wall"] = time.perf_counter() - wall_start
        measured["summary"] = manager.summary()

    peak = 0

    async def sample_in_flight() -> None:
        nonlocal peak
        while True:
            peak = max(peak, manager.open_envs)
            await asyncio.sleep(1.0)

    sampler = asyncio.ensure_future(sample_in_flight())
    start = loop.time()
    cpu_start = time.process_time()
    wall_start = time.perf_counter()
    try:
        step_ends = await train_simulated(
            learner, manager, buffer, groups=run.groups, steps=run.steps, after_step=[mark_envs, measure_last_step]
        )
    finally:
        sampler.cancel()
        await manager.close()
    cpu, wall, summary = measured["cpu"], measured["wall"], measured["summary"]
    # The simulators time themselves with perf_counter (a CPU-time syscall per call would cost more
    # than what it measures); their share of the wall time, applied to the process CPU time, is the
    # simulators' CPU.
    simulator_share = (engine.sim_wall_s + float(getattr(tokenizer, "busy_s", 0.0))) / wall if wall > 0 else 0.0
    simulator_cpu = cpu * min(1.0, simulator_share)
    # a step's wait: from the end of the previous step (or the start) to its batch reaching the learner
    waits = [arrival - begun for arrival, begun in zip(learner.arrivals, [start, *step_ends[:-1]])]
    # with sync training (alpha = 0) the wait is the batch's collection, set by its slowest trajectory
    longest = waits if run.alpha == 0 else []
    consumed = [t for batch in learner.batches[run.warmup_steps :] for group in batch for t in group.trajectories]
    w = run.warmup_steps
    span = step_ends[-1] - step_ends[w - 1] if w else step_ends[-1] - start
    measured_steps = run.steps - w
    finished = [e for e in envs[env_marks[w] :] if e.finished_at is not None]
    per_token = token_gpu_s(run.latency)
    consumed_work = [trajectory_gen_work_s(t, run.latency, per_token) for t in consumed]
    durations = [e.finished_at - e.started_at for e in finished]
    return SimResult(
        name=run.name,
        step_s=span / measured_steps,
        step_times_s=[b - a for a, b in zip([start, *step_ends[:-1]], step_ends)],
        trainer_idle_fraction=sum(waits[w:]) / span if span > 0 else 0.0,
        mean_trajectory_s=statistics.fmean(durations) if durations else 0.0,
        mean_longest_trajectory_s=statistics.fmean(longest[w:]) if longest[w:] else 0.0,
        cpu_s_per_step=cpu / run.steps,
        scheduler_cpu_s_per_step=(cpu - simulator_cpu) / run.steps,
        peak_trajectories_in_flight=peak,
        train_step_s=run.train_step_s,
        weight_update_s=run.latency.weight_update_s,
        replicas=run.replicas,
        redundant_cancelled=int(summary.get("redundant_cancelled", 0)),
        dropped_stale=int(summary.get("buffer/dropped_stale", 0)),
        mean_staleness=float(summary.get("staleness/mean", 0.0)),
        engine_utilisation=engine.utilisation(loop.time() - start),
        env_calls=sum(e.env_calls for e in envs),
        summary={k: v for k, v in summary.items() if not isinstance(v, (dict, list))},
        mean_env_s=statistics.fmean(e.env_s for e in finished) if finished else 0.0,
        mean_gen_work_s=statistics.fmean(consumed_work) if consumed_work else 0.0,
        max_gen_work_s=max(consumed_work, default=0.0),
    )


def simulate_virtual(run: SimRun, tokenizer: Any | None = None) -> SimResult:
    """`simulate` on a fresh virtual-clock loop."""
    from rollhub.bench.sim.virtual_clock import run_virtual

    return run_virtual(simulate(run, tokenizer))


def best_train_share(run: SimRun, shares: list[float], tokenizer: Any | None = None) -> tuple[SimResult, float]:
    """Run `run` at each training share β and keep the fastest (what an operator would tune)."""
    from dataclasses import replace

    best: tuple[SimResult, float] | None = None
    for share in shares:
        result = simulate_virtual(replace(run, train_share=share), tokenizer)
        if best is None or result.step_s < best[0].step_s:
            best = (result, share)
    if best is None:
        raise ValueError("train_shares must not be empty")
    return best
