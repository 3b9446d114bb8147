"""The router's watchdog against SGLang's real `/health`: a one-token generation that blocks while
generation is paused and answers 503 after a deadline (tests/inference/sglang_stub.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from rollhub.inference.engines.router import EngineRouter, Replica
from rollhub.inference.weight_sync import WeightSyncError, build_weight_sync
from tests.inference.sglang_stub import StubState, start_stub

FAST = {"watchdog_interval_s": 0.1, "watchdog_timeout_s": 0.3, "watchdog_misses": 2}


class FakeProcess:
    """What the router sees of a launched server: whether it was killed."""

    def __init__(self) -> None:
        self.killed = False

    def exit_reason(self) -> str | None:
        return None

    def kill(self) -> None:
        self.killed = True


async def _router(state: StubState, **options):
    runner, url = await start_stub(state)
    process = FakeProcess()
    router = EngineRouter([Replica("r0", url, process=process)], api_key="", **{**FAST, **options})
    await router.start()
    return runner, router, process


async def test_a_long_pause_is_not_taken_for_a_hung_server():
    state = StubState(health_timeout_s=1.0)
    runner, router, process = await _router(state, watchdog_generate_timeout_s=0.6)
    try:
        await asyncio.sleep(0.5)
        await router.pause()
        await asyncio.sleep(2.5)  # SGLang's /health would block, then answer 503, all this time
        assert router.replicas[0].live, router.replicas[0].down_reason
        await router.resume()
        await asyncio.sleep(1.5)  # the generation probe runs again after the pause, and passes
        assert router.replicas[0].live and not process.killed
        paused_probes = [path for path, _ in state.calls if path in ("/health", "/health_generate")]
        assert router.stats.watchdog_detections == 0, paused_probes
    finally:
        await router.close()
        await runner.cleanup()


async def test_a_failed_push_keeps_a_server_that_answers(tmp_path):
    state = StubState(health_timeout_s=5.0, fail_updates=True)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    sync = build_weight_sync("disk", weights_dir=tmp_path / "weights")
    runner, router, process = await _router(state, weight_sync=sync)
    try:
        with pytest.raises(WeightSyncError, match="stub refuses"):
            await asyncio.wait_for(router.update_weights(str(folder), 1), timeout=4)
        assert router.replicas[0].live and not process.killed, router.replicas[0].down_reason
    finally:
        await router.close()
        await runner.cleanup()


async def test_a_wedged_server_is_still_found_and_killed():
    state = StubState(health_timeout_s=1.0)
    runner, router, process = await _router(state)
    try:
        await asyncio.sleep(0.3)
        assert router.replicas[0].live
        state.hung = True
        for _ in range(100):
            if not router.replicas[0].live:
                break
            await asyncio.sleep(0.05)
        assert not router.replicas[0].live and process.killed
        assert "unanswered" in router.replicas[0].down_reason
    finally:
        state.hung = False
        await router.close()
        await runner.cleanup()
