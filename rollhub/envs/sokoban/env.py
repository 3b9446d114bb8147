"""`rollhub/Sokoban-v0`: push every box onto a target, one move per turn.

Observations are kept short for small models: one system message with the rules, the
legend and the answer format, then every turn the same few-line grid (prefixed with one
line saying why, when the last move was rejected).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Container
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rollhub.envs.base import Env, Observation, StepResult, extract_action, invalid_step_info, wrap_action
from rollhub.envs.sokoban.generator import generate_room
from rollhub.envs.sokoban.grid import LEGEND, MOVES, Board
from rollhub.envs.sokoban.solver import push_distances, solve
from rollhub.envs.wrappers import DifficultyFloor

logger = logging.getLogger(__name__)

#: observation layouts: the packed grid ("grid") or one token per cell ("cells", outer wall
#: ring dropped), each optionally followed by the positions line (Board.describe_positions)
OBSERVATIONS = ("grid", "grid+positions", "cells", "cells+positions")

#: rooms drawn per reset before `min_solution_steps` is declared out of reach
MIN_SOLUTION_TRIES = 1000
#: splits of the room space, decided by a hash of the first position (`room_key`)
SPLITS = ("all", "train", "validation", "test")
#: share of rooms (per mille) held out for the test split
TEST_PERMILLE = 200
#: share of rooms (per mille) held out for the validation split (checkpoint selection, `eval.select`):
#: neither trained on nor in the test split, so picking a checkpoint on them leaves the test reading honest
VALIDATION_PERMILLE = 100
#: rooms drawn per reset before a split is declared out of reach
SPLIT_TRIES = 200


def room_key(board: Board) -> str:
    """The content key of a room: its first position. Small rooms repeat across seeds (6x6 with
    one box has a few thousand), so a held-out set must be held out by content, not by seed."""
    return "sokoban:" + hashlib.sha256(board.anchor()).hexdigest()[:24]


def room_partition(key: str) -> Literal["train", "validation", "test"]:
    """The partition a room key belongs to: the first TEST_PERMILLE of every thousand hash values
    are test, the next VALIDATION_PERMILLE validation, the rest train (keys not of this env count
    as test, so no split ever trains on them)."""
    digest = key.removeprefix("sokoban:")
    try:
        value = int(digest[:8], 16) % 1000
    except ValueError:
        return "test"
    if value < TEST_PERMILLE:
        return "test"
    return "validation" if value < TEST_PERMILLE + VALIDATION_PERMILLE else "train"


def key_in_test_partition(key: str) -> bool:
    """Whether a room key belongs to the held-out test partition (keys not of this env count as held out)."""
    return room_partition(key) == "test"


RULES = (
    "Sokoban. Push every box onto a target. You can push one box at a time; you cannot pull boxes "
    "or push them into walls or other boxes.\n"
    f"Legend: {LEGEND}.\n"
)


def system_prompt(action_tag: str = "action") -> str:
    """The rules, the legend and the answer format for `action_tag` ("" = a bare move word)."""
    moves = ", ".join(wrap_action(move, action_tag) for move in MOVES[:-1])
    return f"{RULES}Answer with one move: {moves} or {wrap_action(MOVES[-1], action_tag)}."


SYSTEM_PROMPT = system_prompt()


@dataclass(frozen=True)
class SokobanRewards:
    """Reward scheme. "shaped" is gym-sokoban's (as in RAGEN / verl-agent / GiGPO);
    "sparse" pays `solved` only. Format penalties belong to the trainer, not here."""

    step: float = -0.1
    box_on_target: float = 1.0
    box_off_target: float = -1.0
    solved: float = 10.0
    invalid: float = -0.1

    @classmethod
    def preset(cls, name: str) -> SokobanRewards:
        if name == "shaped":
            return cls()
        if name == "sparse":
            return cls(step=0.0, box_on_target=0.0, box_off_target=0.0, solved=1.0, invalid=0.0)
        raise ValueError(f"reward must be 'shaped' or 'sparse', got {name!r}")


def is_deadlocked(board: Board, live_cells: Container[int] | None = None) -> bool:
    """A box on a cell from which pushes can never reach a target (certain loss).

    `live_cells` is `push_distances` of the room; it depends on walls and targets only, so
    the env computes it once per episode instead of on every move.
    """
    live = push_distances(board) if live_cells is None else live_cells
    return any(box not in live for box in board.boxes)


class SokobanEnv(Env):
    """Procedural Sokoban (reverse-play rooms), text grid observations.

    Args:
        dim: room size (rows, cols) or one int for a square room, border walls included.
        num_boxes: boxes (and targets) per room.
        max_steps: moves per episode (invalid moves count too).
        search_depth: depth of the reverse play that builds the room.
        reward: "shaped" or "sparse"; individual values override the preset
            (step_reward, box_on_target_reward, box_off_target_reward, solved_reward,
            invalid_reward).
        progress_reward: potential-based shaping (Ng, Harada & Russell 1999) with the
            solver's distance-to-go d(s) (moves of an optimal plan, capped at max_steps: a
            position further out cannot be solved within the episode; a dead position counts
            as max_steps + 1, so it always prices below every live one): each valid move also
            earns progress_reward * (d(s) - d(s')). Over an episode it telescopes to
            progress_reward * (d(s_0) - d(s_T)), so it ranks failed episodes by how close
            they got without changing which policy is optimal, and gives every move its
            own signal (+k for an optimal move, -k for a move away from the goal, about
            -k * (max_steps + 1 - d) for pushing a box into a dead corner). 0 (default) = off.
            Without the cap a dead push from a live position more than max_steps + 2 moves out
            would have earned a reward.
        progress_clip: a push into a dead position costs -progress_reward, what any move away
            costs. Unpriced, a dead push from distance d costs k * (max_steps + 1 - d), many times
            a move away in a long room, which can teach a policy to stop pushing and run out of
            moves instead. With `end_on_deadlock` the success the episode forfeits still counts
            through the return. Only dead pushes are repriced: dead positions are absorbing, so
            no loop passes through one and moves between live positions keep the potential's
            zero sum around every loop (clipping every move to [-k, k] instead would pay a lap
            around a loop whose push costs more than one move).
        solvable_within_max_steps: only produce rooms solvable in max_steps moves.
        observation: "grid" (the legend's symbols, one line a row), "cells" (a space before
            every symbol so each cell is one token of a BPE tokenizer, outer wall ring left
            out), and either with "+positions" (a line of box/target offsets and blocked moves).
        action_tag: the tag around a move (<action>up</action>); "" = the answer is the bare
            move word, one token for a small tokenizer instead of seven with the tags.
        end_on_deadlock: end the episode (terminated, not solved) as soon as a box stands
            on a cell from which no push sequence reaches a target. The moves after that
            cannot change the outcome; playing them out costs generation, and their
            advantages (only the wall-move penalty differs) are noise to the trainer.
        max_reverse_states: cap on positions explored while building a room.
        split: `all` rooms, or one partition: `train`, `validation` (for checkpoint selection)
            or `test` (held out); the partition is a hash of the room's first position
            (`room_key`, `room_partition`), so the three are disjoint by content whatever the
            seeds. A split redraws from the seed's stream.
    Options of reset: {"board": text} plays a hand-made level drawn with the legend's symbols.

    The training-only difficulty floor `min_solution_steps` is a wrapper that the registered
    ids apply from their kwargs (`with_min_solution_steps`), not an argument of this class.
    """

    action_tag = "action"
    CHECK_BY_BUILDING = True

    def __init__(
        self,
        dim: int | tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 15,
        search_depth: int = 30,
        reward: Literal["shaped", "sparse"] = "shaped",
        step_reward: float | None = None,
        box_on_target_reward: float | None = None,
        box_off_target_reward: float | None = None,
        solved_reward: float | None = None,
        invalid_reward: float | None = None,
        progress_reward: float = 0.0,
        progress_clip: bool = False,
        solvable_within_max_steps: bool = True,
        max_reverse_states: int = 300_000,
        observation: Literal["grid", "grid+positions", "cells", "cells+positions"] = "grid",
        action_tag: str = "action",
        end_on_deadlock: bool = False,
        split: Literal["all", "train", "validation", "test"] = "all",
    ):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.split = split
        if not isinstance(dim, int) and len(dim) != 2:
            raise ValueError(f"dim must be one int or (rows, cols), got {dim!r}")
        self.dim = (dim, dim) if isinstance(dim, int) else (int(dim[0]), int(dim[1]))
        if min(self.dim) < 4:
            raise ValueError(f"dim must be at least 4x4 (walls included), got {self.dim}")
        if num_boxes < 1 or max_steps < 1 or search_depth < 1:
            raise ValueError("num_boxes, max_steps and search_depth must all be >= 1")
        interior = (self.dim[0] - 2) * (self.dim[1] - 2)
        if num_boxes + 1 > interior:
            raise ValueError(
                f"{num_boxes} boxes and a player do not fit a {self.dim[0]}x{self.dim[1]} room ({interior} inner cells)"
            )
        self.num_boxes = num_boxes
        self.max_steps = max_steps
        self.search_depth = search_depth
        self.solvable_within_max_steps = solvable_within_max_steps
        self.max_reverse_states = max_reverse_states
        if observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {', '.join(OBSERVATIONS)}, got {observation!r}")
        self.observation = observation
        if not isinstance(action_tag, str) or any(c in action_tag for c in "<>/ "):
            raise ValueError(f"action_tag must be a tag name like 'action' or '' (bare moves), got {action_tag!r}")
        self.action_tag = action_tag
        self.end_on_deadlock = bool(end_on_deadlock)
        preset = SokobanRewards.preset(reward)
        overrides = {
            "step": step_reward,
            "box_on_target": box_on_target_reward,
            "box_off_target": box_off_target_reward,
            "solved": solved_reward,
            "invalid": invalid_reward,
        }
        if progress_reward < 0:
            raise ValueError(f"progress_reward must be >= 0 (0 = off), got {progress_reward}")
        self.progress_reward = float(progress_reward)
        if not isinstance(progress_clip, bool):
            raise ValueError(f"progress_clip must be true or false, got {progress_clip!r}")
        self.progress_clip = progress_clip
        self.rewards = SokobanRewards(
            **{k: (getattr(preset, k) if v is None else float(v)) for k, v in overrides.items()}
        )
        self._rng = np.random.default_rng()
        self._board: Board | None = None
        self._room_key: str | None = None
        self._steps = 0
        self._done = False
        self._plan: list[str] = []
        self._plan_anchor: bytes | None = None
        self._construction_plan: list[str] = []
        self._plans: dict[bytes, list[str] | None] = {}  # optimal plan per position, this episode
        self._live_cells: dict[int, int] | None = None  # push_distances of the room (end_on_deadlock)

    # -- episode -------------------------------------------------------------------------
    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        board_text = (options or {}).get("board")
        self._plans = {}
        if board_text is not None:  # a hand-made level instead of a generated one
            self._board, self._construction_plan = Board.from_text(board_text), []
            self._room_key = room_key(self._board)
        else:
            self._generate()
        self._steps = 0
        self._done = False
        self._plan, self._plan_anchor = [], None
        self._live_cells = push_distances(self._board) if self.end_on_deadlock else None
        obs: Observation = [
            {"role": "system", "content": system_prompt(self.action_tag)},
            {"role": "user", "content": self._show(self._board)},
        ]
        info = {"anchor": self._board.anchor(), "success": False, "boxes_on_target": self._board.boxes_on_target}
        return obs, info

    def _generate(self) -> None:
        """A new room from the env's generator: the room of a seed depends on nothing but the
        seed and the env's arguments, and an unseeded reset draws the next room of the stream."""
        for _ in range(SPLIT_TRIES):
            room = generate_room(
                self._rng,
                dim=self.dim,
                num_boxes=self.num_boxes,
                search_depth=self.search_depth,
                max_states=self.max_reverse_states,
                max_solution_steps=self.max_steps if self.solvable_within_max_steps else None,
            )
            key = room_key(room.board)
            if self.split == "all" or room_partition(key) == self.split:
                break
        else:
            raise ValueError(f"no room of the {self.split} split in {SPLIT_TRIES} draws")
        self._board, self._construction_plan = room.board, list(room.solution)
        self._room_key = key
        self._plans = {}

    def task_key(self) -> str | None:
        """The content key of the room the last reset drew (`room_key`), under a split only: a
        run on `all` makes no held-out claim, and keying it would cost every run start a sample."""
        return None if self.split == "all" else self._room_key

    def could_draw(self, keys: set[str]) -> set[str] | None:
        """The room keys among `keys` this env might play: a split decides by content."""
        if self.split == "all":
            return None
        return {key for key in keys if room_partition(key) == self.split}

    async def step(self, action: str) -> StepResult:
        board = self._require_board()
        if self._done:
            raise RuntimeError("episode is over; call reset() first")
        self._steps += 1
        move = extract_action(action, self.action_tag)
        if move is None:
            return self._reject(
                board, f"no move found; answer like {wrap_action('up', self.action_tag)}", format_ok=False
            )
        move = move.lower()
        if move not in MOVES:
            # with bare answers the format IS the move word, so anything else is a format error
            return self._reject(
                board, f"'{move[:20]}' is not a move; use up, down, left or right", format_ok=bool(self.action_tag)
            )
        new_board, why = board.try_move(move)
        if new_board is None:
            return self._reject(board, why, format_ok=True)

        reward = self.move_reward(board, new_board)
        terminated = new_board.solved
        deadlocked = self.end_on_deadlock and not terminated and is_deadlocked(new_board, self._live_cells)
        terminated = terminated or deadlocked
        self._advance_plan(board, move, new_board)
        self._board = new_board
        truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or truncated
        info = {
            "anchor": new_board.anchor(),
            "success": new_board.solved,
            "action_valid": True,
            "format_ok": True,
            "boxes_on_target": new_board.boxes_on_target,
        }
        if deadlocked:
            info["deadlock"] = True
        return [{"role": "user", "content": self._show(new_board)}], float(reward), terminated, truncated, info

    def move_reward(self, before: Board, after: Board) -> float:
        """The whole reward of a valid move from `before` to `after`: the preset's terms plus
        the progress shaping. Public so a search of a room's state graph for loops that pay
        uses the env's own pricing, not a copy of it."""
        on_before, on_after = before.boxes_on_target, after.boxes_on_target
        reward = self.rewards.step
        reward += self.rewards.box_on_target * max(on_after - on_before, 0)
        reward += self.rewards.box_off_target * max(on_before - on_after, 0)
        if after.solved:
            reward += self.rewards.solved
        if self.progress_reward:
            d_before, d_after = self.distance_to_go(before), self.distance_to_go(after)
            if self.progress_clip and d_after == self.dead_distance and d_before < self.dead_distance:
                d_after = d_before + 1  # a push into a dead position is priced as one move away
            reward += self.progress_reward * (d_before - d_after)
        return reward

    @property
    def dead_distance(self) -> int:
        """`distance_to_go` of a dead position: one more than any live position's."""
        return self.max_steps + 1

    def distance_to_go(self, board: Board) -> int:
        """Moves of an optimal plan from `board`: 0 when solved, at most max_steps while live
        (no further position can be solved within the episode), `dead_distance` when dead."""
        if board.solved:
            return 0
        plan = self._optimal_plan(board)
        return min(len(plan), self.max_steps) if plan else self.dead_distance

    def _optimal_plan(self, board: Board) -> list[str] | None:
        """`solve(board)`, once per position and episode. Every suffix of an optimal plan is
        optimal from the position it starts at, so one solve also answers for each position
        along the plan: shaping and the expert then solve only where an episode leaves it."""
        key = board.anchor()
        if key not in self._plans:
            plan = solve(board)
            self._plans[key] = plan
            for i, move in enumerate(plan or []):
                board, _ = board.try_move(move)
                if board is None:  # cannot happen for the solver's own plan; stop caching, not the episode
                    break
                self._plans.setdefault(board.anchor(), plan[i + 1 :])
        return self._plans[key]

    def _reject(self, board: Board, reason: str, *, format_ok: bool) -> StepResult:
        """Invalid move: state unchanged, penalty, and a one-line reason above the grid."""
        truncated = self._steps >= self.max_steps
        self._done = truncated
        info = invalid_step_info(board.anchor(), reason, format_ok=format_ok)
        info["boxes_on_target"] = board.boxes_on_target
        obs: Observation = [{"role": "user", "content": f"Invalid: {reason}.\n{self._show(board)}"}]
        return obs, float(self.rewards.invalid), False, truncated, info

    def _show(self, board: Board) -> str:
        """The observation text: the grid, plus a positions line when configured."""
        grid = board.render_cells() if self.observation.startswith("cells") else board.render()
        if self.observation.endswith("+positions"):
            return f"{grid}\n{board.describe_positions()}"
        return grid

    async def close(self) -> None:
        self._board = None
        self._done = True

    # -- agents --------------------------------------------------------------------------
    def expert_action(self) -> str:
        """Next move of an optimal plan (re-planned if the episode left the plan)."""
        board = self._require_board()
        if self._plan_anchor != board.anchor() or not self._plan:
            plan = self._optimal_plan(board)
            if plan is None and self._steps == 0:  # solver over its state cap: the room's own solution
                plan = self._construction_plan
            if not plan:  # a dead position (box stuck) has no plan; any move will do
                logger.info("expert found no plan from this position; moving at random")
                plan = [MOVES[0]]
            self._plan, self._plan_anchor = plan, board.anchor()
        return wrap_action(self._plan[0], self.action_tag)

    def _advance_plan(self, before: Board, move: str, after: Board) -> None:
        if self._plan and self._plan_anchor == before.anchor() and self._plan[0] == move:
            self._plan = self._plan[1:]
            self._plan_anchor = after.anchor()

    def random_action(self, rng: np.random.Generator) -> str:
        return wrap_action(MOVES[int(rng.integers(len(MOVES)))], self.action_tag)

    def render_text(self) -> str:
        return self._board.render() if self._board is not None else ""

    @property
    def board(self) -> Board:
        """The current position (for solvers, SFT data and tests)."""
        return self._require_board()

    def _require_board(self) -> Board:
        if self._board is None:
            raise RuntimeError("call reset() before using the env")
        return self._board


def with_min_solution_steps(env: SokobanEnv, min_solution_steps: int) -> Env:
    """The training-only difficulty floor of the registered Sokoban ids (env kwarg
    `min_solution_steps`): resets draw rooms until the shortest solution of the first position
    (`distance_to_go`) is at least this many moves. 0 (the default) = off: the env unwrapped.

    At most max_steps and search_depth (reverse play builds no longer room). Evaluation plays
    the env unwrapped (`eval.env.kwargs: {min_solution_steps: 0}`); hand-made boards
    (`options={"board": ...}`) are played as they are.
    """
    if isinstance(min_solution_steps, bool) or not isinstance(min_solution_steps, int):
        raise ValueError(f"min_solution_steps must be an int, got {min_solution_steps!r}")
    ceiling = min(env.max_steps, env.search_depth)  # no room needs more: it must fit the episode and reverse play
    if not 0 <= min_solution_steps <= ceiling:
        raise ValueError(
            f"min_solution_steps must be in [0, min(max_steps, search_depth)] = [0, {ceiling}] (0 = off), "
            f"got {min_solution_steps}"
        )
    if not min_solution_steps:
        return env
    return DifficultyFloor(
        env,
        min_solution_steps,
        lambda inner: inner.distance_to_go(inner.board),
        name="min_solution_steps",
        tries=MIN_SOLUTION_TRIES,
        hint=(
            f"dim {env.dim}, {env.num_boxes} boxes, max_steps {env.max_steps}, search_depth {env.search_depth}: "
            "lower min_solution_steps or raise search_depth"
        ),
    )
