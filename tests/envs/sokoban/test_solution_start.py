"""SokobanEnv(solution_start=p): a share p of resets start partway along the room's optimal
plan, never on the goal; the seed alone decides the start (so a group's samples share it); off
draws nothing, so every seed keeps its room; a band puts moved starts at a distance from the goal."""

from __future__ import annotations

import pytest

import rollhub.envs as envs
from rollhub.envs.sokoban.env import SokobanEnv
from rollhub.envs.sokoban.solver import solve

TWO_BOX = "rollhub/Sokoban-6x6-2b-v0"


async def _starts(env: SokobanEnv, seeds: range) -> list[tuple[bytes, int]]:
    """(anchor, shortest-plan length) of the first position per seed."""
    out = []
    for seed in seeds:
        await env.reset(seed=seed)
        out.append((env.board.anchor(), len(solve(env.board))))
    return out


async def test_moved_starts_lie_on_the_plan_short_of_the_goal():
    plain = await _starts(envs.make(TWO_BOX), range(40))
    curriculum = await _starts(envs.make(TWO_BOX, solution_start=0.5), range(40))
    moved = 0
    for (room, n), (start, k) in zip(plain, curriculum, strict=True):
        if start != room:
            moved += 1
            assert 1 <= k < n  # strictly closer along an optimal plan, never already solved
    assert 8 <= moved <= 32  # about half of 40 (binomial, p = 0.5: outside this ~1e-4)


async def test_share_one_moves_every_room_with_a_plan_of_two_or_more():
    plain = await _starts(SokobanEnv(), range(30))
    always = await _starts(SokobanEnv(solution_start=1.0), range(30))
    for (room, n), (start, k) in zip(plain, always, strict=True):
        assert (start != room) == (n >= 2)
        assert k < n or n < 2


async def test_a_band_puts_moved_starts_in_it_and_leaves_short_rooms():
    plain = await _starts(envs.make(TWO_BOX), range(80))
    banded = await _starts(envs.make(TWO_BOX, solution_start=1.0, solution_start_distance=[8, 12]), range(80))
    for (room, n), (start, k) in zip(plain, banded, strict=True):
        if n <= 8:
            assert start == room  # already at or inside the band's near edge: played as drawn
        else:
            assert start != room and 8 <= k <= min(12, n - 1)
    assert any(n > 12 for _, n in plain)  # the band's far edge was exercised


async def test_the_seed_alone_decides_the_start():
    a, b = SokobanEnv(solution_start=0.5), SokobanEnv(solution_start=0.5)
    for seed in (0, 7, 31, 123):
        await a.reset(seed=seed)
        await b.reset(seed=999)  # another room in between
        await b.reset(seed=seed)
        assert a.board.anchor() == b.board.anchor()


async def test_off_keeps_every_room_and_the_expert_solves_moved_starts():
    off = await _starts(SokobanEnv(solution_start=0.0), range(20))
    assert off == await _starts(SokobanEnv(), range(20))
    env = envs.make(TWO_BOX, solution_start=1.0)
    for seed in range(6):
        await env.reset(seed=seed)
        for _ in range(env.max_steps):
            *_, terminated, truncated, info = await env.step(env.expert_action())
            if terminated or truncated:
                break
        assert info["success"], seed


async def test_a_moved_start_solves_the_room_once_and_prices_moves_along_the_plan(monkeypatch):
    """Shaping and the expert reuse the plan the start was moved along: one solve per moved reset."""
    import rollhub.envs.sokoban.env as env_module

    calls = []

    def counting_solve(board, **kwargs):
        calls.append(board.anchor())
        return solve(board, **kwargs)

    monkeypatch.setattr(env_module, "solve", counting_solve)
    env = envs.make(TWO_BOX, solution_start=1.0, progress_reward=0.3, reward="sparse")
    for seed in range(8):
        calls.clear()
        await env.reset(seed=seed)
        start = env.board
        expected = len(solve(start))  # uncounted: the module's own name is patched, not this one
        assert env.distance_to_go(start) == expected
        reward = 0.0
        for _ in range(expected):
            _, r, terminated, _, info = await env.step(env.expert_action())
            reward += r
        assert terminated and info["success"]
        assert len(calls) == 1, (seed, len(calls))  # the room as drawn; nothing after it
        assert reward == pytest.approx(1.0 + 0.3 * expected)  # each optimal move priced one move closer


async def test_hand_made_boards_are_played_as_given():
    env = SokobanEnv(solution_start=1.0)
    await env.reset(options={"board": "######\n#PX_O#\n######"})
    assert env.distance_to_go(env.board) == 2


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "half", None])
def test_invalid_shares_are_refused(bad):
    with pytest.raises(ValueError, match="solution_start must be"):
        SokobanEnv(solution_start=bad)


@pytest.mark.parametrize("bad", [[0, 5], [6, 5], [3], [1, 2, 3], "8-12", 8, [1.5, 4], [True, 4]])
def test_invalid_bands_are_refused(bad):
    with pytest.raises(ValueError, match="solution_start_distance must be"):
        SokobanEnv(solution_start=0.5, solution_start_distance=bad)


async def test_a_position_on_a_known_plan_keeps_its_distance_when_its_own_solve_would_give_up(monkeypatch):
    """The plan cache's one behaviour change: a position whose own solve hits the solver's state
    cap (None, read as dead) gets the distance of the plan it lies on, when one is known."""
    import rollhub.envs.sokoban.env as env_module

    env = SokobanEnv(progress_reward=0.3)
    await env.reset(seed=3)
    start = env.board
    plan = solve(start)
    assert plan and len(plan) >= 3
    middle, _ = start.try_move(plan[0])
    middle, _ = middle.try_move(plan[1])
    real_solve = env_module.solve
    monkeypatch.setattr(
        env_module, "solve", lambda b, **kw: None if b.anchor() == middle.anchor() else real_solve(b, **kw)
    )
    assert env.distance_to_go(start) == min(len(plan), env.max_steps)
    assert env.distance_to_go(middle) == min(len(plan) - 2, env.max_steps)  # from the start's plan, not "dead"
    fresh = SokobanEnv(progress_reward=0.3)
    await fresh.reset(seed=3)
    assert fresh.distance_to_go(middle) == fresh.dead_distance  # asked first, it reads as the solver answers
