"""One process per run folder: RUN_DIR/run.lock, held with `fcntl.flock` for the run's whole life.

Why: two runs on one `run_dir` both exited 0 with their steps interleaved in one metrics.jsonl
and each other's checkpoints published as `step-000005.1`. The kernel drops a flock when its
process dies (a crash, SIGKILL, OOM), so a lock never outlives its run; the file's text (pid,
host, start time) only says who holds it. A lock file that still names a holder when the lock
is taken was left by a process that is gone: it is taken over, and the takeover is logged.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from rollhub.core.errors import UserError

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {when}"


def _read_holder(fd: int) -> dict:
    """The holder the lock file names ({} for an empty or unreadable one)."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode(errors="replace").strip()
    if not text:
        return {}
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {"pid": text[:40]}
    return holder if isinstance(holder, dict) else {}


class RunDirLock:
    """The lock of one run folder; `acquire` refuses a folder another live process holds."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise UserError(
                f"{self.run_dir} is in use by another run ({_describe(holder)}); wait for it to end, "
                "or give this run another run_dir (--set run_dir=...)"
            ) from None
        except OSError as exc:  # a filesystem without locks (some network mounts): run, but say so
            os.close(fd)
            logger.warning("%s cannot be locked (%s): nothing stops a second run on this folder", self.path, exc)
            return
        stale = _read_holder(fd)
        if stale:
            logger.warning(
                "%s: taking over the lock left by %s: that process is gone (it did not end cleanly)",
                self.run_dir,
                _describe(stale),
            )
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Empty the file (a clean end leaves nothing to take over), then drop the lock."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


@contextlib.contextmanager
def hold_run_dir(run_dir: str | Path) -> Iterator[RunDirLock]:
    """`run_dir` locked for the `with` block (a UserError if another process holds it)."""
    lock = RunDirLock(run_dir)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
