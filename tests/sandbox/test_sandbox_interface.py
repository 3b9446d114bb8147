"""One interface, every backend: the same behaviour from Docker and process sandboxes."""

from __future__ import annotations

import pytest

from rollhub.sandbox.base import Limits, SandboxError

IMAGE = "rollhub/base:bookworm"


async def test_exec_reports_exit_code_and_interleaved_output(any_backend):
    async with await any_backend.start(IMAGE) as box:
        result = await box.exec("echo out; echo err >&2; exit 3", timeout_s=10)
    assert result.exit_code == 3
    assert not result.ok and not result.timed_out
    assert result.output == "out\nerr\n"
    assert result.duration_s > 0


async def test_workdir_env_and_files_round_trip(any_backend):
    async with await any_backend.start(IMAGE) as box:
        await box.write_file("/work/notes/a.txt", "first line\n")
        await box.write_file("/work/notes/blob.bin", bytes(range(256)))
        result = await box.exec(
            'cat a.txt; echo "$GREETING"', timeout_s=10, workdir="/work/notes", env={"GREETING": "hello there"}
        )
        assert result.output == "first line\nhello there\n"
        assert await box.read_file("/work/notes/blob.bin") == bytes(range(256))
        await box.exec("echo produced > made.txt", timeout_s=10, workdir="/work/notes")
        assert await box.read_file("/work/notes/made.txt") == b"produced\n"
        with pytest.raises(FileNotFoundError):
            await box.read_file("/work/notes/missing.txt")
        with pytest.raises(ValueError):
            await box.write_file("relative/path.txt", "x")


async def test_copy_in_places_a_tree_under_dest(any_backend, tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("VALUE = 41 + 1\n")
    (source / "top.txt").write_text("top\n")
    async with await any_backend.start(IMAGE) as box:
        await box.copy_in(str(source), "/project")
        result = await box.exec(
            "cat top.txt && python3 -c 'from pkg.mod import VALUE; print(VALUE)'", timeout_s=20, workdir="/project"
        )
    assert result.ok, result.output
    assert result.output == "top\n42\n"


async def test_timeout_is_reported_and_sandbox_stays_usable(any_backend):
    async with await any_backend.start(IMAGE) as box:
        await box.write_file("/work/marker.txt", "still here")
        result = await box.exec("echo before; sleep 30; echo never", timeout_s=1)
        assert result.timed_out
        assert not result.ok
        assert "never" not in result.output
        assert result.duration_s < 15
        # Children of the timed-out command are gone too, and the sandbox still works.
        after = await box.exec("cat marker.txt", timeout_s=10, workdir="/work")
        assert after.ok and after.output == "still here"


async def test_long_output_keeps_head_and_tail(any_backend):
    async with await any_backend.start(IMAGE) as box:
        result = await box.exec("echo HEAD; yes filler | head -n 200000; echo TAIL", timeout_s=20)
    assert result.ok
    assert result.truncated
    assert len(result.output) < 2200  # the fixtures set a 2000-character limit
    assert result.output.startswith("HEAD\n")
    assert result.output.rstrip().endswith("TAIL")
    assert "characters truncated" in result.output


async def test_close_is_idempotent_and_exec_after_close_raises(any_backend):
    box = await any_backend.start(IMAGE)
    await box.close()
    await box.close()
    with pytest.raises(SandboxError):
        await box.exec("true", timeout_s=5)


async def test_no_network_inside_by_default(any_backend, request):
    if "plain" in request.node.callspec.params["any_backend"]:
        pytest.skip("the process backend without bubblewrap has no network isolation (documented)")
    connect = (
        'python3 -c "import socket; s = socket.socket(); s.settimeout(3); '
        "s.connect(('1.1.1.1', 53)); print('CONNECTED')\""
    )
    async with await any_backend.start(IMAGE, Limits()) as box:
        result = await box.exec(connect, timeout_s=20)
        interfaces = await box.exec("cat /proc/net/dev", timeout_s=10)
    assert result.exit_code != 0
    assert "CONNECTED" not in result.output
    assert "unreachable" in result.output.lower() or "timed out" in result.output.lower()
    # Only the loopback device exists.
    devices = [line.split(":")[0].strip() for line in interfaces.output.splitlines()[2:]]
    assert devices == ["lo"]


async def test_missing_workdir_is_the_commands_failure(any_backend):
    async with await any_backend.start(IMAGE) as box:
        result = await box.exec("pwd", timeout_s=10, workdir="/no/such/dir")
        assert result.exit_code == 126
        assert "/no/such/dir" in result.output
        assert (await box.exec("echo fine", timeout_s=10)).ok
