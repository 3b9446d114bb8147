"""The pool: concurrency limit, retries with backoff, warm sandboxes, metrics."""

from __future__ import annotations

import asyncio

import pytest

from rollhub.sandbox.base import Limits, SandboxError
from rollhub.sandbox.pool import SandboxPool, percentile
from rollhub.sandbox.process_backend import ProcessBackend

IMAGE = "rollhub/base:bookworm"


class FlakyStartBackend(ProcessBackend):
    """Fault injection: the first `failures` starts raise an infra error."""

    def __init__(self, failures: int, **kwargs):
        super().__init__(**kwargs)
        self.failures_left = failures
        self.start_calls = 0

    async def start(self, image, limits=Limits(), *, labels=None):
        self.start_calls += 1
        if self.failures_left > 0:
            self.failures_left -= 1
            raise SandboxError("injected start failure")
        return await super().start(image, limits, labels=labels)


class MissingImageError(SandboxError):
    retryable = False


def test_percentile_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(101)], 0.95) == 95.0


async def test_concurrency_limit_is_never_exceeded(tmp_path):
    backend = ProcessBackend(root_dir=str(tmp_path), use_bubblewrap=False)
    pool = SandboxPool(backend, max_concurrent=3)
    in_use = 0
    peak = 0

    async def job(index: int) -> str:
        nonlocal in_use, peak
        async with pool.sandbox(IMAGE) as box:
            in_use += 1
            peak = max(peak, in_use)
            result = await box.exec(f"echo {index}", timeout_s=10)
            await asyncio.sleep(0.02)
            in_use -= 1
            return result.output

    outputs = await asyncio.gather(*(job(i) for i in range(10)))
    assert outputs == [f"{i}\n" for i in range(10)]
    assert peak == 3
    summary = pool.metrics.summary()
    assert summary["starts"] == 10 and summary["execs"] == 10
    assert summary["alive"] == 0 and summary["peak_alive"] == 3
    assert summary["exec_p50_ms"] > 0
    await pool.close()
    await backend.close()


async def test_start_failures_are_retried_with_backoff(tmp_path):
    backend = FlakyStartBackend(failures=2, root_dir=str(tmp_path), use_bubblewrap=False)
    pool = SandboxPool(backend, start_retries=3, retry_backoff_s=0.01)
    async with pool.sandbox(IMAGE) as box:
        assert (await box.exec("echo ok", timeout_s=10)).ok
    assert backend.start_calls == 3
    assert pool.metrics.start_retries == 2 and pool.metrics.start_failures == 0

    backend.failures_left = 10
    with pytest.raises(SandboxError):
        await pool.acquire(IMAGE)
    assert pool.metrics.start_failures == 1
    # The failed acquire gave its slot back.
    assert pool._leases._value == pool.max_concurrent
    await backend.close()


async def test_non_retryable_start_failure_fails_at_once(tmp_path):
    class MissingImageBackend(ProcessBackend):
        calls = 0

        async def start(self, image, limits=Limits(), *, labels=None):
            MissingImageBackend.calls += 1
            raise MissingImageError("no such image")

    pool = SandboxPool(
        MissingImageBackend(root_dir=str(tmp_path), use_bubblewrap=False), start_retries=5, retry_backoff_s=10
    )
    with pytest.raises(MissingImageError):
        await pool.acquire(IMAGE)
    assert MissingImageBackend.calls == 1


@pytest.mark.docker
async def test_warm_sandboxes_are_handed_out_and_refilled(docker_backend):
    pool = SandboxPool(docker_backend, warm={IMAGE: 2})
    await pool.fill_warm()
    warm_ids = {box.id for box in pool._warm[(IMAGE, Limits())]}
    assert len(warm_ids) == 2
    async with pool.sandbox(IMAGE) as box:
        assert box.id in warm_ids
        assert (await box.exec("echo warm", timeout_s=10)).output == "warm\n"
    await asyncio.gather(*pool._refills)
    assert len(pool._warm[(IMAGE, Limits())]) == 2
    assert pool.metrics.alive == 2
    await pool.close()
    assert pool.metrics.alive == 0
    assert docker_backend.live_count == 0
