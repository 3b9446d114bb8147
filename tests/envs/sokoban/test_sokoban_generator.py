import numpy as np
import pytest

from rollhub.envs.sokoban.generator import RoomGenerationError, carve_floor, generate_room


def test_same_seed_same_room_different_seeds_differ():
    rooms = [generate_room(np.random.default_rng(seed)).board for seed in (7, 7, 8)]
    assert rooms[0] == rooms[1]
    assert len({generate_room(np.random.default_rng(s)).board.render() for s in range(30)}) > 20


@pytest.mark.parametrize("dim,boxes,depth", [((6, 6), 1, 30), ((6, 6), 2, 300), ((8, 8), 2, 100), ((7, 9), 1, 30)])
def test_rooms_are_solved_by_their_reverse_play(dim, boxes, depth):
    rng = np.random.default_rng(0)
    for _ in range(40):
        room = generate_room(rng, dim=dim, num_boxes=boxes, search_depth=depth)
        board = room.board
        assert (board.height, board.width) == dim
        assert len(board.boxes) == len(board.targets) == boxes
        assert board.boxes_on_target == 0, "every box starts off its target"
        assert not board.solved and room.score > 0
        assert board.after(room.solution).solved


def test_solution_length_capped_by_max_solution_steps():
    rng = np.random.default_rng(1)
    lengths = [len(generate_room(rng, search_depth=30, max_solution_steps=4).solution) for _ in range(100)]
    assert max(lengths) <= 4
    assert min(lengths) >= 1


def test_border_is_wall_and_floor_is_connected_to_player():
    rng = np.random.default_rng(2)
    floor = carve_floor(8, 8, rng)
    for i in range(64):
        if i < 8 or i >= 56 or i % 8 in (0, 7):
            assert floor[i] == 0
    assert sum(floor) > 0


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="dim"):
        generate_room(np.random.default_rng(0), dim=(3, 6))
    with pytest.raises(ValueError, match="num_boxes"):
        generate_room(np.random.default_rng(0), num_boxes=0)
    with pytest.raises(RoomGenerationError, match="fewer boxes"):  # 2x2 interior cannot hold 9 boxes
        generate_room(np.random.default_rng(0), dim=(4, 4), num_boxes=9, tries=3)
