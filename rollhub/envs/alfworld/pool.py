"""Async client for the ALFWorld worker processes.

The engine is not thread-safe, so every env lives in a worker process
(`rollhub.envs.alfworld.worker`) that serves its calls one at a time. This module is the
client side: a `WorkerPool` of N processes, each with a reader thread that hands replies to
whichever event loop awaits them. Because the processes and threads are not tied to one
event loop, a single pool per process serves every loop (pytest's per-test loops, the
gymnasium adapter's private loop, `asyncio.run` in the CLI).

Placement: each env reset names a route key (its game, or a group id); all envs with the
same key go to the same worker, so a GRPO/GiGPO group shares one worker and its caches.
New keys go to the worker with the fewest live envs.

Failures: a worker that exits (crash, OOM kill) or makes no progress for `hang_timeout_s`
while it owes replies is killed; every call it owed fails with `WorkerCrashed`, its slots
become stale (their envs report an infra failure), and the next call restarts it. Other
workers and their envs are untouched.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from rollhub.envs.alfworld.protocol import read_frame, write_frame

logger = logging.getLogger(__name__)


class WorkerCrashed(RuntimeError):
    """The worker holding this env died or hung; the episode is lost (an infra failure)."""


class EngineCallFailed(RuntimeError):
    """The engine raised inside the worker; the slot was dropped (an infra failure)."""


@dataclass(frozen=True)
class SlotHandle:
    """An env's place on a worker; stale once that worker restarts."""

    worker: int
    generation: int
    slot: int
    route_key: str


class _WorkerProcess:
    """One worker process, its reader thread and the replies it still owes."""

    def __init__(self, index: int, command: list[str], env: dict[str, str]):
        self.index = index
        self._command = command
        self._env = env
        self.generation = 0
        self.restarts = 0
        self.process: subprocess.Popen | None = None
        self.pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self.last_progress = time.monotonic()
        self.live_slots = 0
        self.lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure_started(self) -> None:
        """Start (or restart) the process. Caller holds `self.lock`."""
        if self.alive:
            return
        if self.process is not None:
            self.generation += 1
            self.restarts += 1
            self.live_slots = 0
            owed, self.pending = self.pending, {}  # replies the dead process will never send
            for loop, future in owed.values():
                _resolve_threadsafe(loop, future, None, WorkerCrashed(f"ALFWorld worker {self.index} died"))
            logger.warning("restarting ALFWorld worker %d (restart #%d)", self.index, self.restarts)
        self.process = subprocess.Popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self._env,
            bufsize=0,
            start_new_session=True,
        )
        self.last_progress = time.monotonic()
        process, generation = self.process, self.generation
        thread = threading.Thread(
            target=self._read_replies,
            args=(process, generation),
            name=f"alfworld-worker-{self.index}-reader",
            daemon=True,
        )
        thread.start()

    def _read_replies(self, process: subprocess.Popen, generation: int) -> None:
        stream = process.stdout
        assert stream is not None
        while True:
            try:
                message = read_frame(stream)
            except Exception:  # a torn frame from a dying process
                message = None
            if message is None:
                break
            request_id, ok, result = message
            with self.lock:
                self.last_progress = time.monotonic()
                waiter = self.pending.pop(request_id, None)
            if waiter is not None:
                loop, future = waiter
                error = None if ok else EngineCallFailed(str(result))
                _resolve_threadsafe(loop, future, result, error)
        process.wait()
        with self.lock:
            if self.process is process:
                owed, self.pending = self.pending, {}
            else:
                owed = {}
        if owed:
            logger.warning(
                "ALFWorld worker %d (pid %d) exited with code %s owing %d replies",
                self.index,
                process.pid,
                process.returncode,
                len(owed),
            )
        for loop, future in owed.values():
            _resolve_threadsafe(
                loop, future, None, WorkerCrashed(f"ALFWorld worker {self.index} exited (code {process.returncode})")
            )

    def send(
        self,
        request_id: int,
        op: str,
        slot: int,
        payload: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future,
    ) -> None:
        """Queue one request. Caller holds `self.lock`."""
        if not self.pending:
            self.last_progress = time.monotonic()
        self.pending[request_id] = (loop, future)
        try:
            assert self.process is not None and self.process.stdin is not None
            write_frame(self.process.stdin, (request_id, op, slot, payload))
        except (BrokenPipeError, OSError, ValueError) as exc:
            self.pending.pop(request_id, None)
            self.kill()
            raise WorkerCrashed(f"ALFWorld worker {self.index} is gone ({exc})") from None

    def kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                process.kill()

    def close(self) -> None:
        process = self.process
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()  # the worker exits at end of input
            process.wait(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            self.kill()


def _resolve_threadsafe(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any, error: BaseException | None
) -> None:
    def resolve() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(resolve)
    except RuntimeError:  # that loop is closed: nobody waits any more
        pass


class WorkerPool:
    """N ALFWorld worker processes behind an asyncio API. Safe to share between loops."""

    def __init__(self, num_workers: int, *, hang_timeout_s: float = 120.0):
        if num_workers < 1:
            raise ValueError("num_workers must be at least 1")
        if hang_timeout_s <= 0:
            raise ValueError("hang_timeout_s must be positive")
        self.num_workers = num_workers
        self.hang_timeout_s = hang_timeout_s
        command = [sys.executable, "-m", "rollhub.envs.alfworld.worker"]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        self.workers = [_WorkerProcess(i, command, env) for i in range(num_workers)]
        self._ids = itertools.count(1)
        self._routes: dict[str, tuple[int, int]] = {}  # route key -> (worker, live envs)
        self._routes_lock = threading.Lock()
        self._closed = False
        self._watchdog = threading.Thread(target=self._watch, name="alfworld-pool-watchdog", daemon=True)
        self._watchdog.start()
        _LIVE_POOLS.add(self)

    # -- placement ----------------------------------------------------------------------
    def open_slot(self, route_key: str) -> SlotHandle:
        """Reserve a slot for one env on the worker that serves `route_key`."""
        if self._closed:
            raise RuntimeError("this ALFWorld worker pool is closed")
        with self._routes_lock:
            index, count = self._routes.get(route_key, (None, 0))
            if index is None:
                index = min(range(self.num_workers), key=lambda i: (self.workers[i].live_slots, i))
            self._routes[route_key] = (index, count + 1)
        worker = self.workers[index]
        with worker.lock:
            worker.ensure_started()
            worker.live_slots += 1
            return SlotHandle(worker=index, generation=worker.generation, slot=next(self._ids), route_key=route_key)

    async def release_slot(self, handle: SlotHandle) -> None:
        """Give the slot back; its engine object stays in the worker for reuse."""
        with self._routes_lock:
            index, count = self._routes.get(handle.route_key, (handle.worker, 1))
            if count <= 1:
                self._routes.pop(handle.route_key, None)
            else:
                self._routes[handle.route_key] = (index, count - 1)
        worker = self.workers[handle.worker]
        with worker.lock:
            if worker.generation != handle.generation or not worker.alive:
                return
            worker.live_slots = max(0, worker.live_slots - 1)
        try:
            await self.call(handle, "close")
        except (WorkerCrashed, EngineCallFailed):
            pass

    # -- calls --------------------------------------------------------------------------
    async def call(self, handle: SlotHandle, op: str, **payload: Any) -> Any:
        """Run one engine call for this slot; raises WorkerCrashed if the slot is lost."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        worker = self.workers[handle.worker]
        with worker.lock:
            if worker.generation != handle.generation:
                raise WorkerCrashed(f"ALFWorld worker {handle.worker} restarted; this episode's state was lost")
            if not worker.alive:
                if worker.process is not None and worker.process.poll() is not None:
                    raise WorkerCrashed(f"ALFWorld worker {handle.worker} exited (code {worker.process.returncode})")
                worker.ensure_started()
            worker.send(next(self._ids), op, handle.slot, payload, loop, future)
        return await future

    async def worker_stats(self) -> list[dict[str, Any]]:
        """Per-worker pid, memory, sessions and translation-cache counters."""
        stats = []
        for worker in self.workers:
            if not worker.alive:
                stats.append({"worker": worker.index, "alive": False, "restarts": worker.restarts})
                continue
            probe = SlotHandle(worker=worker.index, generation=worker.generation, slot=0, route_key="")
            entry = await self.call(probe, "stats")
            entry.update(worker=worker.index, alive=True, restarts=worker.restarts, live_slots=worker.live_slots)
            stats.append(entry)
        return stats

    def pid_of(self, handle: SlotHandle) -> int | None:
        process = self.workers[handle.worker].process
        return process.pid if process is not None else None

    # -- health -------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._closed:
            time.sleep(min(1.0, self.hang_timeout_s / 4))  # read live: callers may tune the timeout
            now = time.monotonic()
            for worker in self.workers:
                with worker.lock:
                    hung = worker.alive and worker.pending and now - worker.last_progress > self.hang_timeout_s
                if hung:
                    logger.warning(
                        "ALFWorld worker %d made no progress for %.0f s; killing it", worker.index, self.hang_timeout_s
                    )
                    worker.kill()

    def close(self) -> None:
        """Stop every worker (idempotent). Envs still open report infra failures."""
        if self._closed:
            return
        self._closed = True
        for worker in self.workers:
            worker.close()
        _LIVE_POOLS.discard(self)

    def kill_all(self) -> None:
        for worker in self.workers:
            worker.kill()


_LIVE_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
_SHARED: dict[tuple[int, float], WorkerPool] = {}
_SHARED_LOCK = threading.Lock()


def default_num_workers() -> int:
    """`ROLLHUB_ALFWORLD_WORKERS`, else one per CPU core (at most 16)."""
    configured = os.environ.get("ROLLHUB_ALFWORLD_WORKERS")
    if configured:
        return max(1, int(configured))
    return max(1, min(16, os.cpu_count() or 1))


def shared_pool(num_workers: int | None = None, hang_timeout_s: float = 120.0) -> WorkerPool:
    """The process-wide pool for these settings (created on first use)."""
    key = (num_workers or default_num_workers(), float(hang_timeout_s))
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None or pool._closed:
            pool = WorkerPool(key[0], hang_timeout_s=key[1])
            _SHARED[key] = pool
        return pool


def shutdown_shared_pools() -> None:
    """Stop every shared pool's workers (tests and CLI exit call this)."""
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
        _SHARED.clear()
    for pool in pools:
        pool.close()


@atexit.register
def _kill_leftover_workers() -> None:
    for pool in list(_LIVE_POOLS):
        pool.kill_all()
