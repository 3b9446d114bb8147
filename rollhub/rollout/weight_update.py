"""One weight update of a rollout's engine, timed: pause (in-flight generations abort and are
resubmitted by their owners) -> load -> resume, resumed even when the load fails."""

from __future__ import annotations

import time
from typing import Any

from rollhub.inference.engines.base import InferenceEngine


async def timed_weight_update(engine: InferenceEngine, source: Any, version: int) -> dict[str, float]:
    """Move `engine` to `version` and return how long each phase took (the caller holds its update lock)."""
    started = time.perf_counter()
    await engine.pause()
    paused = time.perf_counter()
    try:
        await engine.update_weights(source, version)
    finally:
        updated = time.perf_counter()
        await engine.resume()
    return {
        "version": version,
        "pause_s": paused - started,
        "update_s": updated - paused,
        "resume_s": time.perf_counter() - updated,
    }
