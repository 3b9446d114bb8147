"""The sandbox interface: one for Docker containers and for plain processes.

    async with await backend.start(image, limits) as box:
        result = await box.exec("pytest -q", timeout_s=60)

A command's own failure (non-zero exit, timeout) is an `ExecResult`; a failure of the
machinery (engine gone, container died, start failed) raises `SandboxError`, so envs can
report it as an infra failure instead of scoring it as a model failure.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


class SandboxError(RuntimeError):
    """Infrastructure failure of a sandbox (not a command's non-zero exit)."""


@dataclass(frozen=True)
class Limits:
    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 512
    network: bool = False  # off by default
    disk_mb: int | None = None


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
    async def read_file(self, path: str) -> bytes: ...

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
