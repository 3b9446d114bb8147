"""Shared helpers of the rollout tests (a uniquely named module: several test folders
have a conftest.py, so `from conftest import ...` would resolve to whichever loaded first)."""

from __future__ import annotations

import asyncio

from rollhub.envs.base import Env, extract_action
from rollhub.inference.engines.base import InferenceEngine


class CountdownEnv(Env):
    """A tiny multi-turn test env: say a number; the episode ends after `max_steps` steps.

    Deterministic, instant, and it exercises every contract path: format errors (no tag),
    invalid actions (not a number), infra failures (when `fail_on_step` is set) and an
    optional per-step sleep to give envs different latencies.
    """

    action_tag = "action"
    live = 0  # instances not yet closed (leak checks)

    def __init__(
        self, max_steps: int = 3, step_sleep_s: float = 0.0, fail_on_step: int | None = None, fail_reset: bool = False
    ) -> None:
        self.max_steps = max_steps
        self.step_sleep_s = step_sleep_s
        self.fail_on_step = fail_on_step
        self.fail_reset = fail_reset
        self.steps = 0
        self.closed = False
        CountdownEnv.live += 1

    async def reset(self, *, seed=None, options=None):
        if self.fail_reset:
            return [], {"infra_failure": "reset failed on purpose", "anchor": None}
        self.seed = seed
        self.steps = 0
        return [
            {"role": "system", "content": "Count down. Answer with <action>N</action>."},
            {"role": "user", "content": f"Start at {10 + (seed or 0)}."},
        ], {"anchor": (seed, 0), "success": False}

    async def step(self, action: str):
        if self.step_sleep_s:
            await asyncio.sleep(self.step_sleep_s)
        self.steps += 1
        if self.fail_on_step is not None and self.steps == self.fail_on_step:
            return [], 0.0, False, False, {"infra_failure": "worker crashed on purpose", "anchor": None}
        parsed = extract_action(action, self.action_tag)
        format_ok = parsed is not None
        valid = format_ok and parsed.lstrip("-").isdigit()
        info = {"anchor": (self.seed, self.steps), "success": False, "action_valid": valid, "format_ok": format_ok}
        reply = [{"role": "user", "content": f"Step {self.steps}: {'ok' if valid else 'say a number'}."}]
        truncated = self.steps >= self.max_steps
        return reply, (0.1 if valid else -0.1), False, truncated, info

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            CountdownEnv.live -= 1


class RecordingEngine(InferenceEngine):
    """Passes every request to the real engine and records the prompt ids and the returned ids."""

    def __init__(self, inner: InferenceEngine) -> None:
        self.inner = inner
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []

    async def generate(self, input_ids, sampling, request_id=None):
        self.prompts.append(list(input_ids))
        generation = await self.inner.generate(input_ids, sampling, request_id)
        self.outputs.append(list(generation.token_ids))
        return generation

    async def update_weights(self, source, version):
        await self.inner.update_weights(source, version)

    async def pause(self):
        await self.inner.pause()

    async def resume(self):
        await self.inner.resume()

    async def abort(self, request_id):
        await self.inner.abort(request_id)


def sections(env_id: str, *, env_kwargs: dict | None = None, agent=None, max_concurrent: int = 256, **rollout) -> dict:
    """The run sections an EnvManager takes, from a few knobs by their run names (`rollout` keys:
    group_size, redundant_groups, lockstep, ...; async_ratio 0 unless given, as lockstep needs)."""
    from rollhub.rollout.agent import AgentConfig
    from rollhub.rollout.config import EnvConfig, RolloutConfig

    rollout.setdefault("async_ratio", 0.0)
    return {
        "env": EnvConfig(id=env_id, kwargs=dict(env_kwargs or {}), max_concurrent=max_concurrent),
        "rollout": RolloutConfig(**rollout),
        "agent": agent if agent is not None else AgentConfig(),
    }
