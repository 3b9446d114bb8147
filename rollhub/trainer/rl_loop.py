"""The asynchronous RL loop: next batch -> the learner's step (advantages, update) -> version + 1
-> publish the weights -> record -> after-step hooks -> stop check.

It knows no policy, optimizer or config, only a `Learner`: the training job's
(rollhub.trainer.learner) or a simulation's that sleeps, so schedules are measured on this loop.
`buffer is None` is lockstep; otherwise the rollout source's `run` task fills the buffer meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.source import RolloutSource
from rollhub.rollout.types import Group
from rollhub.trainer.worker import release_freed_memory

logger = logging.getLogger(__name__)

#: how often a trainer waiting for a batch checks whether the rollout source gave up
FAILURE_POLL_S = 0.5


class Learner(Protocol):
    async def step(self, groups: list[Group], version: int) -> dict[str, Any]:
        """Learn from one batch with the policy at `version`; returns the step's metrics."""

    async def weights(self) -> Any:
        """The weights to publish after a step (what `RolloutSource.update_weights` loads)."""


@dataclass
class LoopState:
    """What the loop carries from step to step (the job checkpoints it, with fields of its own)."""

    version: int = 0  # policy version = learner steps taken
    idle_s: float = 0.0  # time the trainer waited for batches
    busy_s: float = 0.0
    groups_trained: int = 0


#: called after every step, in order, with the state and the step's record (hooks may add to it)
AfterStep = Callable[[LoopState, dict[str, Any]], Awaitable[None]]


async def rl_loop(
    learner: Learner,
    rollout: RolloutSource,
    buffer: GroupBuffer | None,
    state: LoopState,
    *,
    groups_per_batch: int,
    steps: int,
    after_step: Sequence[AfterStep] = (),
    max_wall_s: float | None = None,
    deadline: float | None = None,
) -> str | None:
    """Steps from `state.version` to `steps`; stops early past `max_wall_s` of its own, or when
    another step as long as the last would end past `deadline` (a `time.perf_counter()` reading).
    Returns why it stopped early (for the progress bar and the log), None when it ran every step."""
    started = step_started = time.perf_counter()
    while state.version < steps:
        wait_started = time.perf_counter()
        groups = await next_batch(rollout, buffer, groups_per_batch, state.version)
        wait_s = time.perf_counter() - wait_started
        compute_started = time.perf_counter()
        metrics = await learner.step(groups, state.version)
        state.version += 1
        state.groups_trained += len(groups)
        await rollout.update_weights(await learner.weights(), state.version)  # pause, load, resume
        release_freed_memory()
        compute_s = time.perf_counter() - compute_started

        state.idle_s += wait_s
        state.busy_s += compute_s
        now = time.perf_counter()
        step_wall, step_started = now - step_started, now
        record = {
            **metrics,
            "time/step_s": step_wall,
            "time/wait_for_batch_s": wait_s,
            "time/train_s": compute_s,
            "time/elapsed_s": now - started,
            "trainer/idle_fraction": wait_s / step_wall if step_wall > 0 else 0.0,
            "trainer/idle_fraction_cumulative": state.idle_s / max(state.idle_s + state.busy_s, 1e-9),
            "policy/version": state.version,
        }
        for hook in after_step:
            await hook(state, record)

        if max_wall_s is not None and now - started > max_wall_s:
            reason = f"train.max_wall_s={max_wall_s} reached after {state.version} of {steps} steps"
            logger.warning("stopping RL: %s", reason)
            return reason
        if deadline is not None and time.perf_counter() + step_wall > deadline:
            reason = (
                f"train.max_job_wall_s: what is left is the final readings' (after {state.version} of {steps} steps)"
            )
            logger.warning("stopping RL: %s", reason)
            return reason
    return None


async def next_batch(rollout: RolloutSource, buffer: GroupBuffer | None, size: int, version: int) -> list[Group]:
    """A lockstep batch generated now, or `buffer.get_batch`, unless the producer stopped first (its
    `failure`, e.g. the infra failure budget spent): then no group will ever come, so raise it."""
    if buffer is None:  # raises RolloutFailureError once the rollout's infra failure budget is spent
        return await rollout.collect_batch(size)
    batch = asyncio.ensure_future(buffer.get_batch(version))  # drops groups more than ceil(alpha) stale
    try:
        while True:
            done, _ = await asyncio.wait({batch}, timeout=FAILURE_POLL_S)
            if done:
                return batch.result()
            if rollout.failure is not None:
                raise rollout.failure
    finally:
        if not batch.done():
            batch.cancel()
            await asyncio.gather(batch, return_exceptions=True)
