"""The one place an in-process inference engine is built from its config.

`rollhub train`, `eval`, `sft`, `rollout` and `serve`, and the Ray engine servers all build
their engine here, so an engine knob is added once (the `engine:` section of a recipe) and
reaches every command. Remote servers are reached with `SGLangEngine(url)` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class EngineConfig:
    """`engine:` section: the in-process transformers engine (the CPU default)."""

    threads: int = 1  # torch threads of the engine (the trainer has its own, model.threads)
    max_batch_size: int = 64  # requests decoded together
    seed: int = 0  # sampling seed of the engine

    def validate(self) -> None:
        if self.threads < 1 or self.max_batch_size < 1:
            raise ValueError("engine.threads and engine.max_batch_size must be >= 1")
        if self.seed < 0:
            raise ValueError(f"engine.seed must be >= 0, got {self.seed}")


def build_engine(config: EngineConfig, model: str | Path | Any, **overrides: Any) -> Any:
    """An `HFEngine` over `model` (a checkpoint dir or a loaded model).

    `overrides` are further `HFEngine` arguments for callers that measure the engine itself
    (prefix cache size, stop tokens); a run's engine takes its config alone.
    """
    from rollhub.rollout.engines.hf import HFEngine

    arguments = {"threads": config.threads, "max_batch_size": config.max_batch_size, "seed": config.seed, **overrides}
    return HFEngine(model, **arguments)
