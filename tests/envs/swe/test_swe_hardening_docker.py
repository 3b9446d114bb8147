"""SWE grading hardened, on real containers: the diff ignores the agent's git set-up, nothing is written
where `git apply` refuses, and what the model breaks is the model's failure (reward 0,
terminated, no `infra_failure`: the rollout layer marks a trajectory INFRA_FAILED only on
that key), while bad tool arguments are tool errors and the episode goes on."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("swebench")

from rollhub.envs.swe.redteam import HOOK_SCRIPT, _new_file_diff  # noqa: E402
from rollhub.envs.swe.tasks import files_in_patch  # noqa: E402

pytestmark = pytest.mark.docker


def call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


async def test_no_fallback_writes_into_git_where_git_apply_refuses(tasks, backend):
    """The red team's external-diff patch: `git apply` refuses .git/hooks, `patch --fuzz` wrote it."""
    from rollhub.envs.swe.grading.evaluate import apply_patch, evaluate_patch

    task = tasks[0]
    forged = _new_file_diff(".git/hooks/post-checkout", HOOK_SCRIPT, "100755")
    async with await backend.start(task.image) as box:
        applied, log = await apply_patch(box, forged)
        assert not applied, log
        probe = await box.exec("test -e .git/hooks/post-checkout || test -e conftest.py", 10, "/testbed")
        assert probe.exit_code != 0, "a fallback wrote the hook"
    outcome = await evaluate_patch(backend, task, forged + task.patch)
    assert outcome.reward == 0.0 and not outcome.infra_failure
    assert "inside .git" in outcome.sanitized.rejected


async def test_honest_fix_survives_a_hostile_git_configuration(tasks, backend):
    """mnemonicPrefix, noprefix, external diff, textconv, renames, hooks and a system
    gitconfig in the agent's container: the diff is still the canonical one and scores 1."""
    from rollhub.envs.swe.env import SWEEnv
    from rollhub.envs.swe.grading.patch_policy import parse_git_diff

    task = tasks[2]
    env = SWEEnv(tasks, backend=backend, max_steps=6)
    await env.reset(options={"instance_id": task.instance_id})
    hostile = "\n".join(
        [
            "set -e",
            "printf '#!/bin/sh\\necho garbage\\n' > /tmp/ext.sh && chmod +x /tmp/ext.sh",
            "git config diff.mnemonicPrefix true && git config diff.noprefix true",
            "git config diff.external /tmp/ext.sh && git config diff.renames copies",
            "git config diff.x.textconv 'tr a-z A-Z' && echo '*.py diff=x' > .git/info/attributes",
            "git config core.hooksPath /tmp && git config --system diff.mnemonicPrefix true",
            "git config --system diff.srcPrefix z/ || true",
        ]
    )
    _, _, _, _, info = await env.step(call("bash", command=hostile))
    assert info["action_valid"]
    _, _, _, _, info = await env.step(env._expert_plan[0])
    from rollhub.envs.swe.grading.evaluate import extract_diff

    diff = await extract_diff(env._box, task)
    assert [s.path for s in parse_git_diff(diff)] == files_in_patch(task.patch)
    assert diff.startswith(f"diff --git a/{files_in_patch(task.patch)[0]} b/")
    _, reward, terminated, _, info = await env.step(call("submit"))
    assert terminated and reward == 1.0, info
    await env.close()


async def test_killing_pid_1_is_never_infra(tasks, backend):
    """`kill 1` / `kill -9 -1`: where the sandbox lets a command take the container down, the
    episode ends as the model's failure; where it cannot (init under another uid, no
    CAP_KILL), the episode goes on. Never an infra failure, never a reward."""
    from rollhub.envs.swe.env import SWEEnv

    env = SWEEnv(tasks, backend=backend, max_steps=5)
    await env.reset(seed=0)
    _, reward, terminated, truncated, info = await env.step(call("bash", command="kill -TERM 1; sleep 3; kill -9 -1"))
    assert "infra_failure" not in info and reward == 0.0 and not truncated
    if terminated:
        assert "stopped answering" in info["model_failure"]
    else:
        _, reward, terminated, _, info = await env.step(call("submit"))
        assert terminated and reward == 0.0 and "infra_failure" not in info
    await env.close()


@pytest.mark.slow
async def test_a_container_broken_from_inside_is_the_models_failure(tasks, backend):
    """A `timeout` binary that never returns: the backend removes the container after the
    deadline and raises SandboxError; the engine still works, so the model is to blame."""
    from rollhub.envs.swe.env import SWEEnv

    env = SWEEnv(tasks, backend=backend, max_steps=5)
    await env.reset(seed=0)
    # `timeout` runs this very command ("text file busy"): unlink it, then write the new one
    script = "T=$(command -v timeout) && rm -f $T && printf '#!/bin/sh\\nexec sleep 100000\\n' > $T && chmod +x $T"
    _, reward, terminated, _, info = await env.step(call("bash", command=script))
    assert terminated and reward == 0.0, info
    assert "infra_failure" not in info and "stopped answering" in info["model_failure"]
    await env.close()


async def test_removing_git_before_submit_is_the_models_failure(tasks, backend):
    from rollhub.envs.swe.env import SWEEnv

    env = SWEEnv(tasks, backend=backend, max_steps=5)
    await env.reset(seed=1)
    _, _, terminated, _, info = await env.step(call("bash", command="rm -rf .git"))
    assert not terminated and info["action_valid"]
    _, reward, terminated, _, info = await env.step(call("submit"))
    assert terminated and reward == 0.0
    assert "infra_failure" not in info and ".git" in info["model_failure"]
    await env.close()


async def test_bad_timeouts_and_escaping_symlinks_are_tool_errors(tasks, backend):
    from rollhub.envs.swe.env import SWEEnv

    env = SWEEnv(tasks, backend=backend, max_steps=20)
    task = tasks[0]
    await env.reset(options={"instance_id": task.instance_id})
    for bad in (float("nan"), float("inf"), -1, 0, True, "10"):
        obs, reward, terminated, _, info = await env.step(call("bash", command="echo hi", timeout_s=bad))
        assert not terminated and not info["action_valid"] and "timeout_s" in obs[0]["content"], bad
        assert "infra_failure" not in info
    obs, _, _, _, info = await env.step(call("bash", command="echo hi", timeout_s=10**400))  # capped, runs
    assert info["action_valid"] and obs[0]["content"].startswith("hi")
    links = "ln -s /etc/passwd pw.py && ln -s /etc etc_dir && ln -s inside.txt in_link && echo hello > inside.txt"
    obs, _, _, _, info = await env.step(call("bash", command=links))
    assert info["action_valid"], obs
    for arguments in (
        {"command": "view", "path": "pw.py"},
        {"command": "view", "path": "/testbed/pw.py"},
        {"command": "str_replace", "path": "pw.py", "old_str": "root", "new_str": "toor"},
        {"command": "insert", "path": "pw.py", "insert_line": 0, "new_str": "x"},
        {"command": "create", "path": "etc_dir/rollhub_new", "file_text": "x"},
        {"command": "view", "path": "etc_dir"},
    ):
        obs, _, terminated, _, info = await env.step(call("str_replace_editor", **arguments))
        assert not terminated and not info["action_valid"] and "outside the repository" in obs[0]["content"], obs
    obs, _, _, _, info = await env.step(call("str_replace_editor", command="view", path="in_link"))
    assert info["action_valid"] and "hello" in obs[0]["content"]  # a link inside the repository is followed
    obs, _, _, _, info = await env.step(call("bash", command="cat /etc/passwd | head -1"))
    assert obs[0]["content"].startswith("root:"), "the editor must not have changed it"
    await env.close()


async def test_patched_code_that_attacks_the_grading_container_scores_zero_not_infra(tasks, backend):
    """Library code that kills PID 1 / every process when the tests import it: reward 0,
    never infra (the model's failure if it takes the grading container down)."""
    from rollhub.envs.swe.env import SWEEnv

    task = tasks[0]
    source = files_in_patch(task.patch)[0]
    code = (
        "import os as _os, signal as _signal\n"
        "for _target in (1, -1):\n"
        "    try:\n"
        "        _os.kill(_target, _signal.SIGKILL if _target < 0 else _signal.SIGTERM)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    env = SWEEnv(tasks, backend=backend, max_steps=5)
    await env.reset(options={"instance_id": task.instance_id})
    await env.step(env._expert_plan[0])  # the real fix, plus the sabotage
    _, _, _, _, info = await env.step(call("bash", command=f"cat >> {source} <<'EOF'\n{code}EOF"))
    assert info["action_valid"]
    _, reward, terminated, _, info = await env.step(call("submit"))
    assert terminated and reward == 0.0 and "infra_failure" not in info, info
    # the content rule now refuses the module before it runs (os.kill, signal are new in it); the
    # same sabotage at run time is the red team's infra-escape class (`redteam/infra_escape.py`)
    assert any("interpreter internals" in why for why in info["dropped_files"].values()), info
    await env.close()
