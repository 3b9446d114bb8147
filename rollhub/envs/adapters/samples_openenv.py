"""A small OpenEnv environment, written against `openenv-core`'s own classes, that the adapter
tests, `rollhub envs list` and the performance cards use as the OpenEnv sample.

Countdown: a counter starts at a seeded value and must reach a seeded target; each move adds
or subtracts 1 or 2. It keeps state across steps (so it needs OpenEnv's WebSocket sessions),
declares its moves as an enum (the adapter samples random actions from it), and has no truncation flag of its own.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app

MOVES = ("+1", "-1", "+2", "-2")


class CountdownAction(Action):
    move: Literal["+1", "-1", "+2", "-2"]


class CountdownObservation(Observation):
    text: str = ""


class CountdownState(State):
    value: int = 0
    target: int = 0


class CountdownEnvironment(Environment[CountdownAction, CountdownObservation, CountdownState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = CountdownState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CountdownObservation:
        rng = random.Random(seed)
        value = rng.randint(0, 9)
        target = value + rng.choice([-5, -4, -3, 3, 4, 5])
        self._state = CountdownState(episode_id=episode_id, step_count=0, value=value, target=target)
        return CountdownObservation(text=self._show(f"Reach {target}. Moves: {', '.join(MOVES)}."))

    def step(self, action: CountdownAction, timeout_s: float | None = None, **kwargs: Any) -> CountdownObservation:
        self._state.step_count += 1
        self._state.value += int(action.move)
        done = self._state.value == self._state.target
        return CountdownObservation(text=self._show("Done!" if done else "Moved."), done=done, reward=float(done))

    def _show(self, head: str) -> str:
        return f"{head} Counter: {self._state.value}, target: {self._state.target}."

    @property
    def state(self) -> CountdownState:
        return self._state


def app() -> Any:
    """The FastAPI app that serves Countdown (HTTP and the `/ws` session endpoint)."""
    return create_fastapi_app(CountdownEnvironment, CountdownAction, CountdownObservation, max_concurrent_envs=64)
