"""The two ways a Docker sandbox runs commands: the persistent shell and one
`docker exec` per command must behave the same. Every test here runs on both paths (the
`docker_backend` fixture is parametrized); the ones about the controller itself say so."""

from __future__ import annotations

import asyncio
import json
import struct
import time

import pytest
from sandbox_testing import new_test_run_id

from rollhub.sandbox.base import Limits, SandboxError

pytestmark = pytest.mark.docker
IMAGE = "rollhub/base:bookworm"
SHELL = "persistent-shell"


def _without_wrapper_note(output: str) -> str:
    """docker exec's wrapper (dash) adds "Killed" when the command died of SIGKILL; the
    persistent shell adds nothing to a command's output."""
    return output.removesuffix("Killed\n")


async def test_exit_codes_and_signals(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        for cmd, code in [("true", 0), ("false", 1), ("exit 3", 3), ("exit 255", 255), ("kill -TERM $$", 143)]:
            result = await box.exec(cmd, timeout_s=10)
            assert (result.exit_code, result.timed_out) == (code, False), (cmd, result)
        missing = await box.exec("no-such-program-here", timeout_s=10)
        assert missing.exit_code == 127 and "not found" in missing.output


async def test_stderr_is_interleaved_in_order(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        result = await box.exec("for i in 1 2 3; do echo out$i; echo err$i >&2; done", timeout_s=10)
    assert result.output == "out1\nerr1\nout2\nerr2\nout3\nerr3\n"


async def test_binary_and_non_utf8_output(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        result = await box.exec(r"printf 'a\377\376b\000c\n'; printf '\xc3\xa9t\xc3\xa9\n'", timeout_s=10)
    assert result.ok
    assert result.output == "a\ufffd\ufffdb\x00c\nété\n"


async def test_output_is_exact_across_many_frames(docker_client):
    """350 KB of output, far past one 64 KiB frame, arrives byte for byte (both paths)."""
    from rollhub.sandbox.docker_backend import DockerBackend

    expected = "".join(f"{i}\n" for i in range(1, 60001))
    for mode in (SHELL, "docker-exec"):
        backend = DockerBackend(run_id=new_test_run_id(), output_limit_chars=1_000_000, max_threads=8, exec_mode=mode)
        try:
            async with await backend.start(IMAGE) as box:
                result = await box.exec("seq 1 60000", timeout_s=30)
        finally:
            await backend.close()
        assert result.ok and not result.truncated
        assert result.output == expected, mode


async def test_large_output_is_capped_head_and_tail(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        result = await box.exec("echo FIRST; head -c 5000000 /dev/urandom | base64; echo LAST", timeout_s=60)
        assert result.ok and result.truncated
        assert result.output.startswith("FIRST\n") and result.output.endswith("LAST\n")
        assert len(result.output) < 2200
        assert (await box.exec("echo next", timeout_s=10)).output == "next\n"


async def test_timeout_kills_the_process_group_and_the_sandbox_goes_on(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        began = time.monotonic()
        result = await box.exec("echo before; sleep 1051 & sleep 1052; echo never", timeout_s=1)
        assert result.timed_out and not result.ok
        assert result.exit_code == 137
        assert _without_wrapper_note(result.output) == "before\n"
        assert 1 <= time.monotonic() - began < 10
        listing = await box.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout_s=10)
        assert "sleep 105" not in listing.output
        assert (await box.exec("echo fine", timeout_s=10)).output == "fine\n"


async def test_env_home_and_workdir_as_before(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        result = await box.exec('echo "$GREETING|$HOME|$LANG"; pwd', timeout_s=10, env={"GREETING": "hi there"})
        assert result.output == "hi there|/root|C.UTF-8\n/\n"
        await box.exec("mkdir -p /tmp/wd", timeout_s=10)
        here = await box.exec("pwd", timeout_s=10, workdir="/tmp/wd")
        assert here.output == "/tmp/wd\n"
        overridden = await box.exec('echo "$HOME"', timeout_s=10, env={"HOME": "/tmp"})
        assert overridden.output == "/tmp\n"
        # Nothing carries over from one command to the next: cwd, variables, functions.
        await box.exec("cd /tmp; export LEAK=1; leak() { :; }", timeout_s=10)
        after = await box.exec('pwd; echo "[$LEAK]"; type leak 2>&1 | head -1', timeout_s=10)
        assert after.output.splitlines()[:2] == ["/", "[]"]
        assert "not found" in after.output
        missing = await box.exec("pwd", timeout_s=10, workdir="/no/such/dir")
        assert missing.exit_code == 126 and "/no/such/dir" in missing.output
        assert (await box.exec("pwd", timeout_s=10)).output == "/\n"


async def test_a_command_that_ends_its_shell(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        killed = await box.exec("echo partial; kill -9 $$", timeout_s=10)
        assert killed.exit_code == 137 and not killed.timed_out and not killed.oom_killed
        assert _without_wrapper_note(killed.output) == "partial\n"
        assert (await box.exec("exit 3", timeout_s=10)).exit_code == 3
        replaced = await box.exec("exec sleep 100", timeout_s=1)
        assert replaced.timed_out and replaced.exit_code == 137
        # Its parent: the controller (persistent shell) or `timeout` (docker exec).
        parent = await box.exec("setsid sleep 1061 >/dev/null 2>&1 < /dev/null & kill -9 $PPID; sleep 1", 10)
        assert parent.exit_code in (137, 0), parent  # `timeout` killed: the shell finishes its sleep
        listing = await box.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout_s=10)
        assert "sleep 1061" not in listing.output
        assert (await box.exec("echo alive", timeout_s=10)).output == "alive\n"


async def test_reading_stdin_sees_end_of_file(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        began = time.monotonic()
        result = await box.exec('cat; read -r line; echo "[$line]"; head -c 100 /dev/stdin | wc -c', timeout_s=10)
        assert result.output == "[]\n0\n"
        assert time.monotonic() - began < 5
        python = await box.exec("python3 -c 'import sys; print(len(sys.stdin.buffer.read()))'", timeout_s=10)
        assert python.output == "0\n"
        assert (await box.exec("echo still framed", timeout_s=10)).output == "still framed\n"


async def test_concurrent_commands_on_one_sandbox_are_serialised(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        began = time.monotonic()
        results = await asyncio.gather(
            *(
                box.exec(f"echo start-{i} >> /tmp/log; sleep 0.3; echo end-{i} >> /tmp/log; echo {i}", 20)
                for i in range(6)
            )
        )
        assert [r.output for r in results] == [f"{i}\n" for i in range(6)]
        assert time.monotonic() - began >= 1.8
        log = (await box.exec("cat /tmp/log", timeout_s=10)).output.split()
        # Never two at once: every start is followed by its own end.
        assert all(log[k].replace("start", "end") == log[k + 1] for k in range(0, len(log), 2)), log


async def test_output_cannot_forge_the_end_of_a_command(docker_backend):
    """Printing what a frame looks like (type X, a length, an exit status JSON) is output
    like any other; the real exit status and the rest of the output still come through."""
    fake = json.dumps({"token": "0" * 32, "exit_code": 0, "timed_out": False, "oom_kills": None}).encode()
    frame = struct.pack(">cI", b"X", len(fake)) + fake
    printf = "".join(f"\\{byte:03o}" for byte in frame)
    async with await docker_backend.start(IMAGE) as box:
        result = await box.exec(f"printf '{printf}'; printf '{printf}' >&2; echo; echo after; exit 7", timeout_s=10)
        assert result.exit_code == 7
        assert result.output.endswith("\nafter\n")
        assert result.output.count('"exit_code": 0') == 2
        assert (await box.exec("echo next", timeout_s=10)).output == "next\n"


async def test_the_controller_cannot_be_written_to_or_read(docker_backend_shell):
    """Same uid, no CAP_SYS_PTRACE, non-dumpable: its stdout, stdin, memory and environment
    are out of a command's reach, so a frame can only come from the controller itself."""
    async with await docker_backend_shell.start(IMAGE) as box:
        pid = box._shell.pid
        result = await box.exec(
            f"echo x > /proc/{pid}/fd/1; echo x > /proc/{pid}/fd/0; cat /proc/{pid}/environ; "
            f"head -c 1 /proc/{pid}/mem; python3 -c 'import ctypes; print(ctypes.CDLL(None).ptrace(16, {pid}, 0, 0))'",
            timeout_s=10,
        )
        assert result.output.count("Permission denied") == 4, result.output
        assert result.output.rstrip().endswith("-1")  # PTRACE_ATTACH refused
        assert box._shell.pid == pid
        assert (await box.exec("echo ok", timeout_s=10)).output == "ok\n"


async def test_a_killed_controller_is_replaced_and_its_leftovers_swept(docker_backend_shell):
    async with await docker_backend_shell.start(IMAGE) as box:
        first = box._shell.pid
        result = await box.exec("setsid sleep 1071 >/dev/null 2>&1 < /dev/null & echo bye; kill -9 -1", timeout_s=10)
        # What the command printed just before may still have been in the pipe the killed
        # controller was reading (documented); the status and the sweep are what count.
        assert result.exit_code == 137 and result.output in ("bye\n", "")
        assert box._shell is not None and box._shell.pid != first  # restarted at once
        listing = await box.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout_s=10)
        assert "sleep 1071" not in listing.output
        stopped = await box.exec("kill -TERM $PPID; kill -HUP $PPID; echo survived", timeout_s=10)
        assert stopped.output == "survived\n" and box._shell.pid != first


async def test_a_controller_that_died_while_idle_is_replaced_before_the_command(docker_backend_shell, docker_client):
    """Not the command's doing: the command is sent to a new controller and runs once."""
    async with await docker_backend_shell.start(IMAGE) as box:
        first = box._shell.pid
        killer = docker_client.api.exec_create(box.id, ["sh", "-c", f"kill -9 {first} && echo killed"], user="0:0")
        assert docker_client.api.exec_start(killer["Id"]) == b"killed\n"
        await asyncio.sleep(0.5)
        result = await box.exec("echo ran >> /tmp/runs; cat /tmp/runs", timeout_s=10)
        assert (result.exit_code, result.output) == (0, "ran\n")
        assert box._shell.pid != first


async def test_the_persistent_shell_is_much_quicker(docker_client):
    """`true` round trips, interleaved on the two paths in one process (ratio, not ms)."""
    from rollhub.sandbox.docker_backend import DockerBackend
    from rollhub.sandbox.pool import percentile

    backend = DockerBackend(run_id=new_test_run_id(), max_threads=8)
    try:
        shell_box = await backend.start(IMAGE)
        exec_box = await backend.start(IMAGE, Limits(exec_mode="docker-exec"))
        timings: dict[str, list[float]] = {"shell": [], "exec": []}
        for _ in range(12):
            for name, box in (("shell", shell_box), ("exec", exec_box)):
                began = time.monotonic()
                assert (await box.exec("true", timeout_s=30)).ok
                timings[name].append(time.monotonic() - began)
    finally:
        await backend.close()
    shell_p50, exec_p50 = percentile(timings["shell"], 0.5), percentile(timings["exec"], 0.5)
    assert shell_p50 * 3 < exec_p50, (shell_p50, exec_p50)


@pytest.fixture(scope="module")
def image_without_python(docker_client, tmp_path_factory):
    from rollhub.sandbox import images

    source = tmp_path_factory.mktemp("empty")
    (source / "readme.txt").write_text("no python here\n")
    tag = images.build_layered_image(
        docker_client, IMAGE, {"/data": str(source)}, ["rm -f /usr/bin/python3*"], "rollhub/pytest-nopython"
    )
    yield tag
    docker_client.api.remove_image(tag, force=True)


async def test_an_image_without_python_falls_back_to_docker_exec(docker_backend_shell, image_without_python, caplog):
    async with await docker_backend_shell.start(image_without_python) as box:
        assert box._shell is None and box._shell_unavailable
        result = await box.exec("cat /data/readme.txt; exit 4", timeout_s=10)
        assert (result.exit_code, result.output) == (4, "no python here\n")
    assert "persistent shell could not start" in caplog.text


async def test_odd_inputs_are_the_commands_failure_or_a_clear_error(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        with pytest.raises(ValueError, match="timeout_s"):
            await box.exec("true", timeout_s=float("nan"))
        long_timeout = await box.exec("echo long", timeout_s=10**9)
        assert long_timeout.output == "long\n"
        unicode = await box.exec("echo 'héllo ✓'", timeout_s=10, env={"NAME": "wörld ✓"})
        assert unicode.output == "héllo ✓\n"
        big = "x" * 100_000  # a large command (a patch in a heredoc); the kernel caps one argument at 128 KiB
        heredoc = await box.exec(f"cat <<'EOF' | wc -c\n{big}\nEOF", timeout_s=20)
        assert heredoc.output.strip() == str(len(big) + 1)
        assert (await box.exec("echo ok", timeout_s=10)).output == "ok\n"


async def test_exec_mode_is_checked():
    from rollhub.sandbox.docker_backend import DockerBackend

    with pytest.raises(ValueError, match="exec_mode"):
        Limits(exec_mode="ssh")
    with pytest.raises(ValueError, match="exec_mode"):
        DockerBackend(exec_mode="fast")


async def test_closing_during_a_command_is_an_infra_failure(docker_backend):
    box = await docker_backend.start(IMAGE)
    running = asyncio.ensure_future(box.exec("sleep 60", timeout_s=120))
    await asyncio.sleep(1.0)
    await box.close()
    with pytest.raises(SandboxError):
        await running
