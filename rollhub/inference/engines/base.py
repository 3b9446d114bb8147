"""The inference-engine interface shared by SGLang, the in-process transformers engine,
the `rollhub serve` client and the latency-model simulation.

Contract:
* `generate(input_ids, sampling, request_id)` returns the generated token ids, the
  behaviour log-prob of each (log_softmax(logits / temperature), renormalised over the top-k/top-p
  set by the in-process sampler; SGLang reports it before that truncation), the
  policy version of each token and a finish reason: "stop", "length" or "abort". An aborted
  request returns its partial output; the caller decides whether to resubmit.
* `pause()` aborts in-flight requests (they return with "abort") and makes new `generate`
  calls wait until `resume()`; `update_weights(...)` requires a paused engine and bumps
  `weight_version` to the given version.
* `abort(request_id)` aborts one request (no-op if unknown or finished).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    finish_reason: FinishReason
    request_id: str = ""
    prompt_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


class InferenceEngine(abc.ABC):
    """Async text-generation engine with weight updates and request control."""

    weight_version: int = 0

    @abc.abstractmethod
    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> Generation: ...

    @abc.abstractmethod
    async def update_weights(self, source: Any, version: int) -> None:
        """Load new weights (a path to an HF checkpoint dir, or a state dict where supported)."""

    @abc.abstractmethod
    async def pause(self) -> None: ...

    @abc.abstractmethod
    async def resume(self) -> None: ...

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None: ...

    async def abort_all(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Stop background work and free the model / server. Idempotent."""

    async def __aenter__(self) -> InferenceEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
