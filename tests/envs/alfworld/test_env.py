"""rollhub/ALFWorld-v0 on the real engine: contract, expert, anchors, invalid actions."""

import asyncio

import pytest

from rollhub.envs.base import wrap_action
from tests.envs.alfworld.conftest import needs_engine

pytestmark = needs_engine


def act(command: str) -> str:
    return wrap_action(command, "action")


def first_game_of_each_type():
    from rollhub.envs.alfworld.games import list_games

    seen = {}
    for index, game in enumerate(list_games()):
        seen.setdefault(game.task_type, index)
    return seen


async def play_expert(env, seed):
    obs, info = await env.reset(seed=seed)
    assert info["success"] is False
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = await env.step(env.expert_action())
        total += reward
        steps += 1
        if terminated or truncated:
            return total, steps, terminated, info


async def test_registered_env_follows_the_contract(pool):
    from rollhub.envs import make
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.checker import check_env

    env = make("rollhub/ALFWorld-v0", pool=pool)
    assert isinstance(env, ALFWorldEnv) and env.max_steps == 50 and len(env.games) == 134
    obs, info = await env.reset(seed=3)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert obs[1]["content"].startswith("Your task is to: ") and "Admissible commands: " in obs[1]["content"]
    assert "<action>" in obs[0]["content"]
    await env.close()
    short = ALFWorldEnv(pool=pool, max_steps=6, show_admissible=False)
    assert await check_env(short, seed=5) == []


async def test_expert_wins_one_real_game_of_each_task_type(pool):
    from rollhub.envs.alfworld.env import ALFWorldEnv

    seeds = first_game_of_each_type()
    assert len(seeds) == 6
    envs = [ALFWorldEnv(pool=pool) for _ in seeds]
    try:
        results = await asyncio.gather(*(play_expert(env, seed) for env, seed in zip(envs, seeds.values())))
    finally:
        await asyncio.gather(*(env.close() for env in envs))
    for env, (total, steps, terminated, info) in zip(envs, results):
        walkthrough_len = len(__import__("json").loads(env.game.path.read_text())["walkthrough"])
        assert terminated and info["success"] is True and total == 1.0, env.game.name
        assert steps == walkthrough_len
        assert "infra_failure" not in info


async def test_anchor_is_history_free_and_tells_lookalike_texts_apart(pool):
    from rollhub.envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(pool=pool)
    _, info = await env.reset(
        options={"game": "look_at_obj_in_light-AlarmClock-None-DeskLamp-308/trial_T20190908_222917_366542"}
    )
    start = info["anchor"]
    obs, _, _, _, info = await env.step(act("look"))
    assert info["anchor"] == start  # looking around records nothing about the state
    await env.step(act("go to desk 2"))
    empty_handed_look, _, _, _, empty_info = await env.step(act("look"))
    await env.step(act("take alarmclock 1 from desk 2"))
    holding_look, _, _, _, holding_info = await env.step(act("look"))
    assert empty_handed_look[0]["content"].split("\n\n")[0] == holding_look[0]["content"].split("\n\n")[0]
    assert empty_info["anchor"] != holding_info["anchor"] and "holds=alarmclock 1" in holding_info["anchor"]
    await env.step(act("go to desk 1"))
    _, _, _, _, back = await env.step(act("go to desk 2"))
    assert back["anchor"] == holding_info["anchor"]  # same state by another path, same key
    await env.close()


async def test_invalid_actions_change_nothing_and_count_towards_the_limit(pool):
    from rollhub.envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(pool=pool, max_steps=3, invalid_action_reward=-0.1)
    _, info = await env.reset(seed=0)
    obs, reward, terminated, truncated, step_info = await env.step("go to desk 2")  # no tag
    assert (step_info["format_ok"], step_info["action_valid"], reward) == (False, False, -0.1)
    assert step_info["anchor"] == info["anchor"] and "Nothing happens" in obs[0]["content"]
    obs, reward, terminated, truncated, step_info = await env.step(act("fly to the moon"))
    assert (step_info["format_ok"], step_info["action_valid"]) == (True, False)
    assert "not an admissible command" in obs[0]["content"] and step_info["anchor"] == info["anchor"]
    obs, reward, terminated, truncated, step_info = await env.step(act("  Go to  Desk 2. "))  # normalised
    assert step_info["action_valid"] is True and "You arrive at desk 2" in obs[0]["content"]
    assert truncated is True and terminated is False and step_info["success"] is False
    with pytest.raises(RuntimeError, match="reset"):
        await env.step(act("look"))
    await env.close()


async def test_expert_replans_with_the_planner_after_a_detour(pool):
    from rollhub.envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(pool=pool)
    await env.reset(seed=0)
    assert env.expert_action() == act("go to desk 2")  # the walkthrough's first step
    await env.step(act("go to bed 1"))  # off the walkthrough
    assert env.expert_action() != act("go to bed 1")
    total = 0.0
    for _ in range(10):
        _, reward, terminated, truncated, info = await env.step(env.expert_action())
        total += reward
        if terminated or truncated:
            break
    assert terminated and info["success"] is True and total == 1.0
    await env.close()


async def test_on_demand_expert_needs_to_be_asked_before_leaving_the_walkthrough(pool):
    from rollhub.envs.alfworld.env import ALFWorldEnv

    lazy = ALFWorldEnv(pool=pool)
    await lazy.reset(seed=0)
    await lazy.step(act("go to bed 1"))
    with pytest.raises(RuntimeError, match="expert_plan='always'"):
        lazy.expert_action()
    await lazy.close()
    eager = ALFWorldEnv(pool=pool, expert_plan="always")
    await eager.reset(seed=0)
    await eager.step(act("go to bed 1"))
    assert eager.expert_action().startswith("<action>go to ")
    await eager.close()


async def test_same_seed_same_game_and_a_seeded_random_agent(pool):
    import numpy as np

    from rollhub.envs.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(pool=pool, task_types=[5])
    first, info = await env.reset(seed=4)
    game = env.game
    assert game.task_type == "pick_cool_then_place_in_recep"
    again, _ = await env.reset(seed=4 + len(env.games))
    assert env.game == game and again == first
    action = env.random_action(np.random.default_rng(0))
    assert action.startswith("<action>") and action[len("<action>") : -len("</action>")] in first[1]["content"]
    await env.close()


async def test_index_actions_pick_a_listed_command_and_refuse_anything_else(pool):
    from rollhub.core.errors import UserError
    from rollhub.envs.alfworld.env import ALFWorldEnv

    with pytest.raises(UserError, match="show_admissible"):
        ALFWorldEnv(pool=pool, action_format="index", show_admissible=False)
    env = ALFWorldEnv(pool=pool, action_format="index", max_steps=50)
    obs, info = await env.reset(seed=0)
    listed = obs[-1]["content"].split("Admissible commands:\n", 1)[1].splitlines()
    assert listed[0].startswith("1 ") and [line.split(" ", 1)[1] for line in listed] == env._admissible
    n = len(listed)
    # a spelled-out command is refused too, even one that is admissible right now
    for hostile in ("0", str(n + 1), "07", "1.5", "-1", " 1 1", env._admissible[0], "99999999999999"):
        obs, reward, terminated, truncated, step = await env.step(act(hostile))
        assert (step["format_ok"], step["action_valid"]) == (True, False), hostile
        assert step["anchor"] == info["anchor"] and "Nothing happens" in obs[0]["content"]
    # the expert answers numbers, and its numbers win the game through the same path
    total = 0.0
    while True:
        answer = env.expert_action()
        assert answer.removeprefix("<action>").removesuffix("</action>").isdigit()
        obs, reward, terminated, truncated, step = await env.step(answer)
        total += reward
        if terminated or truncated:
            break
    assert terminated and step["success"] is True and total == 1.0
    await env.close()
