# Room generation by reverse play, after the algorithm of gym-sokoban
# (https://github.com/mpSchrader/gym-sokoban).
# This file is our own implementation of that algorithm's ideas (carve a room by a random
# walk, put every box on its target, then pull boxes away from their targets and keep the
# most displaced state). gym-sokoban's licence is reproduced as it asks:
#
#   MIT License
#
#   Copyright (c) 2018 Max-Philipp Schrader
#
#   Permission is hereby granted, free of charge, to any person obtaining a copy
#   of this software and associated documentation files (the "Software"), to deal
#   in the Software without restriction, including without limitation the rights
#   to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
#   copies of the Software, and to permit persons to whom the Software is
#   furnished to do so, subject to the following conditions:
#
#   The above copyright notice and this permission notice shall be included in all
#   copies or substantial portions of the Software.
#
#   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
#   IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
#   FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
#   AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
#   LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
#   OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
#   SOFTWARE.
"""Procedural Sokoban rooms that are solvable by construction.

Why reverse play: a room built by pulling boxes off their targets can always be solved by
pushing them back (the pulls, reversed), so no solver is needed to guarantee solvability.

Differences from gym-sokoban, on purpose:
* all randomness comes from the caller's `numpy.random.Generator` (never global state),
  so a seed gives the same room in any thread or process;
* reverse play is a breadth-first search, so the path kept to each state is the shortest
  one; `max_solution_steps` can then cap the forward solution length exactly (a room
  must be solvable inside the episode's step limit);
* among equally displaced states one is drawn at random (not the first found), so the
  player does not always start next to a box;
* the forward solution (the reversed pulls) is returned with the room.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import numpy as np

from rollhub.envs.sokoban.grid import MOVES, Board, move_offsets

logger = logging.getLogger(__name__)

# Floor stamps of the random walk, as (row, col) offsets around the walker: two bars, two
# corners and a 2x2 block, the shapes that give gym-sokoban rooms their look.
_STAMPS = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
)
_STEP_DIRECTIONS = ((-1, 0), (1, 0), (0, -1), (0, 1))
_TURN_PROBABILITY = 0.35


class RoomGenerationError(ValueError):
    """No usable room came out of the allowed number of tries: the parameters ask for
    more than the room can hold (a ValueError, so callers report it as bad input)."""


@dataclass(frozen=True)
class GeneratedRoom:
    board: Board
    #: forward moves that solve the room (the reverse play, reversed); not always optimal
    solution: tuple[str, ...]
    #: gym-sokoban's score of the kept state: box changes x total box-target distance
    score: int


def carve_floor(height: int, width: int, rng: np.random.Generator) -> bytearray:
    """Random-walk topology: 1 = floor. The border stays wall."""
    walk_steps = int(1.7 * (height + width))
    turns = rng.random(walk_steps) < _TURN_PROBABILITY
    directions = rng.integers(0, 4, walk_steps + 1)
    stamps = rng.integers(0, len(_STAMPS), walk_steps)
    row = int(rng.integers(1, height - 1))
    col = int(rng.integers(1, width - 1))
    floor = bytearray(height * width)
    d_row, d_col = _STEP_DIRECTIONS[directions[0]]
    for step in range(walk_steps):
        if turns[step]:
            d_row, d_col = _STEP_DIRECTIONS[directions[step + 1]]
        row = min(max(row + d_row, 1), height - 2)
        col = min(max(col + d_col, 1), width - 2)
        for s_row, s_col in _STAMPS[stamps[step]]:
            r, c = row + s_row, col + s_col
            if 0 < r < height - 1 and 0 < c < width - 1:
                floor[r * width + c] = 1
    return floor


def _distance(a: int, b: int, width: int) -> int:
    return abs(a // width - b // width) + abs(a % width - b % width)


def reverse_play(
    floor: bytes,
    width: int,
    targets: tuple[int, ...],
    player: int,
    rng: np.random.Generator,
    *,
    search_depth: int,
    max_states: int,
) -> tuple[tuple[int, tuple[int, ...]], tuple[str, ...], int]:
    """Pull boxes away from their targets; keep a best-scoring state.

    Returns (state, forward solution, score); state = (player, boxes), where box i
    started on targets[i]. A state scores only if no box is left on a target. Among
    equally good states one is drawn at random: the shallowest would always leave the
    player next to the box it just pulled, which makes rooms trivially short.
    """
    offsets = move_offsets(width)
    moves = [(name, offsets[name]) for name in MOVES]
    target_set = set(targets)
    start = (player, targets)
    # state -> (parent state, move name, depth, box swaps, index of the last pulled box)
    visited: dict[tuple[int, tuple[int, ...]], tuple] = {start: (None, "", 0, 0, -1)}
    queue = deque([start])
    best, best_score = [start], 0
    while queue and len(visited) < max_states:
        state = queue.popleft()
        p, boxes = state
        _, _, depth, swaps, last = visited[state]
        if depth >= search_depth:
            continue
        for name, offset in moves:
            ahead = p + offset
            if not floor[ahead] or ahead in boxes:
                continue
            candidates = [(boxes, swaps, last)]
            behind = p - offset
            if behind in boxes:
                pulled = boxes.index(behind)
                moved = boxes[:pulled] + (p,) + boxes[pulled + 1 :]
                candidates.append((moved, swaps + (pulled != last), pulled))
            for new_boxes, new_swaps, new_last in candidates:
                new_state = (ahead, new_boxes)
                if new_state in visited:
                    continue
                visited[new_state] = (state, name, depth + 1, new_swaps, new_last)
                queue.append(new_state)
                if target_set.isdisjoint(new_boxes):
                    score = new_swaps * sum(_distance(b, t, width) for b, t in zip(new_boxes, targets))
                    if score > best_score:
                        best, best_score = [new_state], score
                    elif score == best_score and score > 0:
                        best.append(new_state)
    opposite = {"up": "down", "down": "up", "left": "right", "right": "left"}
    chosen = best[int(rng.integers(len(best)))] if len(best) > 1 else best[0]
    solution = []
    state = chosen
    while visited[state][0] is not None:
        parent, name = visited[state][0], visited[state][1]
        solution.append(opposite[name])
        state = parent
    return chosen, tuple(solution), best_score


def generate_room(
    rng: np.random.Generator,
    *,
    dim: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    search_depth: int = 30,
    max_states: int = 300_000,
    max_solution_steps: int | None = None,
    tries: int = 20,
) -> GeneratedRoom:
    """A new room solvable by construction (and within `max_solution_steps` if given)."""
    height, width = dim
    if height < 4 or width < 4:
        raise ValueError(f"Sokoban rooms need dim >= (4, 4) (border walls plus a 2x2 interior), got {dim}")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    depth = search_depth if max_solution_steps is None else min(search_depth, max_solution_steps)
    for attempt in range(tries):
        floor = carve_floor(height, width, rng)
        cells = [i for i, f in enumerate(floor) if f]
        if len(cells) < num_boxes + 2:
            continue
        picks = rng.choice(len(cells), num_boxes + 1, replace=False)
        targets = tuple(cells[i] for i in picks[:num_boxes])
        player = cells[picks[num_boxes]]
        (end_player, boxes), solution, score = reverse_play(
            bytes(floor), width, targets, player, rng, search_depth=depth, max_states=max_states
        )
        if score > 0:
            board = Board(height, width, bytes(floor), frozenset(targets), frozenset(boxes), end_player)
            return GeneratedRoom(board, solution, score)
        logger.debug("room attempt %d had no movable box; retrying", attempt)
    raise RoomGenerationError(
        f"no solvable {height}x{width} room with {num_boxes} boxes in {tries} tries; "
        "use fewer boxes, a bigger room, a larger search_depth or more max_steps"
    )
