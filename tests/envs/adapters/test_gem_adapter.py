"""GEM envs through the adapter, against the real `gem-llm` package (a game and a math env)."""

from __future__ import annotations

import numpy as np
import pytest

gem = pytest.importorskip("gem")
datasets = pytest.importorskip("datasets")

from rollhub.envs import make  # noqa: E402
from rollhub.envs.checker import EnvCheckError, check_env  # noqa: E402
from rollhub.envs.registry import source_of, spec  # noqa: E402

SOKOBAN = "gem:game:Sokoban-v0-easy"


async def test_sokoban_passes_check_env_and_names_its_source():
    assert await check_env(SOKOBAN) == []
    assert source_of(SOKOBAN) == "gem" and spec(SOKOBAN).extra == "gem"


async def test_sokoban_scripted_play_reaches_the_goal_and_pins_the_mapping():
    env = make(SOKOBAN)
    _, info = await env.reset(seed=3)
    start = info["anchor"]
    assert env.max_steps == 20  # GEM's max_turns for the easy setting
    # no \boxed{}: never reaches GEM (GEM would end the episode), the state stays
    obs, reward, terminated, truncated, info = await env.step("I push up")
    assert (reward, terminated, truncated, info["format_ok"], info["anchor"]) == (0.0, False, False, False, start)
    # a scripted policy: breadth-first search on GEM's own room state (the adapter does not solve)
    plan = _solve(env.gem_env)
    total, done = 0.0, False
    for move in plan:
        obs, reward, terminated, truncated, info = await env.step(f"I go \\boxed{{{move}}}")
        total += reward
        done = terminated or truncated
        if done:
            break
    assert terminated and not truncated and info["success"] and total == 1.0
    await env.close()
    await env.close()


async def test_sokoban_turn_limit_is_termination_not_truncation():
    """GEM sets both flags at its turn limit and pays a soft terminal reward: we report terminated."""
    env = make(SOKOBAN, max_turns=3, max_steps=3)
    await env.reset(seed=3)
    results = [await env.step("\\boxed{left}") for _ in range(3)]
    _, _, terminated, truncated, info = results[-1]
    assert terminated and not truncated and info["success"] is False
    assert not any(r[2] or r[3] for r in results[:-1])
    await env.close()


async def test_gem_math_with_a_dataset_built_here():
    rows = [{"problem": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(1, 9)]
    # GEM grades in a one-process pool (its in-thread grader needs the main thread: signals)
    kwargs = {"dataset": datasets.Dataset.from_list(rows)}
    assert await check_env("gem:math:GSM8K", env_kwargs=kwargs, hack_seeds=0) == []  # the contract
    # GEM's own grader evaluates what is boxed: the question's "a + a" echoed in \boxed{} scores 1
    with pytest.raises(EnvCheckError, match="hackability 1.00 .*best exploit 'boxed_untagged'"):
        await check_env("gem:math:GSM8K", env_kwargs=kwargs, hack_seeds=4)
    env = make("gem:math:GSM8K", **kwargs)
    obs, info = await env.reset(seed=0)
    question = obs[-1]["content"]
    a = int(question.split("What is ")[1].split(" +")[0])
    assert env.max_steps == 1
    _, reward, terminated, truncated, info = await env.step(f"so \\boxed{{{2 * a}}}")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    await env.reset(seed=0)
    _, reward, terminated, _, info = await env.step(f"\\boxed{{{2 * a + 1}}}")
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    await env.close()


async def test_reasoning_gym_math_is_seeded():
    first = make("gem:rg:basic_arithmetic")
    second = make("gem:rg:basic_arithmetic")
    assert (await first.reset(seed=5))[0] == (await second.reset(seed=5))[0]
    assert first.task_key() == second.task_key()


def test_unknown_gem_id_is_a_user_error():
    from rollhub.core.errors import UserError

    with pytest.raises(UserError, match="unknown GEM id"):
        make("gem:game:NoSuchGame-v0")


def _solve(gem_env) -> list[str]:
    """Shortest push plan by BFS over (player, boxes) on GEM's own arrays."""
    from collections import deque

    fixed, state = gem_env.room_fixed, gem_env.room_state
    walls = {tuple(p) for p in np.argwhere(fixed == 0)}
    targets = {tuple(p) for p in np.argwhere(fixed == 2)}
    boxes = frozenset(tuple(p) for p in np.argwhere(np.isin(state, (3, 4))))
    start = (tuple(gem_env.player_position), boxes)
    moves = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    queue, seen = deque([(start, [])]), {start}
    while queue:
        (player, boxes), path = queue.popleft()
        if boxes <= targets:
            return path
        for name, (dr, dc) in moves.items():
            nxt = (player[0] + dr, player[1] + dc)
            if nxt in walls:
                continue
            new_boxes = boxes
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in boxes:
                    continue
                new_boxes = (boxes - {nxt}) | {beyond}
            key = (nxt, new_boxes)
            if key not in seen:
                seen.add(key)
                queue.append((key, path + [name]))
    raise AssertionError("room has no solution")
