"""BENCHMARK-ONLY simulated envs: no task, only step latencies drawn from a distribution.

ROLL Flash's synthetic experiment gives each env step a latency from N(mu, sigma) and shows
that the gain of env-level asynchrony grows with sigma. These envs reproduce that workload
under the real Env contract, so the real env manager schedules them:

* `bench/LatencySokoban-v0`: short episodes (a few turns), step latency N(10 s, sigma),
  cheap reset; the Sokoban-like shape.
* `bench/LatencySWE-v0`: long episodes, slower steps and a container-start cost at reset;
  the SWE-like shape.

Latencies are in simulated seconds times `time_scale` (use 1 on the virtual-clock loop).
A share `fail_slow_prob` of steps can be made `fail_slow_factor` times slower, the
fail-slow envs ROLL Flash's redundancy sweep implies. Latencies come from a generator that
is independent of the task seed: the members of a group share a task, not a timing.
Registered with a "[benchmark simulation]" description so nobody mistakes them for tasks.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollhub.envs.base import Env, Observation, StepResult, extract_action, invalid_step_info

_instance_counter = itertools.count()


@dataclass(frozen=True)
class LatencyDistribution:
    """Normal(mean_s, std_s) truncated below at min_s, with an optional fail-slow tail."""

    mean_s: float = 10.0
    std_s: float = 5.0
    min_s: float = 0.1
    fail_slow_prob: float = 0.0
    fail_slow_factor: float = 10.0

    def __post_init__(self) -> None:
        if self.mean_s < 0 or self.std_s < 0 or self.min_s < 0:
            raise ValueError("latency mean_s, std_s and min_s must be >= 0")
        if not 0 <= self.fail_slow_prob <= 1:
            raise ValueError("fail_slow_prob must be in [0, 1]")

    def sample(self, rng: np.random.Generator) -> float:
        value = max(self.min_s, rng.normal(self.mean_s, self.std_s)) if self.std_s > 0 else max(self.min_s, self.mean_s)
        if self.fail_slow_prob and rng.random() < self.fail_slow_prob:
            value *= self.fail_slow_factor
        return float(value)


class LatencyEnv(Env):
    """An episode of `turns` steps; each step sleeps a drawn latency; success is a coin flip
    with probability `success_prob` at the end (so GRPO groups have reward variance)."""

    action_tag = "action"
    hackability_note = "benchmark simulation: success is a coin flip whatever the action, there is no task"

    def __init__(
        self,
        *,
        turns: int = 5,
        step_mean_s: float = 10.0,
        step_std_s: float = 5.0,
        reset_mean_s: float = 0.0,
        reset_std_s: float = 0.0,
        fail_slow_prob: float = 0.0,
        fail_slow_factor: float = 10.0,
        success_prob: float = 0.5,
        time_scale: float = 1.0,
        latency_seed: int | None = None,
    ):
        if turns < 1:
            raise ValueError("turns must be >= 1")
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.max_steps = turns
        self.step_latency = LatencyDistribution(
            step_mean_s, step_std_s, fail_slow_prob=fail_slow_prob, fail_slow_factor=fail_slow_factor
        )
        self.reset_latency = LatencyDistribution(reset_mean_s, reset_std_s, min_s=0.0)
        self.success_prob = success_prob
        self.time_scale = time_scale
        seed = latency_seed if latency_seed is not None else next(_instance_counter)
        self._latency_rng = np.random.default_rng([seed, 0x1A7E])
        self._task_rng = np.random.default_rng(0)
        self._seed: int | None = None
        self._turn = 0  # valid actions taken: the state the anchor names
        self._steps = 0  # every step, valid or not: the step limit counts these
        self.latencies_s: list[float] = []  # what this env actually slept, for reports
        self.started_at: float | None = None  # loop time of reset / of the final step, for reports
        self.finished_at: float | None = None

    def _anchor(self) -> tuple[Any, int]:
        return (self._seed, self._turn)

    async def _sleep(self, distribution: LatencyDistribution) -> None:
        delay = distribution.sample(self._latency_rng)
        self.latencies_s.append(delay)
        if delay > 0:
            await asyncio.sleep(delay * self.time_scale)

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        self._seed, self._turn, self._steps = seed, 0, 0
        self.started_at, self.finished_at = asyncio.get_running_loop().time(), None
        self._task_rng = np.random.default_rng(seed)
        await self._sleep(self.reset_latency)
        obs: Observation = [
            {"role": "system", "content": "Simulated benchmark env. Answer with <action>anything</action>."},
            {"role": "user", "content": f"Task {seed}, turn 0 of {self.max_steps}."},
        ]
        return obs, {"anchor": self._anchor(), "success": False}

    async def step(self, action: str) -> StepResult:
        """Any `<action>...</action>` is a valid move; text without the tag is rejected
        (state unchanged) but takes as long and counts toward the step limit, so the
        timing of a benchmark does not depend on what the simulated engine wrote."""
        await self._sleep(self.step_latency)
        self._steps += 1
        done = self._steps >= self.max_steps
        if done:
            self.finished_at = asyncio.get_running_loop().time()
        if extract_action(action, self.action_tag) is None:
            info = invalid_step_info(self._anchor(), "no <action>...</action> tag", format_ok=False)
            obs_invalid: Observation = [{"role": "user", "content": "Invalid: answer with <action>anything</action>."}]
            return obs_invalid, 0.0, False, done, info
        self._turn += 1
        success = bool(done and self._task_rng.random() < self.success_prob)
        obs: Observation = [{"role": "user", "content": f"Turn {self._turn} of {self.max_steps}."}]
        info = {"anchor": self._anchor(), "success": success, "action_valid": True, "format_ok": True}
        return obs, float(success), done and success, done and not success, info

    def random_action(self, rng: Any) -> str:
        return "<action>wait</action>"

    def expert_action(self) -> str:
        return "<action>wait</action>"


def sokoban_like(**overrides: Any) -> LatencyEnv:
    """Short episodes, N(10 s, sigma) steps, no reset cost."""
    return LatencyEnv(**{"turns": 5, "step_mean_s": 10.0, "step_std_s": 5.0, **overrides})


def swe_like(**overrides: Any) -> LatencyEnv:
    """Long episodes, slower steps, a container-start cost at reset."""
    defaults = {
        "turns": 20,
        "step_mean_s": 10.0,
        "step_std_s": 5.0,
        "reset_mean_s": 30.0,
        "reset_std_s": 10.0,
        "success_prob": 0.3,
    }
    return LatencyEnv(**{**defaults, **overrides})
