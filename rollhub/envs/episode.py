"""One episode of an env driven by any player, at the level of chat messages.

`rollhub envs try` (a person, the env's random or expert agent, a model) and `rollhub eval ENV`
(a model, many seeds) play through this loop, so both treat a failing env the same way: an
exception from `reset` or `step` becomes a one-line `UserError` naming the env, the call and
the exception, never a traceback (the env's own bug is then the first thing the user reads).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollhub.core.errors import UserError
from rollhub.envs.base import Message, Observation

#: a player: (env, the conversation so far) -> the next action text, or None to stop
Player = Callable[[Any, Observation], Awaitable[str | None]]


@dataclass
class EpisodeOutcome:
    env_id: str
    seed: int
    steps: int = 0
    total_reward: float = 0.0
    success: bool = False
    finished: bool = False  # the env terminated or truncated the episode (not the player, not --max-steps)
    conversation: list[Message] = field(default_factory=list)


def _failure(env_id: str, what: str, exc: BaseException) -> UserError:
    detail = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {detail[0]}" if detail else type(exc).__name__
    return UserError(f"env {env_id} {what} raised {text}")


async def play_episode(
    env: Any,
    player: Player,
    *,
    env_id: str,
    seed: int,
    max_steps: int | None = None,
    show: Callable[[str, Any], None] | None = None,
) -> EpisodeOutcome:
    """Play one episode of `env` (not closed here) with `player`.

    `show(kind, value)` sees the episode as it happens: ("messages", the env's messages),
    ("action", text), ("step", (reward, return, terminated, truncated))."""
    outcome = EpisodeOutcome(env_id=env_id, seed=seed)
    try:
        observation, _ = await env.reset(seed=seed)
    except UserError:
        raise
    except Exception as exc:  # any env bug: one line naming the env and the exception
        raise _failure(env_id, f"could not start an episode: reset(seed={seed})", exc) from None
    outcome.conversation.extend(observation)
    if show:
        show("messages", observation)
    limit = max_steps or int(env.max_steps)
    for _ in range(limit):
        action = await player(env, outcome.conversation)
        if action is None:
            break
        if show:
            show("action", action)
        try:
            observation, reward, terminated, truncated, info = await env.step(action)
        except UserError:
            raise
        except Exception as exc:
            raise _failure(env_id, f"failed a step: step({action[:60]!r})", exc) from None
        outcome.steps += 1
        outcome.total_reward += float(reward)
        outcome.conversation.append({"role": "assistant", "content": action})
        outcome.conversation.extend(observation)
        if show:
            show("messages", observation)
            show("step", (float(reward), outcome.total_reward, terminated, truncated))
        if terminated or truncated:
            outcome.success = bool(info.get("success", False))
            outcome.finished = True
            break
    return outcome
