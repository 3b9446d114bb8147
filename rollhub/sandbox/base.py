"""The sandbox interface: one for Docker containers and for plain processes.

    async with await backend.start(image, limits) as box:
        result = await box.exec("pytest -q", timeout_s=60)

A command's own failure (non-zero exit, timeout) is an `ExecResult`; a failure of the
machinery (engine gone, container died, start failed) raises `SandboxError`, so envs can
report it as an infra failure instead of scoring it as a model failure.
"""

from __future__ import annotations

import abc
import errno
from dataclasses import dataclass

#: Capabilities a sandbox keeps: none. What the tasks run (git, python, pytest, patch on files
#: that the command's own uid owns) needs none of Docker's defaults (CHOWN, DAC_OVERRIDE,
#: FOWNER, FSETID, SETUID, SETGID, KILL, NET_RAW, NET_BIND_SERVICE, MKNOD, SYS_CHROOT,
#: SETPCAP, SETFCAP, AUDIT_WRITE), so root in a sandbox is a uid that owns the image's files
#: and nothing more (it cannot write a 0444 file or chown to another user, for instance).
#: An env that needs one passes `Limits(cap_add=(...))`; see IDLE_USER in docker_backend
#: for what that costs.
DEFAULT_CAPS: tuple[str, ...] = ()
#: Writable folders when the disk budget is enforced with tmpfs (see the README).
DEFAULT_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/root", "/home")
#: `read_file` refuses larger files before transferring them (per call: `max_bytes=`).
DEFAULT_MAX_READ_BYTES = 32 * 1024 * 1024
#: How a Docker sandbox runs commands (`Limits.exec_mode`; see docker_backend.py): one
#: long-lived controller per container (a few ms per command), or one `docker exec` each.
EXEC_PERSISTENT_SHELL = "persistent-shell"
EXEC_DOCKER_EXEC = "docker-exec"
EXEC_MODES = (EXEC_PERSISTENT_SHELL, EXEC_DOCKER_EXEC)


class SandboxError(RuntimeError):
    """Infrastructure failure of a sandbox (not a command's non-zero exit)."""


class FileTooLargeError(OSError):
    """`read_file` of a file over the read cap: the caller's (or the policy's) doing, not an
    infra failure. Nothing was transferred."""

    def __init__(self, path: str, size: int, limit: int):
        super().__init__(
            errno.EFBIG,
            f"{path} is {size} bytes ({size / 2**20:.1f} MiB); read_file refuses files over {limit} bytes "
            f"({limit / 2**20:.1f} MiB). Read a part of it with head, tail or sed instead",
        )
        self.path, self.size, self.limit = path, size, limit


@dataclass(frozen=True)
class Limits:
    """What a sandbox may use. Docker enforces all of it; the process backend only some
    (see rollhub/sandbox/README.md).

    - `disk_mb`: budget for what commands write (None: no budget, only `fsize_mb` per file).
      Enforced with `storage_opt size` where the engine's storage driver can, else with a
      read-only root file system and size-limited tmpfs for `writable_dirs` plus the image's
      working directory (seeded with the image's content; the memory limit grows by `disk_mb`).
    - `user`: "auto" runs commands as the user the image declares with the
      `rollhub.sandbox.user` label (non-root), else as the image's default user (root for
      ours); "root", a user name or "uid[:gid]" choose explicitly.
    - `nofile`, `fsize_mb`, `nproc`: rlimits of every process (open files, largest file a
      process may write, processes of the user; `nproc` is counted per uid across all
      containers and does not bind root, so `pids` is the per-container bound).
    - `cap_add`: capabilities kept (default none); everything else is dropped, and
      no-new-privileges is set.
    - `exec_mode`: "persistent-shell" or "docker-exec" (Docker; same semantics, ~100x apart
      in cost per command); None: the backend's default. The process backend runs every
      command as a process of its own either way.
    """

    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 512
    network: bool = False  # off by default
    disk_mb: int | None = None
    user: str = "auto"
    nofile: int = 4096
    fsize_mb: int | None = 1024
    nproc: int | None = None
    cap_add: tuple[str, ...] = DEFAULT_CAPS
    writable_dirs: tuple[str, ...] = DEFAULT_WRITABLE_DIRS
    exec_mode: str | None = None

    def __post_init__(self) -> None:
        if self.exec_mode is not None and self.exec_mode not in EXEC_MODES:
            raise ValueError(f"Limits.exec_mode must be one of {', '.join(EXEC_MODES)} or None, got {self.exec_mode!r}")


@dataclass
class ExecResult:
    exit_code: int
    output: str  # stdout+stderr interleaved, truncated head+tail to the sandbox's output limit
    timed_out: bool = False
    duration_s: float = 0.0
    truncated: bool = False
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def truncate_middle(text: str, limit_chars: int) -> tuple[str, bool]:
    """Keep the head and tail of long output; the middle is replaced by a marker."""
    if len(text) <= limit_chars:
        return text, False
    half = limit_chars // 2
    dropped = len(text) - 2 * half
    return f"{text[:half]}\n... [{dropped} characters truncated] ...\n{text[-half:]}", True


class Sandbox(abc.ABC):
    """A running isolated workspace."""

    id: str = ""

    @abc.abstractmethod
    async def exec(
        self, cmd: str, timeout_s: float, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult: ...

    @abc.abstractmethod
    async def write_file(self, path: str, content: str | bytes) -> None: ...

    @abc.abstractmethod
    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes. Raises FileNotFoundError, IsADirectoryError, or FileTooLargeError
        when it is over `max_bytes` (default: the backend's cap), checked before transfer."""

    @abc.abstractmethod
    async def copy_in(self, local_dir: str, dest: str) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """Remove the sandbox. Idempotent; never raises for an already-gone sandbox."""

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SandboxBackend(abc.ABC):
    """Starts sandboxes; owns cleanup of everything it started."""

    @abc.abstractmethod
    async def start(
        self, image: str, limits: Limits = Limits(), *, labels: dict[str, str] | None = None
    ) -> Sandbox: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """Remove every sandbox this backend started and not yet closed."""
