"""EnvManager: runs many env episodes against one engine and hands groups to the trainer.

* Env-level asynchrony: one coroutine per trajectory; each env steps as soon as its own
  generation returns (no barrier). `rollout.lockstep` is the synchronous baseline: every env
  of the batch waits for the whole batch's generations, then all step together.
* Groups: N trajectories of the same env id and seed; seeds come from a seed iterator.
* Redundancy: N+r trajectories per group (`rollout.redundant_trajectories`) and/or G+g groups
  per batch (`rollout.redundant_groups`); the first to finish are kept. Surplus trajectories
  of a group are cancelled at once (engine requests aborted through task cancellation, envs
  closed, so their containers go away) and counted as redundant work. Surplus groups depend
  on `redundancy_mode`:
  - `carry` (default): they run on and are kept for the next batch (`collect_batch` starts
    only as many new groups as it needs to have G+g running; in `run()` the buffer holds
    them). Nothing is discarded, so every task that is started is trained on: the
    difficulty mix of trained groups is the task distribution, even when hard tasks take
    longer (benchmarks/README.md, "Redundancy without bias"). Their tokens may span two
    policy versions; each keeps its own version for the off-policy correction. In `run()`
    the buffer allows redundant groups one version of lag even at α = 0, so a group that
    finishes while the trainer steps is carried, not dropped as stale.
  - `cancel`: ROLL Flash's rule: the late groups are cancelled. Faster per batch at first,
    but slow groups are the hard ones, so training sees easy tasks more often than they occur.
* Failures follow the one rule of rollhub.rollout.types. Model failures are kept and scored
  like any episode. Infra failures (env machinery, not the model) are retried with a fresh
  env, up to `max_infra_retries` per slot, else the group is dropped and a new one started,
  so a group never holds an infra-failed member (in lockstep mode it may: the trainer leaves
  such members out of the group statistics). All of this is bounded: once more than
  `rollout.max_infra_failure_rate` of the last `rollout.infra_failure_window` finished
  trajectories were infra failures, `collect_batch` and `run` raise `RolloutFailureError`
  (and `failure` holds it) instead of re-rolling a permanently broken env forever.
* `run(stop_event)` keeps the GroupBuffer full for async training; `collect_batch(G)` is
  the sync API; `update_weights(source, version)` = pause -> abort -> update -> resume.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from rollhub.inference.engines.base import InferenceEngine
from rollhub.rollout.admission import fill_buffer
from rollhub.rollout.agent import AgentConfig, EpisodeRunner
from rollhub.rollout.buffer import GroupBuffer, Ticket
from rollhub.rollout.config import EnvConfig, RolloutConfig
from rollhub.rollout.prompting import ChatSegments
from rollhub.rollout.tasks import TaskOwner
from rollhub.rollout.trajectory_log import TrajectoryWriter
from rollhub.rollout.types import Group, RolloutFailureError, Trajectory, TrajectoryStatus
from rollhub.rollout.weight_update import timed_weight_update

logger = logging.getLogger(__name__)


@dataclass
class ManagerMetrics:
    generated_tokens: int = 0  # in kept trajectories
    wasted_tokens: int = 0  # in cancelled or dropped trajectories
    trajectories_kept: int = 0
    redundant_cancelled: int = 0  # trajectories cancelled because their group/batch was complete
    groups_redundant_cancelled: int = 0
    groups_carried: int = 0  # groups still running (or done) after a batch, kept for the next (carry mode)
    infra_failures: int = 0
    infra_retries: int = 0
    groups_dropped_infra: int = 0
    groups_done: int = 0
    model_failures: collections.Counter = field(default_factory=collections.Counter)  # reason -> kept trajectories
    status_counts: collections.Counter = field(default_factory=collections.Counter)
    env_step_latency_s: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    weight_updates: list[dict[str, float]] = field(default_factory=list)
    started_at: float = field(default_factory=time.perf_counter)

    def summary(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.started_at
        latency = {}
        for env_id, values in self.env_step_latency_s.items():
            ordered = sorted(values)
            latency[env_id] = {
                "mean_ms": 1000 * statistics.fmean(ordered),
                "p50_ms": 1000 * ordered[len(ordered) // 2],
                "p95_ms": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
                "count": len(ordered),
            }
        return {
            "wall_s": elapsed,
            "generated_tokens": self.generated_tokens,
            "generation_tokens_per_s": self.generated_tokens / elapsed if elapsed > 0 else 0.0,
            "wasted_tokens": self.wasted_tokens,
            "trajectories_kept": self.trajectories_kept,
            "groups_done": self.groups_done,
            "redundant_cancelled": self.redundant_cancelled,
            "groups_redundant_cancelled": self.groups_redundant_cancelled,
            "groups_carried": self.groups_carried,
            "infra_failures": self.infra_failures,
            "infra_retries": self.infra_retries,
            "groups_dropped_infra": self.groups_dropped_infra,
            "model_failures": sum(self.model_failures.values()),
            "model_failure_reasons": dict(self.model_failures),
            "status_counts": dict(self.status_counts),
            "env_step_latency": latency,
            "weight_updates": list(self.weight_updates),
        }


class _GroupFailed(Exception):
    """A group could not get N good trajectories (infra failures beyond retries)."""


class InfraFailureWindow:
    """Whether each of the last `size` finished trajectories was an infra failure.

    A full window is needed before judging, so a few early failures of a healthy env never
    stop a run; a permanently broken env fills it with failures within `size` trajectories.
    """

    def __init__(self, size: int, max_rate: float) -> None:
        self.size = max(1, size)
        self.max_rate = max_rate
        self._outcomes: collections.deque[bool] = collections.deque(maxlen=self.size)
        self.failures = 0  # infra failures in the window, kept up to date (no re-count per trajectory)

    def add(self, infra_failed: bool) -> None:
        if len(self._outcomes) == self.size:
            self.failures -= self._outcomes[0]  # about to fall out of the window
        self._outcomes.append(infra_failed)
        self.failures += infra_failed

    @property
    def rate(self) -> float:
        return self.failures / len(self._outcomes) if self._outcomes else 0.0

    def exceeded(self) -> bool:
        """Full, and more than `max_rate` of it failed (or all of it: a rate of 1.0 still stops a dead env)."""
        if len(self._outcomes) < self.size:
            return False
        return self.failures > self.max_rate * self.size or self.failures == self.size


class EnvManager(TaskOwner):
    """Rollout on this process, configured by the run's own sections.

    `env` (id, kwargs, max_concurrent, train_seed_offset: the first seed when no `seeds` are
    given), `rollout` (group_size, redundancy, lockstep, env_concurrency, the infra failure
    budget; batch size, α and the staleness rule are the buffer's and the trainer's) and `agent`.
    The rest is what a training run never changes: `redundancy_mode` (module docstring),
    `max_infra_retries` per slot, `jsonl_path` for the trajectory log, `env_factory(env_id, **kwargs)`
    instead of the registry.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        *,
        env: EnvConfig | None = None,
        rollout: RolloutConfig | None = None,
        agent: AgentConfig | None = None,
        buffer: GroupBuffer | None = None,
        seeds: Iterator[int] | None = None,
        env_factory: Callable[..., Any] | None = None,
        jsonl_path: str | None = None,
        redundancy_mode: Literal["carry", "cancel"] = "carry",
        max_infra_retries: int = 2,
    ) -> None:
        self.env = env = env or EnvConfig()
        self.rollout = rollout = rollout or RolloutConfig()
        self.agent = agent = agent or AgentConfig()
        for section in (env, rollout, agent):
            section.validate()
        if redundancy_mode not in ("carry", "cancel"):
            raise ValueError(f"redundancy_mode must be 'carry' or 'cancel', got {redundancy_mode!r}")
        if max_infra_retries < 0:
            raise ValueError(f"max_infra_retries must be >= 0, got {max_infra_retries}")
        self.redundancy_mode = redundancy_mode
        self.max_infra_retries = max_infra_retries
        self.engine = engine
        self.tokenizer = tokenizer
        self.buffer = buffer
        self.metrics = ManagerMetrics()
        self._seeds = seeds if seeds is not None else itertools.count(env.train_seed_offset)
        self._env_factory = env_factory
        self._segments = ChatSegments(tokenizer)
        self._trajectory_limit = asyncio.Semaphore(env.max_concurrent)
        self._env_limits = {env_id: asyncio.Semaphore(n) for env_id, n in (rollout.env_concurrency or {}).items()}
        self._writer = TrajectoryWriter(jsonl_path) if jsonl_path else None
        self._update_lock = asyncio.Lock()
        self._group_counter = itertools.count()
        self.open_envs = 0  # live env objects (tests check it returns to 0)
        self._tasks: set[asyncio.Task] = set()
        self._infra_window = InfraFailureWindow(rollout.infra_failure_window, rollout.max_infra_failure_rate)
        self._last_infra_error: str | None = None
        #: set once the failure budget is spent; `collect_batch` and `run` raise it, a trainer polls it
        self.failure: RolloutFailureError | None = None
        self._failed = asyncio.Event()
        self._carried: set[asyncio.Task] = set()  # collect_batch's surplus groups (carry mode)
        self._group_order: dict[asyncio.Task, int] = {}
        self._group_order_counter = itertools.count()

    # --- public API ------------------------------------------------------------------

    @property
    def live_tasks(self) -> int:
        return sum(1 for t in self._tasks if not t.done())

    async def collect_batch(self, num_groups: int) -> list[Group]:
        """Sync use: keep `num_groups` (+ rollout.redundant_groups) groups running and return the first G done.

        With `redundancy_mode="carry"` the surplus runs on into the next call (groups carried
        from the previous call are the oldest, so they tend to finish first); with `cancel`
        it is cancelled. Raises RolloutFailureError once the infra failure budget is spent
        (see module docstring)."""
        self._raise_if_failed()
        if self.rollout.lockstep:
            return await self._collect_lockstep(num_groups)
        carry = self.redundancy_mode == "carry"
        pending, self._carried = self._carried, set()
        kept: list[Group] = []
        failed = asyncio.ensure_future(self._failed.wait())
        completed = False
        try:
            for task in sorted((t for t in pending if t.done()), key=self._spawn_order):
                pending.discard(task)  # finished after the last batch was complete: first in line
                self._keep_group(task, kept, num_groups, pending if carry else None)
            for _ in range(max(0, num_groups + self.rollout.redundant_groups - len(pending) - len(kept))):
                pending.add(self._spawn_group())
            while len(kept) < num_groups:
                if not pending:
                    pending.add(self._spawn_group())  # replace infra-dropped groups (budget-bounded)
                done, pending = await asyncio.wait(pending | {failed}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(failed)
                for task in sorted(done - {failed}, key=self._spawn_order):
                    self._keep_group(task, kept, num_groups, pending if carry else None)
                self._raise_if_failed()
            completed = True
        finally:
            failed.cancel()
            if pending and carry and completed:
                self._carried = pending
                self.metrics.groups_carried += len(pending)
            elif pending:
                if self.failure is None:
                    self.metrics.groups_redundant_cancelled += len(pending)
                for task in pending:
                    self._group_order.pop(task, None)
                await self._cancel(pending)
        return kept

    async def run(self, stop_event: asyncio.Event) -> None:
        """Async use: keep the buffer full (admission bounded by α) until stop_event is set."""
        if self.buffer is None:
            raise ValueError("run() needs a GroupBuffer (EnvManager(..., buffer=GroupBuffer(B, alpha)))")
        if self.rollout.lockstep:
            raise ValueError("lockstep is the sync baseline; use collect_batch()")
        await fill_buffer(self, self.buffer, stop_event, self._failed.wait(), self._run_group_into)

    async def update_weights(self, source: Any, version: int) -> None:
        """pause (in-flight requests abort) -> load weights -> resume (runners resubmit)."""
        async with self._update_lock:
            self.metrics.weight_updates.append(await timed_weight_update(self.engine, source, version))

    def summary(self) -> dict[str, Any]:
        data = self.metrics.summary()
        data["infra_failure_window_rate"] = self._infra_window.rate
        if self.buffer is not None:
            data.update(self.buffer.metrics())
        stats = getattr(self.engine, "stats", None)
        if stats is not None:
            data["engine/mean_batch_size"] = getattr(stats, "mean_batch_size", 0.0)
            data["engine/requests_aborted"] = getattr(stats, "requests_aborted", 0)
            finished = getattr(stats, "requests_finished", 0)
            if finished and hasattr(stats, "shared_prompts"):  # prompts answered without a forward of their own
                data["engine/shared_prompt_fraction"] = stats.shared_prompts / finished
        return data

    async def close(self) -> None:
        self._carried, self._group_order = set(), {}
        await self._cancel({t for t in self._tasks if not t.done()})
        if self._writer is not None:
            self._writer.close()

    # --- groups ----------------------------------------------------------------------

    async def _run_group_into(self, ticket: Ticket) -> None:
        try:
            group = await self._run_group()
        except _GroupFailed:
            self.buffer.release(ticket)
            return
        except BaseException:
            self.buffer.release(ticket)
            raise
        self._record_group(group)
        ticket.put(group)

    async def _run_group(self) -> Group:
        """N trajectories of one (env id, seed); N+r started, first N good ones kept."""
        env_id, seed = self.env.id, next(self._seeds)
        group_id = f"g{next(self._group_counter)}-{uuid.uuid4().hex[:6]}"
        n = self.rollout.group_size
        retries_left = self.max_infra_retries * n
        index = itertools.count()
        pending = {
            self._spawn(self._run_trajectory(env_id, seed, f"{group_id}-{next(index)}", group_id))
            for _ in range(n + self.rollout.redundant_trajectories)
        }
        kept: list[Trajectory] = []
        try:
            while len(kept) < n:
                if not pending:
                    raise _GroupFailed(group_id)
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    trajectory = task.result()
                    self._note_finished(trajectory)
                    if trajectory.status == TrajectoryStatus.INFRA_FAILED:
                        if retries_left > 0 and len(kept) + len(pending) < n and self.failure is None:
                            retries_left -= 1
                            self.metrics.infra_retries += 1
                            pending.add(
                                self._spawn(self._run_trajectory(env_id, seed, f"{group_id}-{next(index)}", group_id))
                            )
                        continue
                    if len(kept) < n:
                        kept.append(trajectory)
                    else:
                        self._count_cancelled(trajectory)
                if self.failure is not None:
                    raise _GroupFailed(group_id)  # the whole rollout stops: no point finishing this group
        except _GroupFailed:
            self.metrics.groups_dropped_infra += 1
            for trajectory in kept:
                self.metrics.wasted_tokens += trajectory.num_response_tokens
            raise
        finally:
            if pending:
                await self._cancel(pending)  # stragglers: each counts itself via _run_trajectory
        return Group(group_id=group_id, env_id=env_id, seed=seed, trajectories=kept)

    async def _run_trajectory(self, env_id: str, seed: int, trajectory_id: str, group_id: str) -> Trajectory:
        limit = self._env_limits.get(env_id)
        async with self._trajectory_limit:
            if limit is not None:
                await limit.acquire()
            runner: EpisodeRunner | None = None
            env = None
            try:
                env = self._make_env(env_id)
                runner = EpisodeRunner(
                    env,
                    self.tokenizer,
                    self.agent,
                    env_id=env_id,
                    seed=seed,
                    trajectory_id=trajectory_id,
                    group_id=group_id,
                    segments=self._segments,
                )
                await runner.reset()
                while (request := runner.next_request()) is not None:
                    prompt, sampling = request
                    generation = await runner.generate(self.engine, prompt, sampling)
                    await runner.step_env(prompt, generation)
                self._record_env_latency(runner.trajectory)
                return runner.trajectory
            except asyncio.CancelledError:
                if runner is not None:
                    runner.cancel()
                    self._count_cancelled(runner.trajectory)
                else:
                    self.metrics.redundant_cancelled += 1
                raise
            except Exception as exc:  # env construction or an unexpected bug in an env
                logger.warning("trajectory %s failed: %r", trajectory_id, exc)
                trajectory = (
                    runner.trajectory
                    if runner is not None
                    else Trajectory(env_id=env_id, seed=seed, trajectory_id=trajectory_id, group_id=group_id)
                )
                trajectory.status = TrajectoryStatus.INFRA_FAILED
                trajectory.infra_error = repr(exc)
                return trajectory
            finally:
                if env is not None:
                    await self._close_env(env)
                if limit is not None:
                    limit.release()

    def _make_env(self, env_id: str) -> Any:
        if self._env_factory is not None:
            env = self._env_factory(env_id, **self.env.kwargs)
        else:
            from rollhub.envs.registry import make

            env = make(env_id, **self.env.kwargs)
        self.open_envs += 1
        return env

    async def _close_env(self, env: Any) -> None:
        try:
            await asyncio.shield(env.close())
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            logger.warning("env close failed: %r", exc)
        finally:
            self.open_envs -= 1

    # --- lockstep baseline -----------------------------------------------------------

    async def _collect_lockstep(self, num_groups: int) -> list[Group]:
        """All envs of the batch step together: one batched generation per turn."""
        n = self.rollout.group_size
        plan = [
            (self.env.id, next(self._seeds), f"g{next(self._group_counter)}-{uuid.uuid4().hex[:6]}")
            for _ in range(num_groups)
        ]
        envs = []
        runners: list[EpisodeRunner] = []
        try:
            for env_id, seed, group_id in plan:
                for i in range(n):
                    env = self._make_env(env_id)
                    envs.append(env)
                    runners.append(
                        EpisodeRunner(
                            env,
                            self.tokenizer,
                            self.agent,
                            env_id=env_id,
                            seed=seed,
                            trajectory_id=f"{group_id}-{i}",
                            group_id=group_id,
                            segments=self._segments,
                        )
                    )
            await asyncio.gather(*(r.reset() for r in runners))
            while True:
                requests = [(r, req) for r in runners if (req := r.next_request()) is not None]
                if not requests:
                    break
                generations = await asyncio.gather(*(self._generate_or_fail(r, p, s) for r, (p, s) in requests))
                await asyncio.gather(
                    *(r.step_env(p, g) for (r, (p, _)), g in zip(requests, generations) if g is not None)
                )
        except asyncio.CancelledError:
            for runner in runners:
                runner.cancel()
            raise
        finally:
            await asyncio.gather(*(self._close_env(env) for env in envs))
        groups = []
        for k, (env_id, seed, group_id) in enumerate(plan):
            trajectories = [r.trajectory for r in runners[k * n : (k + 1) * n]]
            for trajectory in trajectories:
                self._record_env_latency(trajectory)
                self._note_finished(trajectory)
            group = Group(group_id=group_id, env_id=env_id, seed=seed, trajectories=trajectories)
            self._record_group(group)
            groups.append(group)
        self._raise_if_failed()
        return groups

    async def _generate_or_fail(self, runner: EpisodeRunner, prompt: list[int], sampling: Any) -> Any:
        """One lockstep generation; an engine error ends only that runner's episode, as infra."""
        try:
            return await runner.generate(self.engine, prompt, sampling)
        except Exception as exc:  # connection or server error of the engine: not the model's doing
            runner.fail_infra(f"generate: {exc!r}")
            return None

    # --- accounting ------------------------------------------------------------------

    def _keep_group(
        self, task: asyncio.Task, kept: list[Group], wanted: int, carry: set[asyncio.Task] | None = None
    ) -> None:
        """collect_batch: keep a finished group while fewer than `wanted` are kept; a surplus one
        goes into `carry` (kept for the next batch) or, without it, is counted as cancelled work."""
        if len(kept) >= wanted and carry is not None:
            carry.add(task)  # finished in the same tick as the last needed one: next batch's first
            return
        self._group_order.pop(task, None)
        try:
            group = task.result()
        except _GroupFailed:
            return
        if len(kept) < wanted:
            kept.append(group)
            self._record_group(group)
        else:  # finished in the same tick as the last needed one: surplus
            self._count_cancelled_group(group)

    def _spawn_order(self, task: asyncio.Task) -> int:
        return self._group_order.get(task, 0)

    def _spawn_group(self) -> asyncio.Task:
        """A collect_batch group; its start order breaks ties between groups that finish in one tick."""
        task = self._spawn(self._run_group())
        self._group_order[task] = next(self._group_order_counter)
        return task

    def _note_finished(self, trajectory: Trajectory) -> None:
        """Feed the infra failure budget with one finished trajectory; spend it -> `failure`."""
        infra_failed = trajectory.status == TrajectoryStatus.INFRA_FAILED
        self._infra_window.add(infra_failed)
        if infra_failed:
            self.metrics.infra_failures += 1
            self._last_infra_error = trajectory.infra_error
            if not self.rollout.lockstep:  # lockstep keeps the member (unscored) in its group
                self.metrics.wasted_tokens += trajectory.num_response_tokens
        if self.failure is None and self._infra_window.exceeded():
            self.failure = RolloutFailureError(self._budget_message())
            logger.error("%s", self.failure)
            self._failed.set()

    def _budget_message(self) -> str:
        """The cause, the counts and what to check (shown to the user as one line)."""
        window, env_id = self._infra_window, self.env.id
        return (
            f"rollout stopped: {window.failures} of the last {window.size} trajectories failed for infrastructure "
            f"reasons (limit rollout.max_infra_failure_rate={self.rollout.max_infra_failure_rate:g}; "
            f"{self.metrics.infra_failures} infra failures, {self.metrics.infra_retries} retries, "
            f"{self.metrics.groups_dropped_infra} groups dropped in all); last error: {self._last_infra_error}. "
            f"Check that {env_id} starts on its own ('rollhub envs try {env_id}'), its sandbox or "
            "worker backend (docker running, images present) and the inference engine; raise "
            "rollout.max_infra_failure_rate only if such failures are expected"
        )

    def _raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _record_group(self, group: Group) -> None:
        self.metrics.groups_done += 1
        for trajectory in group.trajectories:
            self.metrics.trajectories_kept += 1
            self.metrics.generated_tokens += trajectory.num_response_tokens
            self.metrics.status_counts[trajectory.status.value] += 1
            if trajectory.model_failure is not None:
                self.metrics.model_failures[trajectory.model_failure] += 1
        if self._writer is not None:
            self._writer.write_group(group)

    def _record_env_latency(self, trajectory: Trajectory) -> None:
        for turn in trajectory.turns:
            if "env_step" in turn.timings_s:
                self.metrics.env_step_latency_s[trajectory.env_id].append(turn.timings_s["env_step"])

    def _count_cancelled(self, trajectory: Trajectory) -> None:
        self.metrics.redundant_cancelled += 1
        self.metrics.wasted_tokens += trajectory.num_response_tokens

    def _count_cancelled_group(self, group: Group) -> None:
        self.metrics.groups_redundant_cancelled += 1
        for trajectory in group.trajectories:
            self.metrics.wasted_tokens += trajectory.num_response_tokens
