"""The SWE agent's container on real task images: a non-root user with no capabilities, a disk
budget on by default, and a GiGPO anchor that no tool of the container decides.

What the agent tries here is what a policy would: write the interpreter or the venv (by
shell and through the editor, whose file API runs as root in the engine), fill the disk in
each writable folder and all of them, and forge the anchor by replacing hashing tools."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil

import pytest

pytest.importorskip("swebench")

pytestmark = pytest.mark.docker

MiB = 1024 * 1024


def call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _one_per_package(tasks, count):
    seen = {}
    for task in tasks:
        seen.setdefault(task.repo, task)
    return list(seen.values())[:count]


async def _bash(env, command, timeout_s=120):
    obs, reward, terminated, truncated, info = await env.step(call("bash", command=command, timeout_s=timeout_s))
    return obs[-1]["content"], info


@pytest.fixture
def docker_client_swe():
    import docker

    client = docker.from_env()
    yield client
    client.close()


def _free_bytes() -> int:
    return shutil.disk_usage("/var/lib/docker" if os.path.isdir("/var/lib/docker") else "/").free


async def test_the_agent_is_not_root_and_cannot_write_the_interpreter(tasks, backend):
    from rollhub.envs.swe.env import SWEEnv
    from rollhub.envs.swe.factory.images import SWE_USER

    task = tasks[0]
    # No disk budget: the root file system stays writable, so only the user protects it.
    env = SWEEnv(tasks, backend=backend, max_steps=20, disk_mb=None)
    _, info = await env.reset(options={"instance_id": task.instance_id})
    assert "infra_failure" not in info, info
    assert env.task_limits(task).user == SWE_USER
    who, _ = await _bash(env, "id -u; id -un; cat /proc/self/status | grep -E '^(CapEff|NoNewPrivs)'")
    uid, name, cap_eff, no_new_privs = who.split("\n")[:4]
    assert uid != "0" and name == SWE_USER, who
    assert cap_eff.split()[-1] == "0000000000000000" and no_new_privs.split()[-1] == "1"
    site = "$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
    for attack in (
        "touch /usr/bin/evil",
        f"touch {site}/sitecustomize.py",
        f"echo 'import os' >> {site}/rollhub_testbed.pth",
        "echo x >> $(command -v python)",
        "pip install --no-index --find-links /opt/wheelhouse pytest --force-reinstall -q",
        "sudo true || su -c true",
    ):
        out, _ = await _bash(env, attack)
        assert "[exit code 0]" not in out, (attack, out)
    # The editor writes through the engine's archive API (root there): it must refuse too.
    purelib = (await _bash(env, f"echo {site}"))[0].split("\n")[0]
    for arguments in (
        {"command": "create", "path": f"{purelib}/sitecustomize.py", "file_text": "import os\n"},
        {"command": "create", "path": "/usr/local/bin/pytest", "file_text": "#!/bin/sh\nexit 0\n"},
        {"command": "str_replace", "path": f"{purelib}/rollhub_testbed.pth", "old_str": "/testbed", "new_str": "/x"},
        {"command": "insert", "path": "/etc/passwd", "insert_line": 0, "new_str": "x::0:0::/:/bin/sh"},
    ):
        obs, _, _, _, step_info = await env.step(call("str_replace_editor", **arguments))
        assert step_info.get("action_valid") is False or "Error" in obs[-1]["content"], (arguments, obs)
    leftovers, _ = await _bash(env, f"ls {purelib}/sitecustomize.py /usr/local/bin/pytest 2>&1; head -c 1 /etc/passwd")
    assert "No such file" in leftovers and leftovers.count("No such file") == 2 and "\nr" in leftovers
    # ...while the repository is the agent's: edit, create, run the tests.
    source = next(path for path in task.patch.split("\n") if path.startswith("+++ b/"))[6:]
    obs, _, _, _, step_info = await env.step(
        call("str_replace_editor", command="insert", path=source, insert_line=0, new_str="# touched by the agent")
    )
    assert "edited" in obs[-1]["content"], obs
    mode, _ = await _bash(env, f"stat -c '%U %a' {source} && git status --short")
    assert mode.startswith(f"{SWE_USER} 644") and source in mode, mode
    tests, _ = await _bash(env, "python -m pytest -q -x -p no:cacheprovider 2>&1 | tail -3", timeout_s=240)
    assert "passed" in tests or "failed" in tests, tests
    await env.close()


@pytest.mark.slow
async def test_gold_resolves_as_the_non_root_user_with_the_disk_budget(tasks, backend):
    from rollhub.envs.swe.env import DEFAULT_DISK_MB, SWEEnv
    from rollhub.envs.swe.factory.images import SWE_USER

    env = SWEEnv(tasks, backend=backend, max_steps=4)
    assert env.limits.disk_mb == DEFAULT_DISK_MB
    for task in _one_per_package(tasks, 3):
        _, info = await env.reset(options={"instance_id": task.instance_id})
        assert "infra_failure" not in info, info
        who, _ = await _bash(env, "id -un; touch /opt/x")
        assert who.startswith(f"{SWE_USER}\n") and "Read-only file system" in who, who
        terminated = False
        while not terminated:
            _, reward, terminated, truncated, info = await env.step(env.expert_action())
            assert not truncated
        assert reward == 1.0 and info["success"], (task.instance_id, info)
    await env.close()


async def test_the_disk_budget_is_on_by_default(tasks, backend):
    """Every folder the agent can write is a tmpfs of the budget (plus the image's content);
    everything else is read-only (on an engine with quotas, the writable layer has the quota)."""
    from rollhub.envs.swe.env import DEFAULT_DISK_MB, SWEEnv

    env = SWEEnv(tasks, backend=backend, max_steps=4)
    await env.reset(options={"instance_id": tasks[0].instance_id})
    if backend.disk_budget_mode() != "tmpfs":
        pytest.skip("this engine enforces disk_mb with storage-opt")
    out, _ = await _bash(env, "df -m --output=target,size /testbed /tmp /home; touch /opt/x /usr/x /x")
    sizes = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()[1:4]}
    assert set(sizes) == {"/testbed", "/tmp", "/home"}, out
    assert all(DEFAULT_DISK_MB <= size < DEFAULT_DISK_MB + 64 for size in sizes.values()), sizes
    assert out.count("Read-only file system") == 3, out
    await env.close()


@pytest.mark.slow
async def test_writing_past_the_disk_budget_fails_inside_and_spares_the_host(tasks, backend):
    """The default budget (1 GiB): 1.2 GB written by the agent fails with ENOSPC inside the
    container; the host's disk does not move; the episode goes on and is graded."""
    from rollhub.envs.swe.env import SWEEnv

    env = SWEEnv(tasks, backend=backend, max_steps=10)
    _, info = await env.reset(options={"instance_id": tasks[1].instance_id})
    free_before = _free_bytes()
    out, _ = await _bash(env, "for i in 1 2 3 4; do head -c 300M /dev/zero > /testbed/fill$i.bin || exit 9; done")
    assert "No space left on device" in out and "[exit code 9]" in out, out
    spread, _ = await _bash(
        env, "for d in /tmp /home/agent /var/tmp; do head -c 200M /dev/zero > $d/f || echo full; done"
    )
    assert _free_bytes() > free_before - 200 * MiB  # 1.8 GB were attempted
    cleaned, _ = await _bash(env, "rm -f /testbed/fill*.bin /tmp/f /home/agent/f /var/tmp/f && git status --short")
    assert "[exit code 0]" in cleaned
    _, reward, terminated, _, info = await env.step(call("submit"))
    assert terminated and reward == 0.0 and "infra_failure" not in info, info
    await env.close()


@pytest.mark.slow
async def test_filling_every_folder_and_the_memory_is_the_models_failure_never_infra(tasks, backend):
    """A small budget filled in every writable folder at once, plus a memory hog: whatever
    breaks is the model's failure (or a graded 0), never an unscored infra failure."""
    from rollhub.envs.swe.env import SWEEnv

    for finisher in ("submit", "bash"):
        env = SWEEnv(tasks, backend=backend, max_steps=6, disk_mb=48, memory_mb=160)
        await env.reset(options={"instance_id": tasks[2].instance_id})
        free_before = _free_bytes()
        await _bash(
            env,
            "for d in /testbed /tmp /var/tmp /home/agent /root; do head -c 60M /dev/zero > $d/f 2>/dev/null; done; "
            "python -c 'x = bytearray(400 * 2**20)'",
        )
        assert _free_bytes() > free_before - 100 * MiB
        terminated, info = False, {}
        for _ in range(3):
            action = call("submit") if finisher == "submit" else call("bash", command="git status && ls /tmp")
            _, reward, terminated, truncated, info = await env.step(action)
            assert reward == 0.0 and "infra_failure" not in info, info
            if terminated or truncated:
                break
        await env.close()


async def test_the_anchor_is_hashed_on_the_host_whatever_the_container_hashes(tasks, backend):
    """An agent with every power over its container (root that may write any file, no disk
    budget: a writable /usr) replaces every hashing tool and `git hash-object` with ones that
    print a constant: the anchor of the unchanged repository stays what it was, and two
    different edits still differ."""
    from rollhub.envs.swe.env import SWEEnv
    from rollhub.envs.swe.grading.evaluate import extract_diff

    task = tasks[0]
    env = SWEEnv(tasks, backend=backend, max_steps=10, user="root", disk_mb=None)
    env.limits = dataclasses.replace(env.limits, cap_add=("DAC_OVERRIDE", "FOWNER"))
    _, info = await env.reset(options={"instance_id": task.instance_id})
    clean_anchor = info["anchor"][1]
    assert clean_anchor == hashlib.sha256(b"").hexdigest()[:16]
    constant = "0" * 64
    forge = "\n".join(
        [
            "set -e",
            *(
                f"printf '#!/bin/sh\\necho {constant}  -\\n' > /usr/bin/{tool}"
                for tool in ("sha1sum", "sha256sum", "md5sum", "b2sum")
            ),
            "mv /usr/bin/git /usr/bin/git.real",
            'printf \'#!/bin/sh\\n[ "$1" = hash-object ] && { echo '
            + constant[:40]
            + '; exit 0; }\\nexec /usr/bin/git.real "$@"\\n\' > /usr/bin/git',
            "chmod 755 /usr/bin/git",
            "sha256sum /etc/passwd; git hash-object /etc/passwd",
        ]
    )
    out, info = await _bash(env, forge)
    assert out.count(constant[:40]) >= 2 and "[exit code 0]" in out, out
    assert info["anchor"][1] == clean_anchor
    anchors = []
    source = next(path for path in task.patch.split("\n") if path.startswith("+++ b/"))[6:]
    for n in (1, 2):
        _, info = await _bash(env, f"echo '# edit {n}' >> {source}")
        diff = await extract_diff(env._box, task)
        assert info["anchor"][1] == hashlib.sha256(diff.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        anchors.append(info["anchor"][1])
    assert len(set(anchors + [clean_anchor])) == 3
    await env.close()
    # The default agent cannot even try: the tools are root's and the root file system read-only.
    env = SWEEnv(tasks, backend=backend, max_steps=4)
    await env.reset(options={"instance_id": task.instance_id})
    out, _ = await _bash(env, "printf '#!/bin/sh\\necho 0\\n' > /usr/bin/sha1sum || printf '' > /usr/bin/git")
    assert "[exit code 0]" not in out, out
    await env.close()


async def test_a_stale_root_image_is_refused_with_the_fix(tasks, backend, docker_client_swe):
    """An image built before the sandbox user existed (same fixed tag) is refused at reset,
    not run as root, and `build-images` would rebuild it."""
    from rollhub.envs.swe.env import SWEEnv
    from rollhub.envs.swe.factory.images import instance_image_current
    from rollhub.envs.swe.tasks import SweTask

    task = tasks[0]
    stale = "rollhub/sweb.eval.x86_64.pytest_1776_stale-root:latest"
    dockerfile = 'FROM rollhub/base:bookworm\nWORKDIR /testbed\nCMD ["sleep", "infinity"]\n'
    docker_client_swe.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=stale, network_mode="none", rm=True)
    try:
        assert instance_image_current(docker_client_swe, task.image)
        assert not instance_image_current(docker_client_swe, stale)
        row = {**task.row, "image": stale}
        env = SWEEnv([SweTask.from_row(row)], backend=backend)
        _, info = await env.reset(seed=0)
        assert "predates non-root task images" in info["infra_failure"] and "build-images" in info["infra_failure"]
        await env.close()
    finally:
        docker_client_swe.images.remove(stale, force=True)
