"""Sandboxes as plain processes on a temporary directory, for machines without Docker.

Each sandbox owns a private root folder on the host. Sandbox paths are absolute paths
inside it: `write_file("/testbed/a.py")` writes `<root>/testbed/a.py`.

With bubblewrap (`bwrap`, used when present): every command runs in fresh namespaces
(no network unless `Limits.network`, own pid namespace, own /tmp) on a read-only view of
the host's /usr and /etc, with each top-level folder of the sandbox root bound read-write
at `/<name>`, so commands see the same absolute paths as the file API.

Without bubblewrap: commands are ordinary host processes started in
`<root>/<workdir>`; absolute paths in commands refer to the HOST's file system. Use paths
relative to the workdir. There is no network, file-system or pid isolation in that mode.

In both modes the memory limit is an address-space rlimit (a hog gets MemoryError rather
than an OOM kill, so `oom_killed` is never set), `Limits.fsize_mb` and `Limits.nofile` are
rlimits too, and cpu / pids / disk / nproc limits, capabilities and users are not enforced.
When a command returns, its process group is killed; with bubblewrap its whole PID
namespace goes (a `setsid` daemon included), without it a `setsid` daemon survives.
See rollhub/sandbox/README.md for the full list of what this backend lacks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import shutil
import signal
import tempfile
import time
from pathlib import Path

from rollhub.sandbox import exit_cleanup
from rollhub.sandbox.base import (
    DEFAULT_MAX_READ_BYTES,
    ExecResult,
    FileTooLargeError,
    Limits,
    Sandbox,
    SandboxBackend,
    SandboxError,
)
from rollhub.sandbox.output_buffer import HeadTailBuffer
from rollhub.sandbox.tar_archives import require_absolute

logger = logging.getLogger(__name__)

_HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "etc")
_RESERVED_TOP_LEVEL = frozenset(_HOST_SYSTEM_DIRS) | {"dev", "proc"}
_BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def bubblewrap_available() -> bool:
    return shutil.which("bwrap") is not None


def _system_binds() -> list[str]:
    """Read-only binds of the host's system folders; merged-/usr symlinks kept as symlinks."""
    args: list[str] = []
    for name in _HOST_SYSTEM_DIRS:
        host = f"/{name}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    return args


class ProcessSandbox(Sandbox):
    def __init__(self, backend: ProcessBackend, root: Path, limits: Limits):
        self.backend = backend
        self.root = root
        self.id = root.name
        self.limits = limits
        self._closed = False
        self._running: set[asyncio.subprocess.Process] = set()

    def __repr__(self) -> str:
        return f"ProcessSandbox({self.root})"

    def host_path(self, path: str) -> Path:
        """Where sandbox path `path` lives on the host (never outside the root)."""
        relative = require_absolute(path).lstrip("/")
        resolved = (self.root / relative).resolve()
        if resolved != self.root.resolve() and self.root.resolve() not in resolved.parents:
            raise ValueError(f"{path} escapes the sandbox")
        return resolved

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{self!r} is closed")
        if not self.root.is_dir():
            raise SandboxError(f"{self!r}: its root folder disappeared")

    def _argv(self, cmd: str, timeout_s: float, workdir: str) -> list[str]:
        inner = ["timeout", "-s", "KILL", f"{timeout_s:g}", *self.backend.shell, cmd]
        if not self.backend.use_bubblewrap:
            return inner
        argv = ["bwrap", "--tmpfs", "/", *_system_binds(), "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for entry in sorted(self.root.iterdir()):
            if entry.name in _RESERVED_TOP_LEVEL:
                logger.warning("%s: /%s shadows a system folder and is not visible to commands", self, entry.name)
            elif entry.is_dir():
                argv += ["--bind", str(entry), f"/{entry.name}"]
        argv += ["--unshare-all", "--die-with-parent", "--new-session", "--chdir", workdir]
        if self.limits.network:
            argv.append("--share-net")
        return argv + inner

    def _limit_resources(self) -> None:  # runs in the child between fork and exec
        memory_bytes = self.limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if self.limits.fsize_mb is not None:
            fsize = self.limits.fsize_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = self.limits.nofile if hard == resource.RLIM_INFINITY else min(self.limits.nofile, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    async def exec(
        self, cmd: str, timeout_s: float, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._check_open()
        workdir = workdir or "/"
        host_workdir = self.host_path(workdir)
        if not host_workdir.is_dir():  # what Docker answers for a missing workdir, too
            return ExecResult(126, f"chdir to {workdir} failed: no such directory\n")
        full_env = {**_BASE_ENV, "HOME": "/" if self.backend.use_bubblewrap else str(self.root), **(env or {})}
        started = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                *self._argv(cmd, timeout_s, workdir),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=str(self.root if self.backend.use_bubblewrap else host_workdir),
                env=full_env,
                start_new_session=True,  # its own process group, so a kill takes all its children
                preexec_fn=self._limit_resources,
            )
        except OSError as exc:
            raise SandboxError(f"could not start a process in {self!r}: {exc}") from exc
        self._running.add(process)
        buffer = HeadTailBuffer(self.backend.output_limit_chars)
        outer_timed_out = False
        try:
            await asyncio.wait_for(self._drain(process, buffer), timeout_s + self.backend.exec_grace_s)
        except TimeoutError:
            outer_timed_out = True
            _kill_group(process)
            while process.returncode is None:
                await asyncio.sleep(0.01)
        finally:
            self._running.discard(process)
            _kill_group(process)  # whatever the command left in its group (cancelled: the command too)
            _close_pipes(process)
        duration_s = time.monotonic() - started
        exit_code = process.returncode if process.returncode is not None else -signal.SIGKILL
        if exit_code < 0:  # killed by a signal: report it the way a shell would
            exit_code = 128 - exit_code
        output, truncated = buffer.text()
        timed_out = outer_timed_out or (exit_code in (124, 137) and duration_s >= timeout_s)
        return ExecResult(exit_code, output, timed_out=timed_out, duration_s=duration_s, truncated=truncated)

    async def _drain(self, process: asyncio.subprocess.Process, buffer: HeadTailBuffer) -> None:
        """Read output until the command exits; then kill its process group and read what is
        left for a moment: a process that escaped the group (setsid, without bubblewrap)
        may hold the pipe open forever, and must not hold up the result."""

        async def read_all() -> None:
            assert process.stdout is not None
            while chunk := await process.stdout.read(65536):
                buffer.append(chunk)

        reader = asyncio.ensure_future(read_all())
        try:
            while process.returncode is None:  # not process.wait(): it also waits for the pipe
                if reader.done():  # output closed, command still running
                    await asyncio.sleep(0.02)
                else:
                    await asyncio.wait({reader}, timeout=0.02)
            _kill_group(process)
            await asyncio.wait({reader}, timeout=self.backend.output_tail_s)
        finally:
            reader.cancel()

    async def write_file(self, path: str, content: str | bytes) -> None:
        self._check_open()
        target = self.host_path(path)
        data = content.encode() if isinstance(content, str) else content
        await asyncio.to_thread(_write_bytes, target, data)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check_open()
        target = self.host_path(path)
        if target.is_dir():
            raise IsADirectoryError(path)
        if not target.is_file():
            raise FileNotFoundError(f"{path} does not exist in {self!r}")
        limit = self.backend.max_read_bytes if max_bytes is None else max_bytes
        return await asyncio.to_thread(_read_capped, target, path, limit)

    async def copy_in(self, local_dir: str, dest: str) -> None:
        self._check_open()
        if not os.path.isdir(local_dir):
            raise FileNotFoundError(f"copy_in source is not a directory: {local_dir}")
        await asyncio.to_thread(shutil.copytree, local_dir, self.host_path(dest), symlinks=True, dirs_exist_ok=True)

    async def close(self) -> None:
        if self._closed:
            return
        self.cleanup_now()
        self.backend._forget(self)

    def cleanup_now(self) -> None:
        self._closed = True
        for process in list(self._running):
            _kill_group(process)
        shutil.rmtree(self.root, ignore_errors=True)


def _write_bytes(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _read_capped(target: Path, path: str, limit: int) -> bytes:
    """Stat, then read at most `limit` + 1 bytes (the file may grow in between)."""
    size = target.stat().st_size
    if size > limit:
        raise FileTooLargeError(path, size, limit)
    with open(target, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(path, len(data), limit)
    return data


def _close_pipes(process: asyncio.subprocess.Process) -> None:
    transport = getattr(process, "_transport", None)
    if transport is not None:
        transport.close()


def _kill_group(process: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ProcessBackend(SandboxBackend):
    """Temp-dir sandboxes. `image` is accepted for interface compatibility and ignored:
    commands use the host's tools."""

    def __init__(
        self,
        *,
        root_dir: str | None = None,
        output_limit_chars: int = 10_000,
        use_bubblewrap: bool | None = None,
        shell: tuple[str, ...] = ("bash", "-c"),
        exec_grace_s: float = 2.0,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        output_tail_s: float = 1.0,
    ):
        if use_bubblewrap and not bubblewrap_available():
            raise SandboxError("bubblewrap requested but `bwrap` is not installed: apt-get install -y bubblewrap")
        self.use_bubblewrap = bubblewrap_available() if use_bubblewrap is None else use_bubblewrap
        if not self.use_bubblewrap:
            logger.warning("process sandboxes without bubblewrap: no network, file-system or pid isolation")
        self.root_dir = root_dir
        self.output_limit_chars = output_limit_chars
        self.shell = tuple(shell)
        self.exec_grace_s = exec_grace_s
        self.max_read_bytes = max_read_bytes
        self.output_tail_s = output_tail_s
        self._live: dict[str, ProcessSandbox] = {}
        exit_cleanup.register(self)

    @property
    def live_count(self) -> int:
        return len(self._live)

    async def start(
        self, image: str, limits: Limits = Limits(), *, labels: dict[str, str] | None = None
    ) -> ProcessSandbox:
        root = Path(tempfile.mkdtemp(prefix="rollhub-sandbox-", dir=self.root_dir))
        box = ProcessSandbox(self, root, limits)
        self._live[box.id] = box
        return box

    def _forget(self, box: ProcessSandbox) -> None:
        self._live.pop(box.id, None)

    async def close(self) -> None:
        self.cleanup_now()
        exit_cleanup.unregister(self)

    def cleanup_now(self) -> None:
        for box in list(self._live.values()):
            box.cleanup_now()
        self._live.clear()
