from collections import deque

import numpy as np
import pytest

from rollhub.envs.sokoban.generator import generate_room
from rollhub.envs.sokoban.grid import MOVES, Board
from rollhub.envs.sokoban.solver import push_distances, solve

LEVEL = """
#######
#_____#
#_XP__#
#___O_#
#######
"""


def breadth_first_length(board: Board) -> int | None:
    """Independent reference: plain BFS over positions (no heuristic, no pruning)."""
    seen = {(board.player, board.boxes)}
    queue = deque([(board, 0)])
    while queue:
        current, depth = queue.popleft()
        if current.solved:
            return depth
        for move in MOVES:
            nxt, _ = current.try_move(move)
            if nxt is not None and (nxt.player, nxt.boxes) not in seen:
                seen.add((nxt.player, nxt.boxes))
                queue.append((nxt, depth + 1))
    return None


def test_hand_made_level_has_the_known_optimal_plan():
    board = Board.from_text(LEVEL)
    plan = solve(board)
    # box (2,2) must go right 2 and down 1: walk round to its left, push right twice, then push down
    assert plan is not None and len(plan) == breadth_first_length(board)
    assert board.after(plan).solved


def test_solved_and_dead_positions():
    assert solve(Board.from_text("#####\n#*P_#\n#####")) == []
    dead = Board.from_text("#####\n#X__#\n#_PO#\n#####")  # box in a corner, target elsewhere
    assert push_distances(dead).get(6) is None
    assert solve(dead) is None


def test_plans_are_optimal_against_plain_bfs():
    rng = np.random.default_rng(3)
    for boxes in (1, 2):
        for _ in range(30):
            board = generate_room(rng, num_boxes=boxes, search_depth=40).board
            plan = solve(board)
            assert plan is not None
            assert len(plan) == breadth_first_length(board)
            assert board.after(plan).solved


def test_after_reports_the_impossible_move():
    board = Board.from_text(LEVEL)
    with pytest.raises(ValueError, match="move 1 \\(up\\) is impossible"):
        board.after(["up", "up"])
