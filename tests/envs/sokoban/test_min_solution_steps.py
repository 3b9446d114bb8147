"""`min_solution_steps=k` on a Sokoban id: a training-only wrapper under which every room needs at
least k moves, a seed still gives one room, a floor no room can meet is refused, and the room
of every seed matches what the floor drew when it lived inside the env."""

from __future__ import annotations

import pytest

import rollhub.envs as envs
from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.envs.sokoban.env import SokobanEnv, with_min_solution_steps
from rollhub.envs.sokoban.generator import generate_room
from rollhub.envs.wrappers import DifficultyFloor, wrappers_of


async def _rooms(env, seeds: range) -> list[tuple[int, str]]:
    """(shortest solution of the first position, grid) per seed."""
    out = []
    for seed in seeds:
        await env.reset(seed=seed)
        out.append((env.distance_to_go(env.board), env.board.render()))
    return out


async def test_every_room_meets_the_floor_and_only_short_rooms_change():
    plain = await _rooms(envs.make("rollhub/Sokoban-v0"), range(60))
    assert min(d for d, _ in plain) < 6  # without the floor short rooms are common
    floored = await _rooms(envs.make("rollhub/Sokoban-v0", min_solution_steps=6), range(60))
    assert min(d for d, _ in floored) >= 6
    # a seed whose first room already meets the floor keeps it; the others are redrawn
    for (d, room), (_, floored_room) in zip(plain, floored, strict=True):
        assert (room == floored_room) == (d >= 6)


async def test_the_wrapper_draws_the_rooms_a_floor_inside_the_env_drew():
    """The floor used to redraw inside the env's reset from the same seeded generator: the wrapper's
    unseeded resets continue that generator, so every seed keeps its room."""
    import numpy as np

    env = envs.make("rollhub/Sokoban-v0", max_steps=10, min_solution_steps=5)
    inner = env.unwrapped
    for seed in range(30):
        await env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        while True:  # the loop the env ran before the floor became a wrapper
            room = generate_room(
                rng, dim=inner.dim, num_boxes=1, search_depth=inner.search_depth, max_solution_steps=10
            )
            if inner.distance_to_go(room.board) >= 5:
                break
        assert env.board.render() == room.board.render(), seed


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
    a = envs.make("rollhub/Sokoban-v0", min_solution_steps=8)
    b = envs.make("rollhub/Sokoban-v0", min_solution_steps=8)
    for seed in (0, 5, 123):
        await a.reset(seed=seed)
        await b.reset(seed=42)  # another room in between: the seed alone decides
        await b.reset(seed=seed)
        assert a.board.render() == b.board.render()


async def test_hand_made_boards_are_played_as_given():
    env = envs.make("rollhub/Sokoban-v0", min_solution_steps=5)
    await env.reset(options={"board": "#####\n#PXO#\n#####"})
    assert env.distance_to_go(env.board) == 1


def test_the_floor_is_a_training_only_wrapper_and_zero_is_the_env_itself():
    floored = envs.make("rollhub/Sokoban-v0", min_solution_steps=5)
    assert isinstance(floored, DifficultyFloor) and floored.training_only
    assert [w.setting for w in wrappers_of(floored)] == ["min_solution_steps"]
    assert isinstance(floored.unwrapped, SokobanEnv) and floored.spec.id == "rollhub/Sokoban-v0"
    assert floored.max_steps == 15 and floored.action_tag == "action"
    assert type(envs.make("rollhub/Sokoban-v0", min_solution_steps=0)) is SokobanEnv


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
    floor = kwargs.pop("min_solution_steps")
    with pytest.raises(ValueError, match=message):
        with_min_solution_steps(SokobanEnv(**kwargs), floor)


async def test_a_floor_no_room_reaches_raises_instead_of_looping():
    env = envs.make("rollhub/Sokoban-v0", dim=5, max_steps=15, min_solution_steps=15)  # none over 10 moves
    with pytest.raises(ValueError, match="lower min_solution_steps"):
        await env.reset(seed=0)


def test_run_config_takes_the_floor_for_training_and_evaluation_must_drop_it():
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
    inherited = load_config(RunConfig, None, ["env.kwargs={min_solution_steps: 6}"])
    with pytest.raises(UserError, match=r"eval.env.kwargs.min_solution_steps is 6: .* training-only"):
        check_run_envs(inherited)
