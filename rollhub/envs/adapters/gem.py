"""GEM envs (`gem-llm`) as rollhub envs: `make("gem:game:Sokoban-v0-easy")`.

GEM's API is gymnasium's with text: `reset(seed) -> (obs, info)` and
`step(text) -> (obs, reward, terminated, truncated, info)`, the env parsing its own
`\\boxed{...}` answer out of the model's text. What the adapter changes, and why:

* GEM seeds Python's and NumPy's global generators in `reset` and some games draw from them
  in `step`, so calls run one at a time under a process-wide lock (in a worker thread, so the
  event loop keeps stepping other envs). Episodes stay reproducible per seed when envs
  interleave only for games that draw their randomness in `reset` (Sokoban, the math envs).
* A reply without `\\boxed{` never reaches GEM (GEM would end the episode on it): the state
  stays, the reply says how to answer, `format_ok` is False and the reward is 0, as for every
  rollhub env. A boxed but unknown move goes to GEM, whose rules apply.
* GEM reports terminated and truncated together when its turn limit ends a game (with a
  soft terminal reward) and on single-turn answers: the task ended, so the adapter reports
  `terminated` only. The adapter also truncates at `max_steps` (the game's `max_turns`, 1 for
  single-turn envs).
* `success` = the episode terminated with GEM's success reward (1.0).
* GEM math grades in a process pool: keep its `use_mp=True` (its in-thread grader uses signals,
  which only work on the main thread, and the adapter steps in a worker thread).
* Anchor: a digest of GEM's `suffix` (the board, for games that show one), else of the
  observation text (common.state_anchor).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
from typing import Any

from rollhub.envs.adapters.common import digest, require, user_message
from rollhub.envs.base import Env, Observation, StepResult, invalid_step_info

logger = logging.getLogger(__name__)

#: GEM's global seeding makes its envs share state: one call at a time in the process
_GEM_LOCK = threading.Lock()
BOXED = r"\\boxed\{"
SUCCESS_REWARD = 1.0


def _locked(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with _GEM_LOCK:
        return fn(*args, **kwargs)


class GemEnv(Env):
    """One GEM env behind the rollhub contract (see the module docstring for the mapping)."""

    action_tag = ""  # GEM parses its own \boxed{} answers out of the whole reply

    def __init__(
        self,
        gem_id: str,
        *,
        max_steps: int | None = None,
        format_pattern: str | None = BOXED,
        system_prompt: str | None = None,
        **gem_kwargs: Any,
    ):
        gem = require("gem", "gem", f"env gem:{gem_id}")
        if gem_id not in gem.envs.registration.ENV_REGISTRY:
            from rollhub.core.errors import UserError

            raise UserError(f"unknown GEM id '{gem_id}'; python -c 'import gem; gem.print_envs()' lists them")
        self.gem_id = gem_id
        self.gem_env = _locked(gem.make, gem_id, **gem_kwargs)
        turns = getattr(self.gem_env, "max_turns", None)
        if max_steps is None:
            max_steps = (
                turns if isinstance(turns, int) and turns > 0 else (1 if not hasattr(self.gem_env, "max_turns") else 50)
            )
        self.max_steps = int(max_steps)
        self.format_pattern = format_pattern
        self.system_prompt = system_prompt
        self._steps = 0
        self._anchor: str | None = None
        self._first_text = ""
        self._closed = False

    def _anchor_of(self, obs: str, info: dict[str, Any]) -> str:
        suffix = info.get("suffix")
        return "s:" + digest(suffix) if isinstance(suffix, str) and suffix else "o:" + digest(obs)

    async def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        self._steps = 0
        obs, info = await asyncio.to_thread(_locked, self.gem_env.reset, seed=seed)
        info = dict(info or {})
        text = str(obs) + (f"\n{info['suffix']}" if isinstance(info.get("suffix"), str) else "")
        self._first_text = text
        self._anchor = self._anchor_of(str(obs), info)
        messages: Observation = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append(user_message(text))
        return messages, {"anchor": self._anchor, "success": False, "source": "gem"}

    async def step(self, action: str) -> StepResult:
        if self._anchor is None:
            raise RuntimeError("step() before reset()")
        self._steps += 1
        cut = self._steps >= self.max_steps
        if self.format_pattern and not re.search(self.format_pattern, action):
            reply = "No answer found: put your answer in \\boxed{}, e.g. \\boxed{up}."
            info = invalid_step_info(self._anchor, "no \\boxed{} answer", format_ok=False)
            return [user_message(reply)], 0.0, False, cut, info
        obs, reward, terminated, truncated, info = await asyncio.to_thread(_locked, self.gem_env.step, action)
        info = dict(info or {})
        terminated = bool(terminated)
        truncated = bool((truncated or cut) and not terminated)
        self._anchor = self._anchor_of(str(obs), info)
        text = str(obs) + (f"\n{info['suffix']}" if isinstance(info.get("suffix"), str) and not terminated else "")
        out = {
            "anchor": self._anchor,
            "success": bool(terminated and float(reward) >= SUCCESS_REWARD),
            "action_valid": True,
            "format_ok": True,
        }
        return [user_message(text)], float(reward), terminated, truncated, out

    def random_action(self, rng: Any) -> str:
        moves = getattr(self.gem_env, "action_space", None)
        if isinstance(moves, list) and moves and all(isinstance(m, str) for m in moves):
            return f"\\boxed{{{moves[int(rng.integers(len(moves)))]}}}"

        def sample() -> str:
            random.seed(int(rng.integers(2**31)))  # GEM samples from the global generator
            return self.gem_env.sample_random_action()

        try:
            return _locked(sample)
        except NotImplementedError:  # reasoning-gym tasks: a number or word of the task, boxed as GEM asks
            words = re.findall(r"-?\d+(?:\.\d+)?|[A-Za-z]+", self._first_text) or ["0"]
            return f"\\boxed{{{words[int(rng.integers(len(words)))]}}}"

    def task_key(self) -> str | None:
        return digest(self._first_text) if self._first_text else None

    def render_text(self) -> str:
        render = getattr(self.gem_env, "_render_board", None)
        return render() if callable(render) else ""

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        pool = getattr(self.gem_env, "mp_pool", None)  # GEM math grades in a process pool
        if pool is not None:
            pool.terminate()
            return  # GEM's own close() only closes that pool
        close = getattr(self.gem_env, "close", None)
        if callable(close):
            try:
                await asyncio.to_thread(close)
            except Exception:  # a source's close is best effort: the episode is over either way
                logger.warning("GEM env %s: close() failed", self.gem_id, exc_info=True)


def make_gem_env(target: str, **kwargs: Any) -> GemEnv:
    """Registry entry point for `gem:<GEM id>`."""
    return GemEnv(target, **kwargs)
