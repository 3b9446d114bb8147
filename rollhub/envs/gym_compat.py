"""Interop with gymnasium's own registry: `gymnasium.make("rollhub/Sokoban-v0")` works.

Our envs are async; gymnasium's are sync. `SyncEnvAdapter` drives one async env on a private
event loop so plain gymnasium code (and its wrappers) can use it; `GymnasiumTextEnv` goes the
other way and runs any sync `gymnasium.Env` with text spaces off the event loop.

The adapter declares spaces its values really lie in, so gymnasium's own
`gymnasium.utils.env_checker.check_env` passes: observations are lists of chat messages
(`ChatMessages`), actions any string (`AnyText`). gymnasium's `Text` space would not do: it
holds only strings over a fixed charset (alphanumerics by default), and model text is any
unicode.

gymnasium 1.x finds envs only in its registry (it dropped the plugin entry points of 0.2x), so
the ids exist there once `rollhub.envs` is imported; gymnasium's own `module:id` form does that
import: `gymnasium.make("rollhub.envs:rollhub/Sokoban-v0")`.
"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Callable
from typing import Any

import gymnasium

from rollhub.envs.base import Env, Observation, StepResult, extract_action, wrap_action

# no '<' or '>': a sample wrapped in the env's action tag must parse as that tag
_SAMPLE_CHARACTERS = string.ascii_letters + string.digits + " .,;:!?+-*/=()[]{}'\"\n"


def _sample_text(rng: Any, max_length: int) -> str:
    length = int(rng.integers(0, min(max_length, 64) + 1))
    return "".join(_SAMPLE_CHARACTERS[i] for i in rng.integers(0, len(_SAMPLE_CHARACTERS), size=length))


class AnyText(gymnasium.spaces.Space[str]):
    """Any string of at most `max_length` characters: the model's text, whatever its alphabet.

    Samples are short printable strings inside the env's action tag (`<answer>x7 q</answer>`), so
    a sampled action reaches the env's own checks instead of stopping at the format: checkers
    and smoke tests then exercise a real step, not only the missing-tag reply."""

    def __init__(self, max_length: int = 1 << 16, action_tag: str = "", seed: int | None = None):
        self.max_length = max_length
        self.action_tag = action_tag
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        room = self.max_length - (2 * len(self.action_tag) + 5 if self.action_tag else 0)
        return wrap_action(_sample_text(self.np_random, max(room, 0)), self.action_tag)

    def __repr__(self) -> str:
        return f"AnyText(max_length={self.max_length}, action_tag={self.action_tag!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyText) and (other.max_length, other.action_tag) == (
            self.max_length,
            self.action_tag,
        )


class ChatMessages(gymnasium.spaces.Space[list]):
    """Lists of chat messages (`{"role": str, "content": str}`) of at most `max_length` characters of
    content in all: what a rollhub env's `reset` and `step` return."""

    def __init__(self, max_length: int = 1 << 20, seed: int | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, list):
            return False
        for message in x:
            if not isinstance(message, dict):
                return False
            if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                return False
        return sum(len(message["content"]) for message in x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> list:
        return [{"role": "user", "content": _sample_text(self.np_random, self.max_length)}]

    def __repr__(self) -> str:
        return f"ChatMessages(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatMessages) and other.max_length == self.max_length


class SyncEnvAdapter(gymnasium.Env):
    """A rollhub env seen as a synchronous gymnasium env (chat-message observations, text actions)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, env: Env, render_mode: str | None = None):
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.env = env
        self.render_mode = render_mode
        self._loop = asyncio.new_event_loop()
        self.observation_space = ChatMessages()
        self.action_space = AnyText(action_tag=env.action_tag)

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

    def build(render_mode: str | None = None, **kwargs: object) -> SyncEnvAdapter:
        return SyncEnvAdapter(make(env_id, **kwargs), render_mode=render_mode)

    if env_id in gymnasium.registry:
        del gymnasium.registry[env_id]
    gymnasium.register(id=env_id, entry_point=build, disable_env_checker=True)
