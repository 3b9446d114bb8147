"""Sandboxes that cannot hurt the host, against the real engine.

The commands here are what an adversarial policy would try: escaping the command's process
group, filling the disk (one big file, many files, the container log), reading a huge file
into the trainer, using capabilities root keeps by default, forking past its process quota.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import time

import pytest
from sandbox_testing import new_test_run_id

from rollhub.sandbox.base import DEFAULT_CAPS, FileTooLargeError, Limits

IMAGE = "rollhub/base:bookworm"
MiB = 1024 * 1024

# Processes of the container other than the init and the idle command, as "pid cmdline".
LIST_PROCESSES = "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); echo \"${p#/proc/} $c\"; done"


async def stray_sleeps(box, marker: str) -> list[str]:
    listing = await box.exec(LIST_PROCESSES, timeout_s=20)
    return [line for line in listing.output.splitlines() if f"sleep {marker}" in line]


# ---------------------------------------------------------------------- docker: privileges
def _caps(status_output: str) -> dict[str, int | str]:
    fields = dict(line.split(":\t") for line in status_output.splitlines())
    return {key: (int(value, 16) if key.startswith("Cap") else value.strip()) for key, value in fields.items()}


STATUS = "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status"


@pytest.mark.docker
async def test_root_in_a_sandbox_has_no_capabilities_and_cannot_gain_any(docker_backend, docker_client):
    assert DEFAULT_CAPS == ()
    async with await docker_backend.start(IMAGE) as box:
        host = docker_client.api.inspect_container(box.id)["HostConfig"]
        assert host["CapDrop"] == ["ALL"]
        assert not host["CapAdd"]
        assert "no-new-privileges" in host["SecurityOpt"]
        caps = _caps((await box.exec(f"id -u; {STATUS}", timeout_s=10)).output.split("\n", 1)[1])
        assert caps == {"CapPrm": 0, "CapEff": 0, "CapBnd": 0, "NoNewPrivs": "1"}
        # What Docker's default set would have let root do:
        mknod = await box.exec("mknod /tmp/mem c 1 1", timeout_s=10)
        assert mknod.exit_code != 0 and "not permitted" in mknod.output
        setuid = await box.exec("python3 -c 'import os; os.setuid(1000)'", timeout_s=10)
        assert setuid.exit_code != 0 and "PermissionError" in setuid.output
        raw = await box.exec("python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'", 10)
        assert raw.exit_code != 0 and "PermissionError" in raw.output
        assert (await box.exec("chroot / true", timeout_s=10)).exit_code != 0
        chown = await box.exec("touch /tmp/f && chown 1000 /tmp/f", timeout_s=10)
        assert chown.exit_code != 0 and "not permitted" in chown.output
        # ...while what the tasks run still works as root: git, python, editing its own files.
        work = await box.exec(
            "mkdir -p /testbed && cd /testbed && git init -q && echo x > f && git add f && git commit -qm c "
            "&& echo y > f && git diff --stat && git checkout -q f && python3 -c 'print(open(\"f\").read().strip())'",
            timeout_s=30,
        )
        assert work.ok, work.output
        assert work.output.endswith("x\n")


@pytest.mark.docker
async def test_cap_add_gives_root_exactly_those_capabilities(docker_backend):
    async with await docker_backend.start(IMAGE, Limits(cap_add=("CHOWN",))) as box:
        caps = _caps((await box.exec(STATUS, timeout_s=10)).output)
        assert caps == {"CapPrm": 1, "CapEff": 1, "CapBnd": 1, "NoNewPrivs": "1"}  # CAP_CHOWN is bit 0
        assert (await box.exec("touch /tmp/f && chown 1000 /tmp/f", timeout_s=10)).ok
        assert (await box.exec("mknod /tmp/mem c 1 1", timeout_s=10)).exit_code != 0


@pytest.mark.docker
async def test_rlimits_and_oom_score_are_set(docker_backend):
    async with await docker_backend.start(IMAGE, Limits(nofile=256, fsize_mb=1)) as box:
        limits = await box.exec("ulimit -n; ulimit -f; cat /proc/self/oom_score_adj", timeout_s=10)
        assert limits.output.split() == ["256", str(1 * MiB // 1024), "500"]
        big = await box.exec("head -c 3000000 /dev/zero > /tmp/big", timeout_s=20)
        assert big.exit_code != 0 and "File size limit exceeded" in big.output
        size = await box.exec("stat -c %s /tmp/big", timeout_s=10)
        assert int(size.output) <= 1 * MiB
        files = await box.exec("python3 -c 'fs = [open(\"/dev/null\") for _ in range(300)]'", timeout_s=20)
        assert files.exit_code != 0 and "Too many open files" in files.output


@pytest.mark.docker
async def test_nproc_binds_a_non_root_user(docker_backend):
    # RLIMIT_NPROC counts the uid's processes and never binds root; as `nobody` it does.
    async with await docker_backend.start(IMAGE, Limits(user="nobody", nproc=24, pids=256)) as box:
        who = await box.exec("id -u", timeout_s=10)
        assert who.output.strip() == "65534"
        forks = await box.exec("for i in $(seq 60); do sleep 30 & done; wait", timeout_s=30)
        assert "resource temporarily unavailable" in forks.output.lower() or "retry" in forks.output.lower()
        assert (await box.exec("echo ok", timeout_s=10)).ok


@pytest.mark.docker
async def test_container_log_is_off(docker_backend, docker_client):
    async with await docker_backend.start(IMAGE) as box:
        # Root could write to PID 1's stdout; with a log driver that lands on the host's disk.
        spam = await box.exec("head -c 20000000 /dev/zero > /proc/1/fd/1; echo done", timeout_s=30)
        assert spam.output.strip().endswith("done")
        attrs = docker_client.api.inspect_container(box.id)
        assert attrs["HostConfig"]["LogConfig"]["Type"] == "none"
        assert not attrs["LogPath"]


# ---------------------------------------------------------------------- docker: processes
@pytest.mark.docker
async def test_background_processes_do_not_outlive_their_command(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        began = time.monotonic()
        result = await box.exec(
            "setsid sleep 1001 > /dev/null 2>&1 < /dev/null & "
            "nohup sh -c 'sleep 1002' > /dev/null 2>&1 & "
            "( ( exec -a daemon sleep 1003 & ) & ) ; "
            "setsid sh -c 'trap \"\" TERM HUP; sleep 1004' & "
            "sleep 1005 & disown; echo started",
            timeout_s=30,
        )
        assert result.ok and result.output == "started\n"
        assert time.monotonic() - began < 15  # the inherited output pipe did not hold the result up
        assert await stray_sleeps(box, "100") == []
        # The container itself survived the sweep.
        assert (await box.exec("echo alive", timeout_s=10)).output == "alive\n"


@pytest.mark.docker
async def test_a_timed_out_commands_escaped_children_are_killed(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        result = await box.exec("setsid sleep 1011 > /dev/null 2>&1 & sleep 60", timeout_s=1)
        assert result.timed_out
        assert await stray_sleeps(box, "1011") == []


@pytest.mark.docker
async def test_killing_the_wrapper_does_not_save_a_daemon(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        # The command's parent is `timeout`, whose parent is the sweeping wrapper: kill both.
        result = await box.exec(
            "setsid sleep 1021 > /dev/null 2>&1 < /dev/null & "
            "wrapper=$(cut -d' ' -f4 /proc/$PPID/stat); kill -9 $wrapper $PPID; echo killed",
            timeout_s=20,
        )
        assert result.exit_code == 137
        assert await stray_sleeps(box, "1021") == []
        # Root without CAP_KILL cannot signal the init and the idle command (another uid):
        # `kill -9 -1` kills only the command's own processes, and the sandbox lives on.
        everything = await box.exec("setsid sleep 1022 > /dev/null 2>&1 & kill -9 -1", timeout_s=20)
        assert everything.exit_code == 137
        assert await stray_sleeps(box, "1022") == []
        init = await box.exec("kill -TERM 1", timeout_s=10)  # the init would forward it to the idle command
        assert init.exit_code != 0 and "not permitted" in init.output
        assert (await box.exec("echo alive", timeout_s=10)).output == "alive\n"


@pytest.mark.docker
async def test_a_fork_bomb_is_swept(docker_backend):
    async with await docker_backend.start(IMAGE, Limits(pids=128)) as box:
        began = time.monotonic()
        await box.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout_s=5)
        assert time.monotonic() - began < 30
        count = await box.exec("set -- /proc/[0-9]*; echo $#", timeout_s=20)
        # the init, the idle command, and this command's shell, under the persistent shell's
        # controller, or under docker exec's wrapper and `timeout`
        expected = 4 if box.exec_mode == "persistent-shell" else 5
        assert int(count.output) == expected, (await box.exec(LIST_PROCESSES, timeout_s=20)).output


@pytest.mark.docker
async def test_execs_in_one_sandbox_run_one_at_a_time(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        began = time.monotonic()
        slow, quick = await asyncio.gather(
            box.exec("sleep 1.5; echo slow", timeout_s=20), box.exec("sleep 1; echo quick", timeout_s=20)
        )
        # Neither sweep killed the other command, and they did not overlap.
        assert (slow.output, quick.output) == ("slow\n", "quick\n")
        assert time.monotonic() - began >= 2.4


# ---------------------------------------------------------------------- docker: reads and output
@pytest.mark.docker
async def test_read_file_refuses_a_huge_file_before_transferring_it(docker_client):
    from rollhub.sandbox.docker_backend import DockerBackend

    backend = DockerBackend(run_id=new_test_run_id(), max_read_bytes=1 * MiB, max_threads=8)
    try:
        async with await backend.start(IMAGE) as box:
            await box.exec("truncate -s 300M /tmp/huge && head -c 2000000 /dev/urandom > /tmp/two", timeout_s=20)
            rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            began = time.monotonic()
            with pytest.raises(FileTooLargeError, match="300.0 MiB") as refused:
                await box.read_file("/tmp/huge")
            assert refused.value.size == 300 * MiB
            assert time.monotonic() - began < 5  # refused on the stat, not after streaming 300 MiB
            assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 64 * 1024  # KiB
            with pytest.raises(FileTooLargeError):
                await box.read_file("/tmp/two")
            two = await box.read_file("/tmp/two", max_bytes=4 * MiB)
            assert len(two) == 2000000
            # Not regular files: refused without archiving them (a directory would be all of it).
            with pytest.raises(IsADirectoryError):
                await box.read_file("/usr")
            await box.exec("mkfifo /tmp/fifo; ln -s /tmp/two /tmp/link; ln -s /dev/zero /tmp/zero", timeout_s=10)
            with pytest.raises(FileNotFoundError):
                await box.read_file("/tmp/fifo")
            with pytest.raises(FileNotFoundError):
                await box.read_file("/tmp/zero")
            assert await box.read_file("/tmp/link", max_bytes=4 * MiB) == two  # symlinks are followed
    finally:
        await backend.close()


@pytest.mark.docker
async def test_output_flood_is_capped_in_memory(docker_backend):
    async with await docker_backend.start(IMAGE) as box:
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        flood = await box.exec("head -c 80000000 /dev/urandom; echo; echo END", timeout_s=120)
        assert flood.truncated and flood.output.endswith("END\n")
        assert len(flood.output) < 2200
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 64 * 1024  # KiB


# ---------------------------------------------------------------------- docker: non-root user
@pytest.fixture(scope="module")
def user_image(docker_client, tmp_path_factory):
    """A layered image declaring a sandbox user that owns its work folder /work."""
    from rollhub.sandbox import images

    source = tmp_path_factory.mktemp("work")
    (source / "seed.txt").write_text("from the image\n")
    tag = images.build_layered_image(
        docker_client,
        IMAGE,
        {"/work": str(source)},
        ["cd /work && git init -q && git add -A && git commit -qm seed"],
        "rollhub/pytest-user",
        workdir="/work",
        sandbox_user="agent",
    )
    yield tag
    docker_client.api.remove_image(tag, force=True)


@pytest.mark.docker
async def test_commands_run_as_the_images_sandbox_user(docker_backend, user_image):
    async with await docker_backend.start(user_image) as box:
        who = await box.exec('id -un; id -u; echo "$HOME"; pwd', timeout_s=10)
        assert who.output.split() == ["agent", "1000", "/home/agent", "/work"]
        edit = await box.exec("echo fix >> seed.txt && git add -A && git commit -qm fix && echo ok", timeout_s=20)
        assert edit.output.strip() == "ok"
        assert (await box.exec("touch /etc/owned", timeout_s=10)).exit_code != 0
        await box.write_file("/work/written.txt", "by the trainer\n")
        owner = await box.exec("stat -c %U written.txt && echo more >> written.txt", timeout_s=10)
        assert owner.ok and owner.output == "agent\n"
        # A non-root command cannot signal the init or the idle command: the sandbox survives.
        everything = await box.exec("kill -9 -1", timeout_s=10)
        assert everything.exit_code == 137
        assert (await box.exec("echo alive", timeout_s=10)).output == "alive\n"
    async with await docker_backend.start(user_image, Limits(user="root")) as box:
        assert (await box.exec("id -u", timeout_s=10)).output == "0\n"
    async with await docker_backend.start(IMAGE) as box:  # no label: the image's default (root)
        assert (await box.exec("id -u", timeout_s=10)).output == "0\n"


@pytest.mark.docker
async def test_an_unknown_user_is_a_clear_non_retryable_error(docker_backend_shell, docker_client):
    from rollhub.sandbox.docker_backend import SandboxConfigError
    from rollhub.sandbox.reaper import list_rollhub_containers

    with pytest.raises(SandboxConfigError, match="no-such-user"):
        await docker_backend_shell.start(IMAGE, Limits(user="no-such-user"))
    assert not SandboxConfigError.retryable
    assert list_rollhub_containers(docker_client.api, docker_backend_shell.run_id) == []


# ---------------------------------------------------------------------- docker: disk budget
def _free_bytes() -> int:
    return shutil.disk_usage("/var/lib/docker" if os.path.isdir("/var/lib/docker") else "/").free


@pytest.mark.docker
async def test_disk_budget_fails_writes_inside_and_spares_the_host(docker_backend, docker_client, user_image):
    free_before = _free_bytes()
    async with await docker_backend.start(user_image, Limits(disk_mb=64, memory_mb=512)) as box:
        mode = docker_backend.disk_budget_mode()
        # The work folder starts with the image's content and stays writable by the user.
        seeded = await box.exec("cat seed.txt && git status --short && git log --oneline | wc -l", timeout_s=20)
        assert seeded.ok and seeded.output == "from the image\n1\n", seeded.output
        one_file = await box.exec("dd if=/dev/zero of=/work/fill bs=1M count=200 2>&1", timeout_s=60)
        assert one_file.exit_code != 0
        assert "No space left on device" in one_file.output or "quota" in one_file.output.lower()
        many = await box.exec("for i in $(seq 100); do head -c 1048576 /dev/zero > /tmp/f$i || exit 7; done", 60)
        assert many.exit_code == 7 and "No space left on device" in many.output
        if mode == "tmpfs":
            # Everything else is read-only: no file outside the budgeted folders, not even
            # the engine's bind-mounted /etc/hosts (a host file).
            outside = await box.exec("touch /opt/x; echo x >> /etc/hosts", timeout_s=10)
            assert outside.exit_code != 0 and "Read-only file system" in outside.output
            # tmpfs pages are memory: the files get their own share on top of the processes'.
            assert docker_client.api.inspect_container(box.id)["HostConfig"]["Memory"] == (512 + 64) * MiB
            (listed,) = docker_client.api.containers(all=True, filters={"id": box.id}, size=True)
            rw = listed.get("SizeRw") or 0
            assert rw < 8 * MiB  # nothing the command wrote reached the container's layer on disk
        # The trainer's file API still works inside the budget.
        await box.exec("rm -f /work/fill /tmp/f*", timeout_s=20)
        await box.write_file("/work/notes/a.txt", "note\n")
        await box.write_file("/tmp/b.txt", "tmp\n")
        assert await box.read_file("/work/notes/a.txt") == b"note\n"
        assert (await box.exec("cat /tmp/b.txt notes/a.txt", timeout_s=10)).output == "tmp\nnote\n"
    # 264 MiB were attempted; allow for other jobs on the machine writing meanwhile.
    assert _free_bytes() > free_before - 128 * MiB


@pytest.mark.docker
async def test_disk_budget_mode_is_detected_from_the_engine(docker_backend, docker_client):
    info = docker_client.api.info()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
    if info["Driver"] == "overlay2" and backing != "xfs":
        assert docker_backend.disk_budget_mode() == "tmpfs"
    async with await docker_backend.start(IMAGE, Limits(disk_mb=16)) as box:
        # Either way, a write past the budget fails inside.
        fill = await box.exec("head -c 40000000 /dev/zero > /tmp/fill", timeout_s=30)
        assert fill.exit_code != 0


# ---------------------------------------------------------------------- process backend
async def test_process_backend_read_cap_and_rlimits(tmp_path):
    from rollhub.sandbox.process_backend import ProcessBackend

    backend = ProcessBackend(root_dir=str(tmp_path), max_read_bytes=1 * MiB, use_bubblewrap=False)
    try:
        async with await backend.start(IMAGE, Limits(fsize_mb=1, nofile=128)) as box:
            with open(box.host_path("/huge"), "wb") as huge:  # the command could not: fsize is 1 MiB
                huge.truncate(300 * MiB)
            cut = await box.exec("head -c 2000000 /dev/zero > two", timeout_s=20, workdir="/")
            assert cut.exit_code != 0
            with pytest.raises(FileTooLargeError):
                await box.read_file("/huge")
            assert len(await box.read_file("/two", max_bytes=4 * MiB)) <= 1 * MiB  # fsize cut it
            limits = await box.exec("ulimit -n; ulimit -f", timeout_s=10)
            assert limits.output.split() == ["128", "1024"]
    finally:
        await backend.close()


async def test_process_backend_kills_the_commands_group_when_it_returns(plain_process_backend, tmp_path):
    async with await plain_process_backend.start(IMAGE) as box:
        began = time.monotonic()
        result = await box.exec("sleep 1031 & echo $! > pid; echo started", timeout_s=30, workdir="/")
        assert result.output == "started\n"
        assert time.monotonic() - began < 10  # the child holding the output pipe did not hold us up
        pid = int((await box.read_file("/pid")).decode())
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the background child outlived its command")


async def test_bubblewrap_sandbox_kills_setsid_daemons_too(process_backend):
    async with await process_backend.start(IMAGE) as box:
        result = await box.exec("setsid sleep 1041 > /dev/null 2>&1 < /dev/null & echo started", timeout_s=30)
        assert result.output == "started\n"
        for _ in range(100):  # its PID namespace ended with the command
            alive = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == "sleep 1041"]
            if not alive:
                break
            await asyncio.sleep(0.05)
        assert not alive


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
