"""A per-host pool in front of a backend: concurrency limit, warm sandboxes, start retries
and metrics.

    pool = SandboxPool(DockerBackend(), max_concurrent=32, warm={"rollhub/base:bookworm": 4})
    async with pool.sandbox("rollhub/base:bookworm") as box:
        await box.exec("python3 -V", timeout_s=30)
    print(pool.metrics.summary())
    await pool.close()

- `max_concurrent` bounds leased sandboxes on this host (dockerd slows down sharply when
  overloaded; about one core per live container is a sound budget).
- `max_concurrent_starts` throttles container creation separately: dockerd serialises much
  of a start, so 64 simultaneous creates are slower than 8 at a time.
- Warm sandboxes are started ahead for an image and handed out on acquire; each one taken
  is replaced in the background. Sandboxes are never reused after a lease: a released one
  is removed (its file system is dirty).
- Infra failures at start are retried with exponential backoff; a missing image is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from rollhub.sandbox.base import ExecResult, Limits, Sandbox, SandboxBackend, SandboxError

logger = logging.getLogger(__name__)


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[rank]


@dataclass
class PoolMetrics:
    start_latency_s: list[float] = field(default_factory=list)
    exec_latency_s: list[float] = field(default_factory=list)
    start_failures: int = 0  # starts that failed after all retries
    start_retries: int = 0
    exec_infra_failures: int = 0
    alive: int = 0  # leased + warm sandboxes right now
    peak_alive: int = 0

    def _alive_changed(self, delta: int) -> None:
        self.alive += delta
        self.peak_alive = max(self.peak_alive, self.alive)

    def summary(self) -> dict[str, float | int | None]:
        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 2)

        return {
            "starts": len(self.start_latency_s),
            "start_p50_ms": ms(percentile(self.start_latency_s, 0.5)),
            "start_p95_ms": ms(percentile(self.start_latency_s, 0.95)),
            "execs": len(self.exec_latency_s),
            "exec_p50_ms": ms(percentile(self.exec_latency_s, 0.5)),
            "exec_p95_ms": ms(percentile(self.exec_latency_s, 0.95)),
            "exec_mean_ms": ms(statistics.fmean(self.exec_latency_s)) if self.exec_latency_s else None,
            "start_failures": self.start_failures,
            "start_retries": self.start_retries,
            "exec_infra_failures": self.exec_infra_failures,
            "alive": self.alive,
            "peak_alive": self.peak_alive,
        }


class PooledSandbox(Sandbox):
    """A leased sandbox: records exec latency and infra failures; `close()` releases the lease
    (and removes the sandbox)."""

    def __init__(self, pool: SandboxPool, inner: Sandbox):
        self.pool = pool
        self.inner = inner
        self.id = inner.id
        self._released = False

    def __repr__(self) -> str:
        return f"Pooled({self.inner!r})"

    async def exec(
        self,
        cmd: str,
        timeout_s: float,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        *,
        user: str | None = None,
    ) -> ExecResult:
        started = time.monotonic()
        extra = {} if user is None else {"user": user}  # a per-command user: Docker sandboxes only
        try:
            result = await self.inner.exec(cmd, timeout_s, workdir=workdir, env=env, **extra)
        except SandboxError:
            self.pool.metrics.exec_infra_failures += 1
            raise
        self.pool.metrics.exec_latency_s.append(time.monotonic() - started)
        return result

    async def write_file(self, path: str, content: str | bytes) -> None:
        await self.inner.write_file(path, content)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return await self.inner.read_file(path, max_bytes=max_bytes)

    async def copy_in(self, local_dir: str, dest: str) -> None:
        await self.inner.copy_in(local_dir, dest)

    async def close(self) -> None:
        if self._released:
            return
        self._released = True
        await self.pool._release(self.inner)


class SandboxPool:
    def __init__(
        self,
        backend: SandboxBackend,
        *,
        max_concurrent: int = 32,
        max_concurrent_starts: int = 8,
        warm: dict[str, int] | None = None,
        warm_limits: Limits = Limits(),
        start_retries: int = 3,
        retry_backoff_s: float = 0.5,
    ):
        if max_concurrent < 1 or max_concurrent_starts < 1:
            raise ValueError("max_concurrent and max_concurrent_starts must be at least 1")
        if start_retries < 0 or retry_backoff_s < 0:
            raise ValueError("start_retries and retry_backoff_s must be non-negative")
        self.backend = backend
        self.max_concurrent = max_concurrent
        self.start_retries = start_retries
        self.retry_backoff_s = retry_backoff_s
        self.metrics = PoolMetrics()
        self._leases = asyncio.Semaphore(max_concurrent)
        self._starts = asyncio.Semaphore(max_concurrent_starts)
        self._warm_targets = {(image, warm_limits): count for image, count in (warm or {}).items() if count > 0}
        self._warm: dict[tuple[str, Limits], list[Sandbox]] = {key: [] for key in self._warm_targets}
        self._refills: set[asyncio.Task] = set()
        self._closed = False

    # ------------------------------------------------------------------ public
    async def fill_warm(self) -> None:
        """Start every configured warm sandbox now (otherwise they fill after first use)."""
        await asyncio.gather(*(self._refill(key) for key in self._warm_targets))

    async def acquire(self, image: str, limits: Limits = Limits()) -> PooledSandbox:
        """Wait for a free slot, then hand out a warm sandbox or start a new one."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        await self._leases.acquire()
        try:
            inner = self._take_warm(image, limits) or await self._start_with_retries(image, limits)
        except BaseException:
            self._leases.release()
            raise
        return PooledSandbox(self, inner)

    @contextlib.asynccontextmanager
    async def sandbox(self, image: str, limits: Limits = Limits()) -> AsyncIterator[PooledSandbox]:
        box = await self.acquire(image, limits)
        try:
            yield box
        finally:
            await box.close()

    async def close(self) -> None:
        """Cancel refills and remove warm sandboxes (leased ones are closed by their users,
        or by `backend.close()`)."""
        self._closed = True
        for task in list(self._refills):
            task.cancel()
        await asyncio.gather(*self._refills, return_exceptions=True)
        for boxes in self._warm.values():
            while boxes:
                await self._remove(boxes.pop())

    # ------------------------------------------------------------------ internals
    def _take_warm(self, image: str, limits: Limits) -> Sandbox | None:
        key = (image, limits)
        boxes = self._warm.get(key)
        if not boxes:
            return None
        box = boxes.pop()
        self._schedule_refill(key)
        return box

    def _schedule_refill(self, key: tuple[str, Limits]) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._refill(key))
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def _refill(self, key: tuple[str, Limits]) -> None:
        image, limits = key
        while not self._closed and len(self._warm[key]) < self._warm_targets[key]:
            try:
                box = await self._start_with_retries(image, limits)
            except SandboxError as exc:
                logger.warning("warm pool for %s could not refill: %s", image, exc)
                return
            if self._closed:
                await self._remove(box)
                return
            self._warm[key].append(box)

    async def _start_with_retries(self, image: str, limits: Limits) -> Sandbox:
        for attempt in range(self.start_retries + 1):
            try:
                async with self._starts:  # latency measured without the queueing in front
                    started = time.monotonic()
                    box = await self.backend.start(image, limits)
            except SandboxError as exc:
                if not getattr(exc, "retryable", True) or attempt == self.start_retries:
                    self.metrics.start_failures += 1
                    raise
                self.metrics.start_retries += 1
                delay = self.retry_backoff_s * (2**attempt)
                logger.warning("sandbox start failed (%s); retry %d in %.1fs", exc, attempt + 1, delay)
                await asyncio.sleep(delay)
                continue
            self.metrics.start_latency_s.append(time.monotonic() - started)
            self.metrics._alive_changed(+1)
            return box
        raise AssertionError("unreachable")

    async def _remove(self, box: Sandbox) -> None:
        try:
            await box.close()
        finally:
            self.metrics._alive_changed(-1)

    async def _release(self, box: Sandbox) -> None:
        try:
            await self._remove(box)
        finally:
            self._leases.release()
