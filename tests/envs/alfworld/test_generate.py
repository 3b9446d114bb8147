"""`rollhub alfworld make-games`: generated games are new, solvable, and play in the env."""

import asyncio
import json

import numpy as np
import pytest

from tests.envs.alfworld.conftest import needs_engine

pytestmark = needs_engine


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from rollhub.cli import main

    out = tmp_path_factory.mktemp("alfworld_games")
    assert main(["alfworld", "make-games", "--n", "6", "--out", str(out), "--seed", "11"]) == 0
    return out


def test_one_game_per_task_type_with_the_engines_own_domain(generated):
    from alfworld.info import ALFRED_PDDL_PATH

    from rollhub.envs.alfworld.games import TASK_TYPES, list_game_dir

    games = list_game_dir(generated)
    assert sorted(g.task_type for g in games) == sorted(TASK_TYPES.values())
    domain = open(ALFRED_PDDL_PATH).read()
    for game in games:
        data = json.loads(game.path.read_text())
        assert data["pddl_domain"] == domain and "UNKNOWN GOAL" not in data["grammar"]
        assert 1 <= len(data["walkthrough"]) <= 30
        traj = json.loads((game.path.parent / "traj_data.json").read_text())
        assert traj["task_type"] == game.task_type and traj["pddl_params"]["object_target"]


async def test_generated_games_are_not_won_at_reset_and_the_walkthrough_wins(generated, pool):
    from rollhub.envs.alfworld.env import ALFWorldEnv

    async def play(index):
        env = ALFWorldEnv(game_dir=str(generated), pool=pool)
        try:
            _, info = await env.reset(options={"game": index})
            assert info["success"] is False
            walkthrough = json.loads(env.game.path.read_text())["walkthrough"]
            rewards = []
            for step, _ in enumerate(walkthrough):
                _, reward, terminated, truncated, info = await env.step(env.expert_action())
                rewards.append(reward)
                assert terminated == (step == len(walkthrough) - 1), env.game.name  # won exactly at the end
            return rewards, info
        finally:
            await env.close()

    results = await asyncio.gather(*(play(i) for i in range(6)))
    for rewards, info in results:
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0 and info["success"] is True


def test_scene_sampling_is_seeded_and_keeps_the_target_out_of_place():
    from rollhub.envs.alfworld.generate import build_scene, problem_text

    for task_type in ("pick_two_obj_and_place", "pick_heat_then_place_in_recep"):
        first = build_scene(task_type, np.random.default_rng(5))
        second = build_scene(task_type, np.random.default_rng(5))
        assert first is not None and problem_text(*first, "p") == problem_text(*second, "p")
        scene, task = first
        classes = dict(scene.receptacles)
        targets = [rid for _, cls, rid in scene.objects if cls == task.object_class]
        assert len(targets) >= (2 if task_type.startswith("pick_two") else 1)
        assert all(classes[rid] != task.receptacle_class for rid in targets)
