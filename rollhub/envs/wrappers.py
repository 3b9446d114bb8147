"""Wrappers: an env around another that changes what it plays and leaves the env itself alone.

A lever that only makes training easier (a difficulty floor, a curriculum) is a wrapper
marked `training_only`, as gymnasium keeps time limits and reward shaping out of its envs.
The env's own distribution is then simply the unwrapped env: a run refuses an evaluation env
wrapped by a training-only wrapper (`rollhub.envs.run_checks`). An env id registers its
wrappers by the env kwarg that switches each on, and `make` applies them
(rollhub.envs.registry), so a recipe writes `env.kwargs: {min_solution_steps: 5}` for
training and leaves it out (or at 0) for evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rollhub.envs.base import Env, Observation, StepResult


class EnvWrapper(Env):
    """Every member of the contract forwards to the wrapped env unless a subclass changes it.

    Other public attributes forward too (`env.board` of a wrapped Sokoban env), so code that
    reads an env's own state keeps working whatever wraps it."""

    #: True: the wrapper only makes training easier, and an evaluation env must not have it
    training_only: ClassVar[bool] = False
    #: set by `make()`: the env kwarg that put this wrapper on (the one a user switches off)
    setting: str | None = None

    def __init__(self, env: Env):
        self.env = env
        self.spec = env.spec

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped

    @property
    def action_tag(self) -> str:  # type: ignore[override]
        return self.env.action_tag

    @property
    def tools(self) -> list[dict[str, Any]] | None:  # type: ignore[override]
        return self.env.tools

    @property
    def max_steps(self) -> int:  # type: ignore[override]
        return self.env.max_steps

    @property
    def chat_template_tools(self) -> bool:  # type: ignore[override]
        return self.env.chat_template_tools

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        return await self.env.reset(seed=seed, options=options)

    async def step(self, action: str) -> StepResult:
        return await self.env.step(action)

    async def close(self) -> None:
        await self.env.close()

    def expert_action(self) -> str:
        return self.env.expert_action()

    def random_action(self, rng: Any) -> str:
        return self.env.random_action(rng)

    def render_text(self) -> str:
        return self.env.render_text()

    def task_set(self) -> dict[str, str] | None:
        return self.env.task_set()

    def could_draw(self, keys: set[str]) -> set[str] | None:
        return self.env.could_draw(keys)

    def task_key(self) -> str | None:
        return self.env.task_key()


def wrappers_of(env: Env) -> list[EnvWrapper]:
    """The wrappers around `env`, outermost first ([] for an unwrapped env)."""
    found = []
    while isinstance(env, EnvWrapper):
        found.append(env)
        env = env.env
    return found


class DifficultyFloor(EnvWrapper):
    """Training only: every episode's task is at least `minimum` hard by the env's own `measure`.

    From a strong policy most easy tasks are solved by every sample of a group, which leaves
    group-relative advantages (GRPO, GiGPO) no signal. A reset that draws an easier task draws
    again with an unseeded reset, which continues the generator the seeded reset started (the
    contract's determinism rule), so a seed still gives one task. A reset with options (a task
    the caller chose, such as a hand-made board) is played as it is.
    """

    training_only = True

    def __init__(
        self,
        env: Env,
        minimum: float,
        measure: Callable[[Env], float],
        *,
        name: str = "difficulty",
        tries: int = 1000,
        hint: str = "",
    ):
        if tries < 1:
            raise ValueError(f"tries must be >= 1, got {tries}")
        super().__init__(env)
        self.minimum = minimum
        self.measure = measure
        self.name = name
        self.tries = tries
        self.hint = hint

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        observation, info = await self.env.reset(seed=seed, options=options)
        if options:
            return observation, info
        for _ in range(self.tries - 1):
            if self.measure(self.env) >= self.minimum:
                return observation, info
            observation, info = await self.env.reset()
        if self.measure(self.env) >= self.minimum:
            return observation, info
        hint = f"; {self.hint}" if self.hint else ""
        raise ValueError(f"no task of the {self.tries} drawn needs {self.name}={self.minimum}{hint}")
