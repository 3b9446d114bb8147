"""Optimal Sokoban solver: A* over (player, boxes) positions, one unit of cost per move.

Used by the env's scripted expert (`--agent expert`), by tests (the expert must solve every
generated room) and for SFT data. The heuristic is each box's push distance to its
nearest target ignoring other boxes (never more than the moves still needed, so the plan
is optimal); boxes on cells from which no target can be reached are pruned as dead.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from rollhub.envs.sokoban.grid import MOVES, Board, move_offsets


def push_distances(board: Board) -> dict[int, int]:
    """Fewest pushes from each cell to any target for a lone box (absent = dead cell).

    Computed backwards from the targets: a box at x can be pushed to x + d when the
    player can stand at x - d, so we pull from targets while both cells are floor.
    """
    offsets = list(move_offsets(board.width).values())
    distance = {t: 0 for t in board.targets}
    queue = deque(board.targets)
    while queue:
        cell = queue.popleft()
        for offset in offsets:
            before, player_spot = cell - offset, cell - 2 * offset
            if (
                board.floor[before]
                and 0 <= player_spot < len(board.floor)
                and board.floor[player_spot]
                and before not in distance
            ):
                distance[before] = distance[cell] + 1
                queue.append(before)
    return distance


def solve(board: Board, *, max_states: int = 1_000_000) -> list[str] | None:
    """Shortest move sequence that solves `board`, [] if solved, None if impossible.

    None is also returned when more than `max_states` positions would be expanded.
    """
    if board.solved:
        return []
    offsets = [(name, move_offsets(board.width)[name]) for name in MOVES]
    distance = push_distances(board)
    if any(b not in distance for b in board.boxes):
        return None
    floor, targets = board.floor, board.targets

    def heuristic(boxes: frozenset[int]) -> int:
        return sum(distance[b] for b in boxes)

    start = (board.player, board.boxes)
    parents: dict[tuple[int, frozenset[int]], tuple | None] = {start: None}
    best_cost = {start: 0}
    tie = itertools.count()
    frontier = [(heuristic(board.boxes), next(tie), 0, start)]
    expanded = 0
    while frontier:
        _, _, cost, state = heapq.heappop(frontier)
        if cost > best_cost[state]:
            continue
        player, boxes = state
        if boxes == targets:
            return _plan(parents, state)
        expanded += 1
        if expanded > max_states:
            return None
        for name, offset in offsets:
            ahead = player + offset
            if not floor[ahead]:
                continue
            new_boxes = boxes
            if ahead in boxes:
                beyond = ahead + offset
                if not floor[beyond] or beyond in boxes or beyond not in distance:
                    continue
                new_boxes = (boxes - {ahead}) | {beyond}
            new_state = (ahead, new_boxes)
            new_cost = cost + 1
            if new_cost < best_cost.get(new_state, 1 << 30):
                best_cost[new_state] = new_cost
                parents[new_state] = (state, name)
                heapq.heappush(frontier, (new_cost + heuristic(new_boxes), next(tie), new_cost, new_state))
    return None


def _plan(parents: dict, state: tuple) -> list[str]:
    moves = []
    while parents[state] is not None:
        state, name = parents[state]
        moves.append(name)
    return moves[::-1]
