"""SWE-v0 on real containers: grading of gold / empty / wrong / test-editing patches, a
scripted agent episode through the env API, check_env, infra failures.

Needs a Docker engine and the shipped task images (`rollhub swe build-images
rollhub/envs/swe/data/tasks.jsonl`, which `.ci/run` does); otherwise skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

pytest.importorskip("swebench")

from rollhub.envs.checker import check_env, docker_available  # noqa: E402

pytestmark = pytest.mark.docker


def _task_per_package(tasks):
    seen = {}
    for task in tasks:
        seen.setdefault(task.repo, task)
    return list(seen.values())


async def test_gold_patch_scores_one_and_empty_patch_zero(tasks, backend):
    from rollhub.envs.swe.grading.evaluate import evaluate_patch

    chosen = _task_per_package(tasks)
    golds = await asyncio.gather(*[evaluate_patch(backend, t, t.patch) for t in chosen])
    empties = await asyncio.gather(*[evaluate_patch(backend, t, "") for t in chosen])
    for task, gold, empty in zip(chosen, golds, empties):
        assert gold.reward == 1.0, (task.instance_id, gold.grade.status, gold.log[-2000:])
        assert gold.grade.pass_fraction == 1.0
        assert set(gold.grade.tests) == set(task.fail_to_pass) | set(task.pass_to_pass)
        assert empty.reward == 0.0 and empty.patch_applied and not empty.infra_failure
        assert all(empty.grade.tests[t] == "FAILED" for t in task.fail_to_pass)
        assert empty.grade.pass_fraction == pytest.approx(
            len(task.pass_to_pass) / (len(task.pass_to_pass) + len(task.fail_to_pass))
        )


def _swap_added_and_removed(patch: str) -> list[tuple[str, str]]:
    """(old_str, new_str) per hunk of a unified diff: what the gold fix replaces."""
    pairs = []
    for hunk in re.split(r"(?m)^@@[^\n]*\n", patch)[1:]:
        old, new = [], []
        for line in hunk.splitlines(keepends=True):
            if line.startswith("diff --git"):
                break
            if line.startswith(("-", " ")):
                old.append(line[1:])
            if line.startswith(("+", " ")):
                new.append(line[1:])
        pairs.append(("".join(old), "".join(new)))
    return pairs


def _comment_only_patch(gold: str) -> str:
    """A diff that touches the gold patch's first hunk but only adds a comment: the right
    place, no fix (with context lines, as git writes it: `git apply` needs them)."""
    from rollhub.envs.swe.grading.patch_policy import parse_git_diff

    section = parse_git_diff(gold)[0]
    hunk = section.hunks[0]
    old = [line[1:] for line in hunk.lines if line[:1] in (" ", "-")]
    body = [" " + old[0], "+# looked at this file", *(" " + line for line in old[1:])]
    header = f"@@ -{hunk.old_start},{len(old)} +{hunk.old_start},{len(old) + 1} @@"
    path = section.path
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n{header}\n" + "\n".join(body) + "\n"


async def test_wrong_patch_and_test_edits_score_zero(tasks, backend):
    from rollhub.envs.swe.grading.evaluate import drop_test_files, evaluate_patch

    task = tasks[0]
    # a "fix" that changes the right file but not the bug
    wrong = _comment_only_patch(task.patch)
    outcome = await evaluate_patch(backend, task, wrong)
    assert outcome.patch_applied and outcome.reward == 0.0 and not outcome.infra_failure
    # deleting the failing tests is not a fix: test files are dropped from the agent's diff
    test_file = task.fail_to_pass[0].split("::")[0]
    cheat = f"diff --git a/{test_file} b/{test_file}\ndeleted file mode 100644\n"
    assert drop_test_files(cheat) == ""
    outcome = await evaluate_patch(backend, task, drop_test_files(cheat + task.patch))
    assert outcome.reward == 1.0  # the real fix in the same diff still counts


async def test_scripted_agent_episode_view_edit_submit(tasks, backend):
    from rollhub.envs.swe.env import SWEEnv
    from rollhub.envs.swe.tasks import files_in_patch

    env = SWEEnv(tasks, backend=backend, max_steps=10)
    task = tasks[1 % len(tasks)]
    obs, info = await env.reset(options={"instance_id": task.instance_id})
    assert obs[0]["role"] == "system" and "submit" in obs[0]["content"]
    assert "Failing test" in obs[1]["content"] and info["anchor"][0] == task.instance_id
    path = files_in_patch(task.patch)[0]

    def call(name, **arguments):
        return "I will look.\n<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

    obs, reward, terminated, truncated, info = await env.step(
        call("bash", command="git log --oneline | wc -l && git status --short")
    )
    assert obs[0]["content"].startswith("1\n") and info["action_valid"]  # one squashed commit, clean tree
    start_anchor = info["anchor"]
    obs, *_ = await env.step(call("str_replace_editor", command="view", path=path, view_range=[1, 5]))
    assert re.match(r"\s+1\t", obs[0]["content"])
    obs, reward, terminated, truncated, info = await env.step(
        call("str_replace_editor", command="str_replace", path=path, old_str="no such text anywhere", new_str="x")
    )
    assert not info["action_valid"] and info["format_ok"] and "0 times" in obs[0]["content"]
    for old, new in _swap_added_and_removed(task.patch):
        obs, reward, terminated, truncated, info = await env.step(
            call("str_replace_editor", command="str_replace", path=path, old_str=old, new_str=new)
        )
        assert info["action_valid"], obs[0]["content"]
    assert info["anchor"] != start_anchor  # the repository state changed
    obs, reward, terminated, truncated, info = await env.step(call("bash", command="sleep 5", timeout_s=1))
    assert "timed out" in obs[0]["content"]
    obs, reward, terminated, truncated, info = await env.step(call("submit"))
    assert terminated and not truncated and reward == 1.0 and info["success"], obs
    assert info["pass_fraction"] == 1.0 and all(v == "PASSED" for v in info["tests"].values())
    await env.close()


async def test_step_limit_truncates_without_score(tasks, backend):
    from rollhub.envs.swe.env import SWEEnv

    env = SWEEnv(tasks, backend=backend, max_steps=2)
    await env.reset(seed=0)
    _, _, terminated, truncated, _ = await env.step("no tool call here")
    assert not terminated and not truncated
    _, reward, terminated, truncated, info = await env.step(env.expert_action())
    assert truncated and not terminated and reward == 0.0 and info["truncated_by"] == "step_limit"
    await env.close()


async def test_check_env_and_expert(tasks, backend):
    from rollhub.envs.swe.env import SWEEnv

    await check_env(SWEEnv(tasks[:2], backend=backend))
    env = SWEEnv(tasks, backend=backend)
    await env.reset(seed=len(tasks) - 1)
    rewards = []
    for _ in range(2):
        _, reward, terminated, _, info = await env.step(env.expert_action())
        rewards.append(reward)
    assert terminated and rewards == [0.0, 1.0] and info["success"]
    await env.close()


async def test_missing_image_is_an_infra_failure_not_a_score(tasks, backend):
    import dataclasses

    from rollhub.envs.swe.env import SWEEnv
    from rollhub.envs.swe.grading.evaluate import evaluate_patch

    ghost = dataclasses.replace(tasks[0], image="rollhub/no-such-image:latest")
    outcome = await evaluate_patch(backend, ghost, ghost.patch)
    assert outcome.infra_failure and outcome.reward == 0.0
    env = SWEEnv([ghost], backend=backend)
    _, info = await env.reset(seed=0)
    assert "infra_failure" in info
    await env.close()


@pytest.mark.slow
async def test_official_harness_agrees_with_our_reward(tasks, backend, tmp_path):
    """swebench's own run_instance on the same local images gives the same verdicts
    (gold resolved, empty not). `rollhub bench swe` does this for the whole set."""
    from rollhub.bench.swe import official_verdicts
    from rollhub.envs.swe.grading.evaluate import evaluate_patch

    chosen = _task_per_package(tasks)[:2]
    patches = {t.instance_id: {"gold": t.patch, "empty": ""} for t in chosen}
    official = await asyncio.to_thread(official_verdicts, chosen, patches, tmp_path)
    for task in chosen:
        for name, patch in patches[task.instance_id].items():
            ours = await evaluate_patch(backend, task, patch)
            assert official[(task.instance_id, name)] is (ours.reward == 1.0), (task.instance_id, name)
        assert official[(task.instance_id, "gold")] is True


@pytest.mark.slow
def test_make_tasks_on_a_package_not_in_the_shipped_set(tmp_path):
    """The factory end to end on a package it has not seen (downloads from PyPI)."""
    if not docker_available():
        pytest.skip("no Docker engine answers")
    from rollhub.cli import main
    from rollhub.envs.swe.tasks import load_tasks

    out = tmp_path / "tasks.jsonl"
    assert (
        main(
            [
                "swe",
                "make-tasks",
                "tabulate==0.9.0",
                "--max",
                "2",
                "--out",
                str(out),
                "--workers",
                "2",
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    made = load_tasks(out)
    assert len(made) == 2
    for task in made:
        assert (
            task.fail_to_pass and task.pass_to_pass and task.image.startswith("rollhub/sweb.eval.x86_64.tabulate_1776_")
        )
        assert "diff" not in task.problem_statement and task.fail_to_pass[0] in task.problem_statement
