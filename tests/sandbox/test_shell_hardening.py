"""Attacks on the sandbox's command channel, as a policy would vary them. Whatever a command
does to the persistent shell (or, where it applies, to docker exec's sweep), the result is
that command's failure and the next command runs: never an exception (an unscored infra
failure), never a process that outlives the sweep, never a frame the controller did not
write."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest

pytestmark = pytest.mark.docker
IMAGE = "rollhub/base:bookworm"
BEAT = "/tmp/heartbeat"
READY = "/tmp/leader-gone"  # written once the leader thread is a zombie

# A thread group whose leader thread is gone while another thread lives: /proc shows the
# leader as a zombie (Z). The live thread appends to BEAT every 20 ms, so a survivor shows.
_LURKER_THREAD = """
import ctypes, os, platform, threading, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_EXIT = {"x86_64": 60, "aarch64": 93}[platform.machine()]  # ends the calling thread only
def beat():
    while True:
        with open(BEAT, "a") as handle:
            handle.write(".")
        with open("/proc/self/stat") as handle:  # the thread group's leader
            if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                open(READY, "w").close()
        time.sleep(0.02)
""".replace("BEAT", repr(BEAT)).replace("READY", repr(READY))
ZOMBIE_LEADERS = {
    # the main thread ends through the raw exit syscall
    "sys-exit": "os.setsid()\nthreading.Thread(target=beat).start()\ntime.sleep(0.1)\nlibc.syscall(SYS_EXIT, 0)\n",
    # the main thread ends through pthread_exit: the process lives on in its thread
    "pthread-exit": "os.setsid()\nthreading.Thread(target=beat).start()\ntime.sleep(0.1)\nlibc.pthread_exit(None)\n",
    # double fork, a session of its own, then the leader exits
    "double-fork": (
        "if os.fork(): os._exit(0)\nos.setsid()\nif os.fork(): os._exit(0)\n"
        "threading.Thread(target=beat).start()\ntime.sleep(0.1)\nlibc.syscall(SYS_EXIT, 0)\n"
    ),
}


def _launch(script: str) -> str:
    """A command that starts `script` detached and returns once its leader thread is gone
    (the attack is in place when the command's sweep runs)."""
    wait = f"for i in $(seq 300); do [ -e {READY} ] && break; sleep 0.05; done"
    return f"python3 - >/dev/null 2>&1 <<'PY' &\n{script}\nPY\n{wait}; [ -e {READY} ] && echo launched"


async def _assert_no_heartbeat(box) -> None:
    """Nothing appends to BEAT any more (the lurker is dead), seen over 0.3 s."""
    first = await box.exec(f"stat -c %s {BEAT} 2>/dev/null || echo 0", timeout_s=20)
    await asyncio.sleep(0.3)
    second = await box.exec(f"stat -c %s {BEAT} 2>/dev/null || echo 0", timeout_s=20)
    assert first.output == second.output, "a process outlived the sweep"


@pytest.mark.parametrize("variant", sorted(ZOMBIE_LEADERS))
async def test_a_zombie_leader_with_live_threads_is_swept(docker_backend, variant):
    """Both exec paths: the sweep skips a zombie only when its whole thread group is dead."""
    async with await docker_backend.start(IMAGE) as box:
        result = await box.exec(_launch(_LURKER_THREAD + ZOMBIE_LEADERS[variant]), timeout_s=20)
        assert result.output.endswith("launched\n") and result.exit_code == 0
        # it was running when the command ended
        assert (await box.exec(f"test -s {BEAT} && echo beating", timeout_s=20)).output == "beating\n"
        await _assert_no_heartbeat(box)
        assert (await box.exec("echo ok", timeout_s=20)).output == "ok\n"


# A lurker that waits for the controller to be restarted and, in the moment before the new
# one is non-dumpable, takes its stdin and stdout through /proc and writes into the stream.
_FORGER = (
    _LURKER_THREAD
    + """
import json, struct
WRITES = WRITES_LIST
taken, stolen = [], []
def forge():
    done = set(os.listdir("/proc"))
    while True:
        for name in os.listdir("/proc"):
            if not name.isdigit() or name in done:
                continue
            try:
                with open("/proc/%s/cmdline" % name, "rb") as handle:
                    cmdline = handle.read()
            except OSError:
                continue
            # the controller's launcher, then its python (needles split: this text is in a cmdline too)
            if b"rollhub" + b"-shell" not in cmdline and b"-I" + b"\\0-S" not in cmdline:
                continue
            for fd, mode in ((1, os.O_WRONLY | os.O_NONBLOCK), (0, os.O_RDONLY | os.O_NONBLOCK)):
                try:
                    handle = os.open("/proc/%s/fd/%d" % (name, fd), mode)
                except OSError:
                    continue
                (taken if fd == 1 else stolen).append(handle)
                done.add(name)
        for handle in stolen:  # the host's messages (a key?) before the controller reads them
            try:
                os.read(handle, 65536)
            except OSError:
                pass
        for handle in taken:  # again and again: whatever the stream is doing then
            for chunk in WRITES:
                try:
                    os.write(handle, chunk)
                except OSError:
                    pass
        time.sleep(0.001)
threading.Thread(target=beat).start()
threading.Thread(target=forge).start()
os.setsid()
time.sleep(0.1)
libc.syscall(SYS_EXIT, 0)
"""
)
_FAKE_EXIT = json.dumps({"token": "0" * 32, "exit_code": 0, "timed_out": False, "oom_kills": None}).encode()
FORGED_WRITES = {
    # what the engine says when an exec cannot start
    "engine-text": [b"OCI runtime exec failed: exec failed: unable to start container process: no such file\r\n"],
    # frames as the old protocol had them: a ready/hello, then an exit
    "frames": [
        struct.pack(">cI", b"R", 11) + b'{"pid": 42}',
        struct.pack(">cI", b"H", 11) + b'{"pid": 42}',
        struct.pack(">cI", b"X", len(_FAKE_EXIT)) + _FAKE_EXIT,
    ],
    # a header announcing a huge frame
    "huge-header": [struct.pack(">cI", b"O", 0x7FFFFFF0)],
}


@pytest.mark.parametrize("variant", sorted(FORGED_WRITES))
async def test_a_restart_cannot_be_fed_forged_frames(docker_backend_shell, variant):
    async with await docker_backend_shell.start(IMAGE) as box:
        first = box._shell.pid
        script = _FORGER.replace("WRITES_LIST", repr(FORGED_WRITES[variant]))
        # The same command kills the controller: nothing swept the lurker when the new one starts.
        killed = await box.exec(_launch(script) + "; kill -9 $PPID; sleep 1", timeout_s=20)
        assert killed.exit_code == 137
        assert box._shell is not None and box._shell.pid != first
        await _assert_no_heartbeat(box)
        after = await box.exec("echo ok; exit 3", timeout_s=20)
        assert (after.exit_code, after.output) == (3, "ok\n")


async def test_frames_written_into_the_stream_are_the_commands_failure(docker_backend_shell):
    """A writer that got hold of the controller's stdout (here: the controller's own fd,
    inherited by a child it was never meant to reach, stands for one taken in a window): its
    bytes fail authentication, the command ends as killed, the shell is restarted."""
    from rollhub.sandbox.persistent_shell import PersistentShell

    async with await docker_backend_shell.start(IMAGE) as box:
        shell: PersistentShell = box._shell
        first = shell.pid
        # Feed the host a correctly framed but unauthenticated exit frame, as if written into
        # the stream: the host reads it where the command's next frame should be.
        shell.stream._payload += struct.pack(">cI", b"X", len(_FAKE_EXIT)) + _FAKE_EXIT + b"\0" * 16
        result = await box.exec("echo hidden", timeout_s=20)
        assert result.exit_code == 137 and "written into" in result.output
        assert box._shell is not None and box._shell.pid != first
        assert (await box.exec("echo ok", timeout_s=20)).output == "ok\n"


@pytest.fixture(scope="module")
def workdir_image(docker_client, tmp_path_factory):
    """An image whose working directory is /testbed, as SWE images have."""
    from rollhub.sandbox import images

    source = tmp_path_factory.mktemp("testbed")
    (source / "README").write_text("repo\n")
    tag = images.build_layered_image(
        docker_client, IMAGE, {"/testbed": str(source)}, [], "rollhub/pytest-workdir", workdir="/testbed"
    )
    yield tag
    docker_client.api.remove_image(tag, force=True)


REMOVALS = {
    "rm-testbed": ("rm -rf /testbed; cd /", "/testbed"),
    "rm-tmp-from-inside": ("cd /tmp && rm -rf /tmp", "/tmp"),
    "move-testbed": ("mv /testbed /moved", "/testbed"),
}


@pytest.mark.parametrize("variant", sorted(REMOVALS))
async def test_removing_the_working_directory_is_the_commands_failure(docker_backend, workdir_image, variant):
    """Commands in the removed folder fail (126, as docker exec says), every other command
    runs, the controller stays up (no restart, nothing read from the engine's error text)."""
    command, removed = REMOVALS[variant]
    async with await docker_backend.start(workdir_image) as box:
        pid = getattr(box._shell, "pid", None)
        workdir = None if removed == "/testbed" else removed
        assert (await box.exec(command, timeout_s=20, workdir=workdir)).exit_code == 0
        for _ in range(2):
            other = await box.exec("echo other; pwd", timeout_s=20, workdir="/")
            assert (other.exit_code, other.output) == (0, "other\n/\n")
            gone = await box.exec("echo never", timeout_s=20, workdir=removed)
            assert gone.exit_code == 126 and "never" not in gone.output
        assert (await box.exec(f"mkdir -p {removed} && echo back", timeout_s=20, workdir="/")).output == "back\n"
        assert (await box.exec("pwd", timeout_s=20, workdir=removed)).output == f"{removed}\n"
        assert getattr(box._shell, "pid", None) == pid


async def test_a_restart_in_a_container_without_its_working_directory(docker_backend_shell, workdir_image):
    """The working directory is gone and the controller is killed: the new one starts (its
    exec runs in /), and the engine's error text is never read as frames."""
    async with await docker_backend_shell.start(workdir_image) as box:
        first = box._shell.pid
        result = await box.exec("rm -rf /testbed; kill -9 $PPID", timeout_s=20, workdir="/")
        assert result.exit_code == 137
        assert box._shell is not None and box._shell.pid != first and not box._shell_unavailable
        assert (await box.exec("echo ok", timeout_s=20, workdir="/")).output == "ok\n"
        home = await box.exec("echo never", timeout_s=20)
        assert home.exit_code == 126 and "chdir to /testbed" in home.output


BREAKAGES = {
    # the controller's interpreter is gone: the restart cannot start it
    "no-python": "rm -f /usr/bin/python3* /usr/local/bin/python3*; kill -9 $PPID",
    # the launcher's shell is gone too
    "no-shell": "rm -f /usr/bin/python3* /usr/local/bin/python3* /bin/sh /usr/bin/sh; kill -9 $PPID",
    # a fake interpreter that prints what the engine prints, as frames would start
    "fake-python": (
        "printf '#!/bin/bash\\necho OCI runtime exec failed: no such file or directory\\nexec sleep 2\\n' "
        "> /usr/local/bin/fake; chmod +x /usr/local/bin/fake; "
        "for p in /usr/bin/python3*; do cp /usr/local/bin/fake $p; done; "
        "kill -9 $PPID"
    ),
    # the controller cannot open anything any more (same uid: prlimit on it is allowed)
    "prlimit": "prlimit --pid $PPID --nofile=3:3; echo limited",
}


@pytest.mark.parametrize("variant", sorted(BREAKAGES))
async def test_a_broken_interpreter_or_controller_is_the_commands_failure(docker_backend_shell, variant):
    """Whatever the command broke, later commands come back as results (failed ones where
    the container can no longer run them), never as an exception."""
    async with await docker_backend_shell.start(IMAGE) as box:
        await box.exec(BREAKAGES[variant], timeout_s=20)
        for _ in range(2):
            result = await box.exec("echo ok", timeout_s=20)
            assert result.exit_code in (0, 126, 127, 137), result
        if variant in ("no-python", "prlimit"):
            assert result.output == "ok\n"


async def test_an_unreachable_root_does_not_crash_the_controller(docker_backend_shell):
    """`chmod 000 /` (root owns /; without capabilities it can then reach no absolute path):
    the sweep still works (it holds /proc open), commands come back as failures."""
    async with await docker_backend_shell.start(IMAGE) as box:
        first = box._shell.pid
        result = await box.exec("chmod 000 /; echo done", timeout_s=20)
        assert (result.exit_code, result.output) == (0, "done\n")
        assert box._shell.pid == first and not box._shell_unavailable
        later = await box.exec("echo never", timeout_s=20)
        assert later.exit_code == 126 and "chdir to / failed" in later.output


async def test_a_full_disk_does_not_stop_the_shell(docker_backend_shell):
    """/tmp full (the disk budget's), then the controller killed: the restart needs no disk."""
    from rollhub.sandbox.base import Limits

    async with await docker_backend_shell.start(IMAGE, Limits(disk_mb=16)) as box:
        first = box._shell.pid
        fill = await box.exec("head -c 40000000 /dev/zero > /tmp/fill; df -k /tmp | tail -1", timeout_s=30)
        assert fill.exit_code == 0 and " 100% " in fill.output, fill.output
        assert (await box.exec("echo still", timeout_s=20)).output == "still\n" and box._shell.pid == first
        assert (await box.exec("kill -9 $PPID", timeout_s=20)).exit_code == 137
        assert (await box.exec("echo ok; rm /tmp/fill", timeout_s=20)).output == "ok\n"
        assert box._shell.pid != first and not box._shell_unavailable


def test_the_controller_is_non_dumpable_before_it_imports_or_reads_anything():
    from rollhub.sandbox.persistent_shell import CONTROLLER_SOURCE

    compile(CONTROLLER_SOURCE, "<controller>", "exec")
    made_safe = CONTROLLER_SOURCE.index("become_non_dumpable()\n\nimport")
    for later in ("import hashlib", "os.read(0", "sweep(keep)\n    frame("):
        assert made_safe < CONTROLLER_SOURCE.index(later), later
