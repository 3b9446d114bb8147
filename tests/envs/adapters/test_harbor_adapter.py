"""A Harbor task folder built offline on the sandbox's base image, played and graded in Docker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollhub.envs import make
from rollhub.envs.checker import docker_available
from rollhub.sandbox.images import BASE_IMAGE

pytestmark = [pytest.mark.docker, pytest.mark.skipif(not docker_available(), reason="needs a Docker engine")]

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
if python3 -c "import calc; assert calc.add(2, 3) == 5"; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def _task(root: Path) -> Path:
    task = root / "fix-add"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("calc.add returns the wrong value. Fix it.\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 300\n')
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nWORKDIR /app\nRUN printf 'def add(a, b):\\n    return a - b\\n' > /app/calc.py\n"
    )
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "solution" / "solve.sh").write_text("sed -i 's/a - b/a + b/' /app/calc.py\n")
    return task


def _call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    return _task(tmp_path_factory.mktemp("harbor"))


async def test_expert_solution_scores_one(task):
    env = make(f"harbor:{task}")
    obs, info = await env.reset(seed=0)
    assert "calc.add" in obs[-1]["content"] and env.tools and env._workdir == "/app"
    _, reward, terminated, _, step_info = await env.step(env.expert_action())
    assert reward == 0.0 and not terminated and step_info["anchor"] != info["anchor"]
    _, reward, terminated, truncated, step_info = await env.step(env.expert_action())
    assert (reward, terminated, truncated, step_info["success"]) == (1.0, True, False, True)
    await env.close()
    await env.close()


@pytest.mark.parametrize(
    "attack",
    [
        "echo 1 > /logs/verifier/reward.txt",  # forge the reward file in the agent's container
        "mkdir -p /tests && printf 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh",  # plant a verifier
        "printf 'import sys; sys.exit(0)' > /app/sitecustomize.py; echo 1 > /app/reward.txt",  # junk in the workdir
    ],
)
async def test_forged_results_score_zero(task, attack):
    env = make(f"harbor:{task}")
    await env.reset(seed=0)
    await env.step(_call("bash", command=attack))
    _, reward, terminated, _, info = await env.step(_call("submit"))
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    await env.close()


async def test_refused_calls_keep_the_state(task):
    env = make(f"harbor:{task}")
    _, info = await env.reset(seed=0)
    for bad, format_ok in [("just text", False), (_call("rm_rf"), True), ("<tool_call>{oops</tool_call>", True)]:
        _, reward, terminated, _, step = await env.step(bad)
        assert (reward, terminated, step["action_valid"], step["format_ok"]) == (0.0, False, False, format_ok)
        assert step["anchor"] == info["anchor"]
    await env.close()


def test_not_a_task_folder_is_a_user_error(tmp_path):
    from rollhub.core.errors import UserError

    with pytest.raises(UserError, match="not a Harbor task folder"):
        make(f"harbor:{tmp_path}")


@pytest.mark.slow  # ~40 s: three graded episodes on a real SWE task image
async def test_factory_task_round_trips_through_harbor_format(tmp_path):
    """A task of our SWE factory, exported as a Harbor folder and read back, grades in a container:
    the gold patch scores 1, an empty submit and a rewritten test file score 0."""
    from rollhub.envs.adapters.harbor import HarborTask, export_swe_task
    from rollhub.envs.swe.tasks import SHIPPED_TASKS, load_tasks

    swe_task = load_tasks(SHIPPED_TASKS)[0]
    folder = export_swe_task(swe_task, tmp_path)
    read_back = HarborTask(folder)
    assert read_back.instruction.strip() == swe_task.problem_statement.strip()
    assert read_back.verifier_timeout_s == 600
    env = make(f"harbor:{folder}")
    await env.reset(seed=0)
    await env.step(env.expert_action())  # solution/solve.sh: the gold patch
    _, reward, terminated, _, info = await env.step(env.expert_action())
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    await env.reset(seed=0)
    _, reward, _, _, _ = await env.step(_call("submit"))
    assert reward == 0.0
    await env.reset(seed=0)
    test_file = swe_task.fail_to_pass[0].split("::")[0]
    await env.step(_call("bash", command=f"printf 'def test_ok():\\n    pass\\n' > {test_file}"))
    _, reward, _, _, _ = await env.step(_call("submit"))
    assert reward == 0.0  # the eval script restores the test files before running them
    await env.close()
