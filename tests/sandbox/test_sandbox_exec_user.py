"""One command as another user than the sandbox's (`exec(..., user=)`), against the real engine.

A grader runs the code under test as the sandbox's non-root user and keeps its own files as
root: neither side, having no capabilities, can rewrite what the other owns.
"""

from __future__ import annotations

import pytest

IMAGE = "rollhub/base:bookworm"


@pytest.fixture(scope="module")
def agent_image(docker_client, tmp_path_factory):
    from rollhub.sandbox import images

    source = tmp_path_factory.mktemp("work")
    (source / "code.py").write_text("x = 1\n")
    tag = images.build_layered_image(
        docker_client,
        IMAGE,
        {"/work": str(source)},
        [],
        "rollhub/pytest-exec-user",
        workdir="/work",
        sandbox_user="agent",
    )
    yield tag
    docker_client.api.remove_image(tag, force=True)


@pytest.mark.docker
async def test_a_command_as_root_and_the_sandbox_user_cannot_rewrite_each_others_files(docker_backend, agent_image):
    async with await docker_backend.start(agent_image) as box:
        assert (await box.exec("id -un", timeout_s=10)).output == "agent\n"
        root = await box.exec(
            "id -u; echo $HOME; umask 077; mkdir /tmp/grader && echo secret > /tmp/grader/log", 10, user="root"
        )
        assert root.ok and root.output.split() == ["0", "/root"], root.output
        assert (await box.exec("id -u", timeout_s=10, user="agent")).output == "1000\n"
        assert (await box.exec("id -u", timeout_s=10, user="auto")).output == "1000\n"
        # The sandbox user can neither read, replace nor remove root's folder (sticky /tmp).
        attack = await box.exec(
            "cat /tmp/grader/log; echo forged > /tmp/grader/log; rm -rf /tmp/grader; mv /tmp/grader /tmp/x; "
            "ls /tmp/grader",
            timeout_s=10,
        )
        assert "secret" not in attack.output and "Permission denied" in attack.output
        assert (await box.exec("cat /tmp/grader/log", timeout_s=10, user="root")).output == "secret\n"
        # Root without capabilities cannot write the sandbox user's files either.
        blocked = await box.exec("echo y = 2 >> /work/code.py", timeout_s=10, user="root")
        assert blocked.exit_code != 0 and "Permission denied" in blocked.output
        assert (await box.exec("echo y = 2 >> /work/code.py && cat code.py", 10)).output == "x = 1\ny = 2\n"
        # A root command's leftovers are swept with it; the user's shell survives root's sweep.
        await box.exec("sleep 300 & disown; echo started", timeout_s=10, user="root")
        procs = await box.exec("ps -eo user,args 2>/dev/null || cat /proc/[0-9]*/cmdline", timeout_s=10)
        assert "sleep 300" not in procs.output.replace("\0", " ")
        assert (await box.exec("echo still here", timeout_s=10)).output == "still here\n"


@pytest.mark.docker
async def test_an_unknown_user_for_one_command_is_a_clear_error(docker_backend, agent_image):
    from rollhub.sandbox.docker_backend import SandboxConfigError

    async with await docker_backend.start(agent_image) as box:
        with pytest.raises(SandboxConfigError, match="no-such-user"):
            await box.exec("true", timeout_s=10, user="no-such-user")
        assert (await box.exec("echo ok", timeout_s=10)).output == "ok\n"
