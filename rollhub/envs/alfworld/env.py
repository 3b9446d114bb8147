"""`rollhub/ALFWorld-v0`: household tasks in text on the real ALFWorld/TextWorld engine.

The env object lives in the caller's event loop; the game itself runs in a worker process
(see `rollhub.envs.alfworld.pool` and `.worker`), because the engine is not thread-safe.

* Observation: a system message with the rules, then a user message with the task goal, the
  current text and (by default) the admissible commands; each step returns the engine's
  reply and the new admissible commands.
* Action: one command inside `<action>...</action>`, e.g. `<action>go to desk 1</action>`.
  It is lower-cased and whitespace-normalised; a command that is not admissible leaves the
  state unchanged ("Nothing happens."), costs a step and is reported as invalid.
* Episode: reward `reward_won` (1.0) when the task is won (terminated); 50 steps at most
  (truncated). Optional shaping: `invalid_action_reward` for malformed or inadmissible
  actions and `step_reward` on every step; both default to 0 so the return is the success.
* `info["anchor"]`: a key of the engine's PDDL state (location, inventory and a digest of
  all facts), so GiGPO can group identical states even when their text differs or
  different states read the same.
* Game choice: `reset(seed=s)` plays game `s % n` of the sorted game list (so seeds
  0..n-1 are the exact eval set); `options={"game": i_or_name}` picks one directly.
* Splits: `split="valid_unseen"` (the default, the 134 shipped evaluation games) or
  `split="train"` (games made by `rollhub alfworld make-games` in ALFRED's training rooms,
  or ALFWorld's own train split when `ALFWORLD_DATA` holds a download). Train on `train`,
  evaluate on `valid_unseen`: the trainer refuses a run whose two sets share a game.
  `game_dir=` plays any folder of games instead (giving both is refused).
* `action_format="index"`: the admissible commands are listed numbered, one per line, and the
  action is the number of one (`<action>3</action>`). A small model then picks a command
  instead of spelling it: a tiny model trained on text commands garbles object names (most
  of its commands inadmissible), which starves RL of any successful episode.
  The engine still receives the full command; only the agent's interface changes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
from typing import Any

import numpy as np

from rollhub.core.errors import MissingExtraError, UserError
from rollhub.envs.alfworld.games import GameRecord, list_game_dir, list_games
from rollhub.envs.alfworld.pool import EngineCallFailed, SlotHandle, WorkerCrashed, WorkerPool, shared_pool
from rollhub.envs.base import Env, Observation, StepResult, extract_action, invalid_step_info, wrap_action

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an agent in a household, solving a task by typing text commands. Each turn you "
    "see what happened and, when shown, the commands that are admissible now. Reply with "
    "exactly one command inside <action></action>, for example <action>go to desk 1</action>. "
    "Commands: go to R, open R, close R, take O from R, move O to R, clean O with R, "
    "heat O with R, cool O with R, use O, examine X, look, inventory."
)

_WELCOME = re.compile(r"^-= Welcome to TextWorld, ALFRED! =-\s*")
_GOAL = re.compile(r"\s*Your task is to:\s*(.+?)\s*$", re.DOTALL)
EXPERT_PLAN_MODES = ("on_demand", "always", "never")
ACTION_FORMATS = ("text", "index")
_INDEX = re.compile(r"[1-9][0-9]{0,3}")


def normalise_command(text: str) -> str:
    """`  Go to  Desk 1. ` -> `go to desk 1`."""
    return " ".join(text.strip().lower().split()).rstrip(".")


def split_intro(intro: str) -> tuple[str, str]:
    """The engine's opening text -> (goal, room description)."""
    text = _WELCOME.sub("", intro.strip())
    match = _GOAL.search(text)
    if not match:
        return "", text
    return match.group(1), text[: match.start()].strip()


class ALFWorldEnv(Env):
    """One ALFWorld episode at a time, played in a shared worker process."""

    action_tag = "action"

    def __init__(
        self,
        split: str | None = None,
        task_types: list[int | str] | None = None,
        game_dir: str | None = None,
        max_steps: int = 50,
        show_admissible: bool = True,
        reward_won: float = 1.0,
        invalid_action_reward: float = 0.0,
        step_reward: float = 0.0,
        expert_plan: str = "on_demand",
        num_workers: int | None = None,
        hang_timeout_s: float = 120.0,
        system_prompt: str | None = None,
        pool: WorkerPool | None = None,
        action_format: str = "text",
    ):
        for module in ("textworld", "alfworld", "fast_downward"):
            if importlib.util.find_spec(module) is None:
                raise MissingExtraError("alfworld", "env rollhub/ALFWorld-v0")
        if max_steps < 1:
            raise UserError("ALFWorld max_steps must be at least 1")
        if expert_plan not in EXPERT_PLAN_MODES:
            raise UserError(f"ALFWorld expert_plan must be one of {EXPERT_PLAN_MODES}, not '{expert_plan}'")
        if action_format not in ACTION_FORMATS:
            raise UserError(f"ALFWorld action_format must be one of {ACTION_FORMATS}, not '{action_format}'")
        if action_format == "index" and not show_admissible:
            raise UserError("ALFWorld action_format 'index' needs show_admissible: the numbers refer to that list")
        if game_dir and split:  # an eval env inheriting the training game_dir would silently play it
            raise UserError(
                f"ALFWorld takes split ('{split}') or game_dir ('{game_dir}'), not both; set the other to null"
            )
        self.games: list[GameRecord] = (
            list_game_dir(game_dir) if game_dir else list_games(split or "valid_unseen", task_types)
        )
        self.max_steps = max_steps
        self.show_admissible = show_admissible
        self.action_format = action_format
        self.reward_won = reward_won
        self.invalid_action_reward = invalid_action_reward
        self.step_reward = step_reward
        self.expert_plan = expert_plan
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        self._pool = pool
        self._pool_settings = (num_workers, hang_timeout_s)
        self._slot: SlotHandle | None = None
        self._rng = np.random.default_rng()
        self._game: GameRecord | None = None
        self._goal = ""
        self._last_text = ""
        self._admissible: list[str] = []
        self._anchor: str = "unreset"
        self._inventory: list[str] = []
        self._expert_next: str | None = None
        self._expert_used = False
        self._steps = 0
        self._done = True
        self._won = False
        #: why the machinery failed this episode (worker crash or hang), if it did
        self._infra_failure: str | None = None

    # -- plumbing -----------------------------------------------------------------------
    @property
    def pool(self) -> WorkerPool:
        if self._pool is None:
            self._pool = shared_pool(*self._pool_settings)
        return self._pool

    @property
    def game(self) -> GameRecord | None:
        return self._game

    @property
    def slot(self) -> SlotHandle | None:
        return self._slot

    def task_set(self) -> dict[str, str]:
        """The games this env plays, keyed by a hash of each game file's bytes -> its name.

        The trainer compares the training and evaluation envs' sets and refuses a run whose
        sets meet (`rollhub.envs.run_checks.check_eval_disjoint`); hashing the content catches
        a game copied or linked into another folder, not just the same path.
        """
        return {
            "alfworld-game:" + hashlib.sha1(record.path.read_bytes()).hexdigest(): record.name for record in self.games
        }

    def _choose_game(self, seed: int | None, options: dict[str, Any]) -> GameRecord:
        choice = options.get("game")
        if choice is None:
            index = seed % len(self.games) if seed is not None else int(self._rng.integers(len(self.games)))
            return self.games[index]
        if isinstance(choice, int):
            return self.games[choice % len(self.games)]
        for record in self.games:
            if record.name == choice or str(record.path) == str(choice):
                return record
        raise UserError(f"ALFWorld game '{choice}' is not in this env's game list ({len(self.games)} games)")

    async def _release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            await self.pool.release_slot(slot)

    async def _reset_on_worker(self, game: GameRecord, route_key: str) -> dict[str, Any]:
        if self._slot is not None and (self._slot.route_key != route_key):
            await self._release()
        if self._slot is None:
            self._slot = self.pool.open_slot(route_key)
        return await self.pool.call(self._slot, "reset", game_path=str(game.path))

    # -- contract -----------------------------------------------------------------------
    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        options = dict(options or {})
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        game = self._choose_game(seed, options)
        route_key = str(options.get("route_key") or game.name)
        self._game = game
        self._steps = 0
        self._expert_used = False
        self._won = False
        self._infra_failure = None
        reply = None
        failure = ""
        for _attempt in range(2):  # nothing has happened yet, so one retry on a fresh worker is safe
            try:
                reply = await self._reset_on_worker(game, route_key)
                break
            except (WorkerCrashed, EngineCallFailed) as exc:
                failure = str(exc)
                logger.warning("ALFWorld reset of %s failed (%s); retrying", game.name, exc)
                await self._release()
        if reply is None:
            self._done = True
            self._infra_failure = failure
            self._anchor = "infra-failure"
            info = self._info()
            info["infra_failure"] = failure
            return [{"role": "user", "content": f"The ALFWorld engine failed to start this game: {failure}"}], info
        self._done = False
        self._absorb(reply)
        self._goal, room = split_intro(reply["feedback"])
        self._last_text = room
        first = f"Your task is to: {self._goal}\n\n{room}{self._admissible_text()}"
        observation: Observation = []
        if self.system_prompt:
            observation.append({"role": "system", "content": self.system_prompt})
        observation.append({"role": "user", "content": first})
        return observation, self._info()

    async def step(self, action: str) -> StepResult:
        if self._infra_failure is not None:
            return self._infra_failure_result(self._infra_failure)
        if self._done:
            raise RuntimeError("ALFWorld episode is over (or was never started): call reset() first")
        self._steps += 1
        truncated = self._steps >= self.max_steps
        command = extract_action(action, self.action_tag)
        if command is not None and self.action_format == "index":
            command = self._command_at(command)
        if command is None or normalise_command(command) not in self._admissible:
            format_ok = command is not None
            reason = (
                f"no <{self.action_tag}>...</{self.action_tag}> tag found"
                if not format_ok
                else f"'{normalise_command(command)}' is not an admissible command here"
            )
            self._done = truncated
            text = f"Nothing happens ({reason}).{self._admissible_text()}"
            info = invalid_step_info(self._anchor, reason, format_ok=format_ok)
            info.update(self._extra_info())
            return (
                [{"role": "user", "content": text}],
                self.invalid_action_reward + self.step_reward,
                False,
                truncated,
                info,
            )
        command = normalise_command(command)
        want_plan = self.expert_plan == "always" or (self.expert_plan == "on_demand" and self._expert_used)
        try:
            assert self._slot is not None
            reply = await self.pool.call(self._slot, "step", command=command, want_plan=want_plan)
        except (WorkerCrashed, EngineCallFailed) as exc:
            self._done = True
            self._infra_failure = str(exc)
            await self._release()  # frees the route; a lost worker slot needs no goodbye
            return self._infra_failure_result(self._infra_failure)
        self._absorb(reply)
        self._last_text = reply["feedback"]
        won = reply["won"]
        self._done = won or truncated
        reward = (self.reward_won if won else 0.0) + self.step_reward
        info = self._info()
        info.update(action_valid=True, format_ok=True)
        return (
            [{"role": "user", "content": f"{reply['feedback']}{self._admissible_text()}"}],
            reward,
            won,
            truncated and not won,
            info,
        )

    async def close(self) -> None:
        self._done = True
        try:
            await self._release()
        except Exception:  # closing must never raise, even after a failed reset
            logger.debug("ignoring error while releasing an ALFWorld slot", exc_info=True)

    def expert_action(self) -> str:
        """The game's walkthrough while the episode follows it, then the planner's plan.

        With `expert_plan="on_demand"` the planner runs only in episodes that asked for the
        expert before stepping (an RL policy never pays for it); asking for the first time
        after leaving the walkthrough needs `expert_plan="always"`.
        """
        if self._done:
            raise RuntimeError("ALFWorld episode is over: no expert action")
        self._expert_used = True
        if self._expert_next is None:
            raise RuntimeError(
                "no expert action known here: the episode left the walkthrough before the expert "
                "was first asked; build the env with expert_plan='always' to plan after every step"
            )
        return wrap_action(self._as_answer(self._expert_next), self.action_tag)

    def random_action(self, rng: Any) -> str:
        if not self._admissible:
            raise RuntimeError("ALFWorld has no admissible commands before reset()")
        return wrap_action(self._as_answer(self._admissible[int(rng.integers(len(self._admissible)))]), self.action_tag)

    def render_text(self) -> str:
        if self._game is None:
            return ""
        holding = ", ".join(self._inventory) or "nothing"
        return (
            f"[{self._game.name}] step {self._steps}/{self.max_steps}\nTask: {self._goal}\n"
            f"{self._last_text}\nHolding: {holding}"
        )

    # -- helpers ------------------------------------------------------------------------
    def _infra_failure_result(self, failure: str) -> StepResult:
        """A step lost to the machinery: truncated, unscored, flagged `infra_failure`."""
        info = self._info()
        info.update(action_valid=True, format_ok=True, infra_failure=failure)
        return [{"role": "user", "content": f"The ALFWorld engine failed: {failure}"}], 0.0, False, True, info

    def _absorb(self, reply: dict[str, Any]) -> None:
        self._admissible = list(reply["admissible_commands"])
        self._anchor = reply["anchor"]
        self._inventory = list(reply["inventory"])
        self._expert_next = reply.get("expert_next")
        self._won = bool(reply["won"])

    def _admissible_text(self) -> str:
        if not self.show_admissible or not self._admissible:
            return ""
        if self.action_format == "index":
            return "\n\nAdmissible commands:\n" + "\n".join(f"{i} {c}" for i, c in enumerate(self._admissible, 1))
        return "\n\nAdmissible commands: " + ", ".join(self._admissible) + "."

    def _command_at(self, answer: str) -> str:
        """The admissible command an index answer names. Anything else (0, 07, a number past the
        list, even a spelled-out admissible command) comes back marked, so it is refused."""
        text = answer.strip()
        if _INDEX.fullmatch(text) and int(text) <= len(self._admissible):
            return self._admissible[int(text) - 1]
        return f"{text} (not a listed number)"

    def _as_answer(self, command: str) -> str:
        """A command as the agent answers it: itself, or its number in the admissible list."""
        if self.action_format == "text":
            return command
        if command not in self._admissible:
            raise RuntimeError(f"expert command '{command}' is not admissible here")
        return str(self._admissible.index(command) + 1)

    def _extra_info(self) -> dict[str, Any]:
        game = self._game
        return {
            "game": game.name if game else None,
            "task_type": game.task_type if game else None,
            "steps": self._steps,
        }

    def _info(self) -> dict[str, Any]:
        info = {"anchor": self._anchor, "success": self._won}
        info.update(self._extra_info())
        return info
