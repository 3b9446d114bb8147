"""SokobanEnv(min_solution_steps=k): every generated room needs at least k moves, a seed still
gives one room, and a floor no room can meet is refused."""

from __future__ import annotations

import pytest

import rollhub.envs as envs
from rollhub.core.config import load_config
from rollhub.envs.sokoban.env import SokobanEnv
from rollhub.envs.sokoban.generator import RoomGenerationError


async def _rooms(env: SokobanEnv, seeds: range) -> list[tuple[int, str]]:
    """(shortest solution of the first position, grid) per seed."""
    out = []
    for seed in seeds:
        await env.reset(seed=seed)
        out.append((env.distance_to_go(env.board), env.board.render()))
    return out


async def test_every_room_meets_the_floor_and_only_short_rooms_change():
    plain = await _rooms(SokobanEnv(), range(60))
    assert min(d for d, _ in plain) < 6  # without the floor short rooms are common
    floored = await _rooms(SokobanEnv(min_solution_steps=6), range(60))
    assert min(d for d, _ in floored) >= 6
    # a seed whose first room already meets the floor keeps it; the others are redrawn
    for (d, room), (_, floored_room) in zip(plain, floored, strict=True):
        assert (room == floored_room) == (d >= 6)


async def test_the_floor_holds_on_two_box_rooms_and_the_expert_still_solves_them():
    env = envs.make("rollhub/Sokoban-6x6-2b-v0", min_solution_steps=10)
    for seed in range(8):
        await env.reset(seed=seed)
        assert env.distance_to_go(env.board) >= 10
        for _ in range(env.max_steps):
            *_, terminated, truncated, info = await env.step(env.expert_action())
            if terminated or truncated:
                break
        assert info["success"], seed


async def test_same_seed_gives_the_same_room():
    a, b = SokobanEnv(min_solution_steps=8), SokobanEnv(min_solution_steps=8)
    for seed in (0, 5, 123):
        await a.reset(seed=seed)
        await b.reset(seed=42)  # another room in between: the seed alone decides
        await b.reset(seed=seed)
        assert a.board.render() == b.board.render()


async def test_hand_made_boards_are_played_as_given():
    env = SokobanEnv(min_solution_steps=5)
    await env.reset(options={"board": "#####\n#PXO#\n#####"})
    assert env.distance_to_go(env.board) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"min_solution_steps": -1},
            r"min_solution_steps must be in \[0, min\(max_steps, search_depth\)\] = \[0, 15\]",
        ),
        ({"min_solution_steps": 16}, r"= \[0, 15\]"),
        ({"min_solution_steps": 9, "search_depth": 8}, r"= \[0, 8\]"),
        ({"min_solution_steps": 2.5}, "min_solution_steps must be an int"),
    ],
)
def test_invalid_floors_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SokobanEnv(**kwargs)


async def test_a_floor_no_room_reaches_raises_instead_of_looping():
    env = SokobanEnv(dim=5, max_steps=15, min_solution_steps=15)  # 1000 seeds: none over 10 moves
    with pytest.raises(RoomGenerationError, match="lower min_solution_steps"):
        await env.reset(seed=0)


def test_run_config_takes_the_floor_for_training_and_evaluation_can_drop_it():
    from rollhub.trainer.build import check_run_envs
    from rollhub.trainer.config import RunConfig

    config = load_config(
        RunConfig,
        None,
        ["env.kwargs={min_solution_steps: 6}", "eval.env.kwargs={min_solution_steps: 0}"],
    )
    check_run_envs(config)
    assert config.env.kwargs["min_solution_steps"] == 6
    assert config.eval.env.kwargs["min_solution_steps"] == 0
