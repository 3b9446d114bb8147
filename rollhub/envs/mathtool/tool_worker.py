"""The embedded tool runs in worker processes, off the event loop, each killed when it overruns.

Why a process and not the event loop or a thread: the interpreter caps every cost before paying
it, but a cap it misses would stall the one event loop that runs every episode (a thread would
still hold the GIL, and cannot be killed). A worker process (`worker_main.py`) has its own
address-space limit (`MEMORY_LIMIT_MB`) and is SIGKILLed when a call runs past
`kill_after_s(time_limit_s)` of wall time, then replaced; the caller gets a `TimeoutError` or
`MemoryError` line as the tool's output and the episode goes on.

Workers are long-lived (a call costs a pipe round trip, about 0.1-0.3 ms, not a process start)
and shared by every env of the process: `shared_tool_pool()` holds `DEFAULT_WORKERS` of them,
each owned by one thread of a small executor, so calls from any event loop queue there instead
of blocking the loop, and one slow program occupies one worker while the others keep serving.
A worker exits by itself when its stdin closes, so none outlives the process that started it.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollhub.envs.mathtool.interpreter import RunResult
from rollhub.sandbox.base import SandboxError

MEMORY_LIMIT_MB = 256  # the worker's address space: the interpreter itself needs about 30 MB
DEFAULT_WORKERS = 4  # started as concurrent calls need them; an idle one holds about 10 MB
MAX_REPLY_BYTES = 4_000_000  # a reply is bounded by the output cut; more means a broken worker
WORKER_SCRIPT = Path(__file__).with_name("worker_main.py")
READY_LINE = b'{"ready": true}\n'  # worker_main.READY: the worker is loaded and limited
START_TIMEOUT_S = 30.0  # a worker starts in 20-200 ms; a loaded machine may take far longer


def kill_after_s(time_limit_s: float) -> float:
    """Wall time after which a call is killed: twice the CPU time limit plus a margin for a loaded
    machine (the interpreter stops itself at the CPU limit; this is the backstop)."""
    return 2 * time_limit_s + 0.25


class ToolWorker:
    """One worker process, started on first use and restarted after a kill or a crash."""

    def __init__(self, memory_limit_mb: int = MEMORY_LIMIT_MB):
        self.memory_limit_mb = memory_limit_mb
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0  # processes started, restarts included

    def _start(self) -> subprocess.Popen[bytes]:
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(WORKER_SCRIPT), str(self.memory_limit_mb)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start the tool worker: {exc}") from exc
        assert process.stdout is not None
        ready = self._read_line(process.stdout.fileno(), time.monotonic() + START_TIMEOUT_S)
        if ready != READY_LINE:  # it cannot even start: the machinery's failure, not the program's
            process.kill()
            process.wait()
            raise SandboxError(f"the tool worker did not start within {START_TIMEOUT_S:g} s ({process.returncode})")
        self.started += 1
        return process

    @staticmethod
    def _read_line(descriptor: int, deadline: float) -> bytes | None:
        """One reply line; None when the deadline passes, the worker dies or the line is too long."""
        line = bytearray()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([descriptor], [], [], left)[0]:
                return None
            chunk = os.read(descriptor, 65536)
            if not chunk or len(line) + len(chunk) > MAX_REPLY_BYTES:
                return None
            line += chunk
        return bytes(line)

    def call(self, request: dict[str, Any], timeout_s: float) -> RunResult:
        """Send one request and wait at most `timeout_s` for its reply (blocking; run it off the loop)."""
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
            process.stdin.flush()
        except OSError:  # the worker died between calls: a fresh one takes the request
            self.close()
            return self.call(request, timeout_s)
        started = time.monotonic()
        reply = self._read_line(process.stdout.fileno(), started + timeout_s)
        if reply is None:
            self.close()
            if time.monotonic() - started >= timeout_s:
                return RunResult("", f"TimeoutError: the program ran over {timeout_s:.2g} s and was stopped")
            return RunResult("", "MemoryError: the program ran out of memory and was stopped")  # it died
        try:
            data = json.loads(reply)
            return RunResult(str(data["output"]), data["error"], bool(data["truncated"]), int(data["steps"]))
        except (ValueError, KeyError, TypeError):  # not our protocol: a broken worker, replaced
            self.close()
            return RunResult("", "RuntimeError: the tool worker failed; run the program again")

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass


class ToolWorkerPool:
    """`size` workers behind an executor of `size` threads, one worker per thread."""

    def __init__(self, size: int = DEFAULT_WORKERS, memory_limit_mb: int = MEMORY_LIMIT_MB):
        if not 1 <= size <= 64:
            raise ValueError(f"tool workers must be 1..64, got {size}")
        self.size = size
        self.memory_limit_mb = memory_limit_mb
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="mathtool-worker")
        self._local = threading.local()
        self._workers: list[ToolWorker] = []
        self._lock = threading.Lock()
        self._closed = False
        self.pid = os.getpid()

    def _worker(self) -> ToolWorker:
        worker = getattr(self._local, "worker", None)
        if worker is None:
            worker = self._local.worker = ToolWorker(self.memory_limit_mb)
            with self._lock:
                self._workers.append(worker)
        return worker

    def _call(self, request: dict[str, Any], timeout_s: float) -> RunResult:
        return self._worker().call(request, timeout_s)

    async def run(
        self, op: str, source: str, *, time_limit_s: float, max_output_chars: int = 2000
    ) -> tuple[RunResult, float]:
        """(result, wall seconds) of `source` run by a worker; the event loop stays free meanwhile."""
        if self._closed:
            raise SandboxError("the tool worker pool is closed")
        request = {"op": op, "source": source, "time_limit_s": time_limit_s, "max_output_chars": max_output_chars}
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, self._call, request, kill_after_s(time_limit_s))
        return result, time.perf_counter() - started

    @property
    def processes_started(self) -> int:
        with self._lock:
            return sum(worker.started for worker in self._workers)

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._workers if w.process is not None and w.process.poll() is None]

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()


_SHARED: ToolWorkerPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_tool_pool() -> ToolWorkerPool:
    """The process's pool (any event loop may use it; the executor belongs to no loop)."""
    global _SHARED
    with _SHARED_LOCK:
        # a forked child inherits the object but not its threads: it makes its own pool
        if _SHARED is None or _SHARED._closed or _SHARED.pid != os.getpid():
            _SHARED = ToolWorkerPool()
        return _SHARED


@atexit.register
def _close_shared() -> None:
    if _SHARED is not None and _SHARED.pid == os.getpid():
        _SHARED.close()
