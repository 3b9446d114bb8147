"""Interop with gymnasium's own registry: `gymnasium.make("rollhub/Sokoban-v0")` works.

Our envs are async; gymnasium's are sync. `SyncEnvAdapter` drives one async env on a private
event loop so plain gymnasium code (and its wrappers) can use it; `GymnasiumTextEnv` goes the
other way and runs any sync `gymnasium.Env` with text spaces off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import gymnasium

from rollhub.envs.base import Env, Observation, StepResult, extract_action


class SyncEnvAdapter(gymnasium.Env):
    """A rollhub env seen as a synchronous gymnasium env (text spaces)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, env: Env):
        self.env = env
        self._loop = asyncio.new_event_loop()
        self.observation_space = gymnasium.spaces.Text(max_length=1 << 20)
        self.action_space = gymnasium.spaces.Text(max_length=1 << 16)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        super().reset(seed=seed)
        return self._loop.run_until_complete(self.env.reset(seed=seed, options=options))

    def step(self, action: str) -> StepResult:
        return self._loop.run_until_complete(self.env.step(action))

    def render(self) -> str:
        return self.env.render_text()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self.env.close())
            self._loop.close()


class GymnasiumTextEnv(Env):
    """Wrap a sync gymnasium env whose observations and actions are strings.

    Calls run in a worker thread (`asyncio.to_thread`) so a slow env never blocks the loop.
    Envs that are not thread-safe must instead run in a worker process.
    """

    def __init__(
        self,
        gym_env: gymnasium.Env,
        *,
        max_steps: int = 50,
        action_tag: str = "action",
        system_prompt: str | None = None,
    ):
        self.gym_env = gym_env
        self.max_steps = max_steps
        self.action_tag = action_tag
        self.system_prompt = system_prompt
        self._steps = 0

    async def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        self._steps = 0
        obs, info = await asyncio.to_thread(self.gym_env.reset, seed=seed, options=options)
        messages: Observation = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": str(obs)})
        info = dict(info)
        info.setdefault("anchor", str(obs))
        info.setdefault("success", False)
        return messages, info

    async def step(self, action: str) -> StepResult:
        self._steps += 1
        parsed = extract_action(action, self.action_tag)
        obs, reward, terminated, truncated, info = await asyncio.to_thread(
            self.gym_env.step, parsed if parsed is not None else action
        )
        info = dict(info)
        info.setdefault("anchor", str(obs))
        info.setdefault("success", bool(terminated and reward > 0))
        info.setdefault("action_valid", True)
        info.setdefault("format_ok", parsed is not None)
        truncated = bool(truncated or (self._steps >= self.max_steps and not terminated))
        return [{"role": "user", "content": str(obs)}], float(reward), bool(terminated), truncated, info

    async def close(self) -> None:
        await asyncio.to_thread(self.gym_env.close)


def register_in_gymnasium(env_id: str, make: Callable[..., Env]) -> None:
    """Make `gymnasium.make(env_id, **kwargs)` build `make(env_id, **kwargs)` behind a `SyncEnvAdapter`.

    The registry passes its own `make`, so this module needs nothing from the registry."""

    def build(**kwargs: object) -> SyncEnvAdapter:
        return SyncEnvAdapter(make(env_id, **kwargs))

    if env_id in gymnasium.registry:
        del gymnasium.registry[env_id]
    gymnasium.register(id=env_id, entry_point=build, disable_env_checker=True)
