"""SIMULATION ONLY: an InferenceEngine that produces no text, only realistic timing.

Scheduling benchmarks need an engine whose *timing* behaves like a real one (prefill cost,
per-token decode, batches that slow down as they grow, long-tailed output lengths, weight
syncs) without the cost of a model, so thousands of trajectories and K simulated GPUs fit on
one CPU. Tokens are random ids with plausible log-probs; never train on them.

Timing model, per replica (one replica = one simulated GPU / server):
* prefill: `prefill_base_s + prefill_per_token_s * len(input_ids)` before decoding starts;
  prefills run one at a time and pause the decode batch meanwhile (as in an engine without
  chunked prefill, e.g. our HFEngine), unless `prefill_blocks_decode` is False;
* decode: all running requests advance together, one token per iteration; an iteration
  takes `decode_base_s + decode_per_request_s * (batch - 1)`, so throughput grows with the
  batch but each request slows down (processor sharing); at most `max_batch` requests
  decode at once, the rest queue FIFO;
* output length: drawn per request from `OutputLengths` (fixed, lognormal or Pareto),
  capped by `max_new_tokens` (finish "length"); callers may force a length through
  `meta_length` (see `generate`).
Requests go to the least-loaded replica (or, with `routing="prompt_affinity"`, to the
replica that got the first request with the same prompt, as ROLL pins a prompt's samples).
The engine is event-driven (one timer per replica, re-armed on every arrival/finish/abort),
so cost is per event, not per token.

`time_scale` multiplies every duration: 0.01 makes a simulated second last 10 ms of wall
time. On `rollhub.bench.sim.virtual_clock` leave it at 1 and simulated time costs nothing.
Parameters are fit from the real transformers engine by `rollhub bench fit-latency`.

Semantics follow rollhub/inference/engines/base.py: `pause()` aborts in-flight requests (they return
their partial tokens with finish "abort") and holds new ones until `resume()`;
`update_weights` needs a paused engine and sets `weight_version`; each token carries the
version that generated it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams

SIMULATION = True  # marker checked by tests and benchmark reports


@dataclass(frozen=True)
class OutputLengths:
    """Distribution of generated tokens per request (before the max_new_tokens cap)."""

    kind: Literal["fixed", "lognormal", "pareto"] = "lognormal"
    mean_tokens: float = 64.0
    sigma: float = 0.5  # lognormal: std of log-length; pareto: unused
    pareto_shape: float = 2.0  # pareto tail index (> 1 for a finite mean)
    min_tokens: int = 1

    def __post_init__(self) -> None:
        if self.mean_tokens < 1:
            raise ValueError("mean_tokens must be >= 1")
        if self.kind == "pareto" and self.pareto_shape <= 1:
            raise ValueError("pareto_shape must be > 1 so the mean exists")

    def sample(self, rng: np.random.Generator) -> int:
        if self.kind == "fixed":
            value = self.mean_tokens
        elif self.kind == "lognormal":
            mu = math.log(self.mean_tokens) - self.sigma**2 / 2  # keeps the mean at mean_tokens
            value = rng.lognormal(mu, self.sigma)
        else:
            scale = self.mean_tokens * (self.pareto_shape - 1) / self.pareto_shape
            value = scale * (1.0 + rng.pareto(self.pareto_shape))
        return max(self.min_tokens, int(round(value)))


@dataclass(frozen=True)
class LatencyParams:
    """Timing of one replica, in seconds. Defaults are a small CPU model; fit real ones."""

    prefill_base_s: float = 0.01
    prefill_per_token_s: float = 0.0002
    decode_base_s: float = 0.02
    decode_per_request_s: float = 0.002
    max_batch: int = 64
    weight_update_s: float = 0.0
    prefill_blocks_decode: bool = True
    # measured (batch, seconds) points; when given, iteration_s interpolates them (and
    # extends the last segment) instead of using the straight line above
    iteration_table: tuple[tuple[int, float], ...] = ()
    source: str = "defaults"  # where the numbers came from (fit file, hand-set)

    def __post_init__(self) -> None:
        table = tuple(sorted((int(b), float(t)) for b, t in self.iteration_table))
        object.__setattr__(self, "iteration_table", table)
        if any(t <= 0 for _, t in table) or len({b for b, _ in table}) != len(table):
            raise ValueError("iteration_table needs distinct batch sizes with positive times")
        if min(self.prefill_base_s, self.prefill_per_token_s, self.decode_per_request_s, self.weight_update_s) < 0:
            raise ValueError("latency parameters must be >= 0")
        if self.decode_base_s <= 0 or self.max_batch < 1:
            raise ValueError("decode_base_s must be > 0 and max_batch >= 1")

    def prefill_s(self, prompt_tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * prompt_tokens

    def iteration_s(self, batch: int) -> float:
        """Wall time of one decode iteration with `batch` running requests."""
        table = self.iteration_table
        if not table:
            return self.decode_base_s + self.decode_per_request_s * max(0, batch - 1)
        if batch <= table[0][0] or len(table) == 1:
            return (
                table[0][1] if batch <= table[0][0] else table[0][1] + self.decode_per_request_s * (batch - table[0][0])
            )
        for (b0, t0), (b1, t1) in zip(table, table[1:]):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        (b0, t0), (b1, t1) = table[-2], table[-1]
        return t1 + max(0.0, (t1 - t0) / (b1 - b0)) * (batch - b1)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def from_json(cls, path: str | Path) -> LatencyParams:
        data = json.loads(Path(path).read_text())
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class _Request:
    request_id: str
    target_tokens: int
    finish_reason: Literal["stop", "length"]
    version: int
    future: asyncio.Future
    done_tokens: float = 0.0  # set when the request leaves the replica
    started_at: float = 0.0
    offset: float = 0.0  # replica progress when the request joined the decode batch


class _Replica:
    """One simulated server: a FIFO queue feeding a processor-shared decode batch.

    Every running request advances by the same number of tokens per unit time, so the
    replica keeps one cumulative `progress` counter; a request that joined at progress p0
    has produced `progress - p0` tokens and finishes at progress p0 + target. A heap of
    those finish points makes every event O(log n) however many requests run."""

    def __init__(self, index: int, params: LatencyParams, time_scale: float):
        self.index = index
        self.params = params
        self.time_scale = time_scale
        self.running: dict[str, _Request] = {}
        self.waiting: dict[str, _Request] = {}
        self.prefilling = 0
        self.progress = 0.0
        self._finish_heap: list[tuple[float, int, str]] = []
        self._sequence = itertools.count()
        self._iteration_s = params.iteration_s(1) * time_scale
        self._last_update = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._stalls: list[tuple[float, float]] = []  # scheduled prefill intervals (decode paused)
        self._prefill_free_at = 0.0
        self.busy_s = 0.0  # simulated seconds with at least one running request
        self.tokens_generated = 0.0
        self.sim_wall_s = 0.0  # real time spent simulating (perf_counter: cheap), for benchmarks to subtract

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting) + self.prefilling

    def schedule_prefill(self, now: float, duration: float) -> float:
        """Queue a prefill of `duration` (scaled) seconds; returns when it ends."""
        start = max(now, self._prefill_free_at)
        end = start + duration
        self._prefill_free_at = end
        if duration > 0:
            self.settle()  # account progress up to now before the new stall changes the future
            self._stalls.append((start, end))
            self.settle()
        return end

    def _decode_time(self, t0: float, t1: float) -> float:
        """Seconds in [t0, t1] not spent in a prefill stall."""
        overlap = sum(max(0.0, min(t1, end) - max(t0, start)) for start, end in self._stalls)
        return max(0.0, t1 - t0 - overlap)

    def _when(self, now: float, decode_s: float) -> float:
        """The time at which `decode_s` seconds of decoding will have happened after now."""
        t = now
        for start, end in self._stalls:
            if end <= t:
                continue
            if start > t:
                if start - t >= decode_s:
                    return t + decode_s
                decode_s -= start - t
            t = end
        return t + decode_s

    def _advance(self, now: float) -> None:
        if self._stalls:
            elapsed = self._decode_time(self._last_update, now)
            self._stalls = [s for s in self._stalls if s[1] > now]
        else:
            elapsed = now - self._last_update
        if self.running and elapsed > 0:
            tokens = elapsed / self._iteration_s
            self.progress += tokens
            self.busy_s += elapsed / self.time_scale
            self.tokens_generated += tokens * len(self.running)
        self._last_update = now

    def _next_finish(self) -> float | None:
        """Progress at which the next running request finishes (drops stale heap entries)."""
        heap = self._finish_heap
        while heap and heap[0][2] not in self.running:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def settle(self) -> None:
        """Bring progress up to now, finish what is done, admit waiters, re-arm the timer."""
        started = time.perf_counter()
        try:
            self._settle()
        finally:
            self.sim_wall_s += time.perf_counter() - started

    def _settle(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._advance(now)
        while (finish := self._next_finish()) is not None and finish <= self.progress + 1e-6:
            _, _, rid = heapq.heappop(self._finish_heap)
            request = self.running.pop(rid)
            request.done_tokens = request.target_tokens
            if not request.future.done():
                request.future.set_result(request.finish_reason)
        while self.waiting and len(self.running) < self.params.max_batch:
            rid, request = next(iter(self.waiting.items()))
            del self.waiting[rid]
            request.offset = self.progress
            self.running[rid] = request
            heapq.heappush(self._finish_heap, (self.progress + request.target_tokens, next(self._sequence), rid))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        finish = self._next_finish()
        if finish is not None:
            self._iteration_s = self.params.iteration_s(len(self.running)) * self.time_scale
            self._timer = loop.call_at(
                self._when(now, max(finish - self.progress, 0.0) * self._iteration_s), self.settle
            )

    def add(self, request: _Request) -> None:
        self.waiting[request.request_id] = request
        self.settle()

    def remove(self, request_id: str) -> _Request | None:
        """Take a request out (abort); its progress is brought up to date first."""
        self.settle()
        request = self.running.pop(request_id, None)
        if request is not None:
            request.done_tokens = min(request.target_tokens, self.progress - request.offset)
        else:
            request = self.waiting.pop(request_id, None)
        if request is not None:
            self.settle()
        return request


@dataclass
class EngineStats:
    requests: int = 0
    aborted: int = 0
    tokens: int = 0
    prompt_tokens: int = 0


class LatencyModelEngine(InferenceEngine):
    """SIMULATED engine with `replicas` simulated GPUs (see module docstring)."""

    simulation = True

    def __init__(
        self,
        params: LatencyParams | None = None,
        *,
        output_lengths: OutputLengths | None = None,
        replicas: int = 1,
        time_scale: float = 1.0,
        vocab_size: int = 1000,
        seed: int = 0,
        routing: str = "least_loaded",
    ):
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if routing not in ("least_loaded", "prompt_affinity"):
            raise ValueError("routing must be 'least_loaded' or 'prompt_affinity'")
        self.routing = routing
        self._affinity: dict[int, _Replica] = {}
        self.params = params or LatencyParams()
        self.output_lengths = output_lengths or OutputLengths()
        self.time_scale = time_scale
        self.vocab_size = vocab_size
        self.weight_version = 0
        self.stats = EngineStats()
        self._replicas = [_Replica(i, self.params, time_scale) for i in range(replicas)]
        self._rng = np.random.default_rng(seed)
        self._ids = itertools.count()
        self._where: dict[str, _Replica] = {}
        self._running_gate = asyncio.Event()
        self._running_gate.set()
        self._prefill_tasks: dict[str, asyncio.Future] = {}
        self._closed = False
        self._fake_wall_s = 0.0

    @property
    def sim_wall_s(self) -> float:
        """Real time spent simulating (timing model and fake tokens), not serving requests."""
        return self._fake_wall_s + sum(r.sim_wall_s for r in self._replicas)

    # -- the InferenceEngine contract ---------------------------------------------------
    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        *,
        meta_length: int | None = None,
    ) -> Generation:
        """Simulate one request. `meta_length` forces the output length (simulation knob)."""
        if self._closed:
            raise RuntimeError("engine is closed")
        request_id = request_id or f"sim-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        submitted = loop.time()
        while not self._running_gate.is_set():
            await self._running_gate.wait()
        rng = np.random.default_rng(sampling.seed) if sampling.seed is not None else self._rng
        wanted = meta_length if meta_length is not None else self.output_lengths.sample(rng)
        finish: Literal["stop", "length"] = "stop"
        if wanted >= sampling.max_new_tokens:
            wanted, finish = sampling.max_new_tokens, "length"
        version = self.weight_version
        replica = self._route(input_ids)
        self._where[request_id] = replica
        self.stats.requests += 1
        self.stats.prompt_tokens += len(input_ids)
        request = _Request(request_id, wanted, finish, version, loop.create_future(), started_at=submitted)
        aborted = False
        try:
            replica.prefilling += 1
            prefill = loop.create_future()
            self._prefill_tasks[request_id] = prefill
            prefill_s = self.params.prefill_s(len(input_ids)) * self.time_scale
            if self.params.prefill_blocks_decode:
                handle = loop.call_at(replica.schedule_prefill(loop.time(), prefill_s), _resolve, prefill, True)
            else:
                handle = loop.call_later(prefill_s, _resolve, prefill, True)
            try:
                aborted = not await prefill
            finally:
                handle.cancel()
                replica.prefilling -= 1
                self._prefill_tasks.pop(request_id, None)
            if not aborted:
                if wanted == 0:
                    request.future.set_result(finish)
                else:
                    replica.add(request)
                outcome = await request.future
                aborted = outcome == "abort"
        finally:
            self._where.pop(request_id, None)
            if request_id in replica.running or request_id in replica.waiting:  # caller cancelled: free the slot
                replica.remove(request_id)
        produced = int(math.floor(request.done_tokens + 1e-9)) if aborted else request.target_tokens
        self.stats.tokens += produced
        self.stats.aborted += int(aborted)
        started = time.perf_counter()
        token_ids, logprobs = self._fake_tokens(rng, produced, sampling, stop=(not aborted and finish == "stop"))
        self._fake_wall_s += time.perf_counter() - started
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            token_versions=[version] * produced,
            finish_reason="abort" if aborted else finish,
            request_id=request_id,
            prompt_tokens=len(input_ids),
            meta={
                "simulated": True,
                "replica": replica.index,
                "latency_s": (loop.time() - submitted) / self.time_scale,
            },
        )

    async def abort(self, request_id: str) -> None:
        prefill = self._prefill_tasks.get(request_id)
        if prefill is not None:
            _resolve(prefill, False)
            return
        replica = self._where.get(request_id)
        if replica is None:
            return
        request = replica.remove(request_id)
        if request is not None and not request.future.done():
            request.future.set_result("abort")

    async def abort_all(self) -> None:
        for request_id in list(self._prefill_tasks) + list(self._where):
            await self.abort(request_id)

    async def pause(self) -> None:
        self._running_gate.clear()
        await self.abort_all()

    async def resume(self) -> None:
        self._running_gate.set()

    @property
    def paused(self) -> bool:
        return not self._running_gate.is_set()

    async def update_weights(self, source: Any, version: int) -> None:
        if not self.paused:
            raise RuntimeError("update_weights needs a paused engine: call pause() first")
        if self.params.weight_update_s:
            await asyncio.sleep(self.params.weight_update_s * self.time_scale)
        self.weight_version = int(version)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.abort_all()

    # -- helpers --------------------------------------------------------------------------
    def _route(self, input_ids: list[int]) -> _Replica:
        """Least-loaded replica; with "prompt_affinity" every request whose first 256 prompt
        tokens match goes where the first one went (ROLL's PromptAffinityRouter)."""
        least = min(self._replicas, key=lambda r: (r.load, r.index))
        if self.routing == "least_loaded":
            return least
        return self._affinity.setdefault(hash(tuple(input_ids[:256])), least)

    def in_flight(self) -> int:
        return sum(r.load for r in self._replicas)

    def utilisation(self, elapsed_s: float) -> float:
        """Mean share of simulated time the replicas spent decoding."""
        if elapsed_s <= 0:
            return 0.0
        return sum(r.busy_s for r in self._replicas) / (elapsed_s * len(self._replicas))

    def _fake_tokens(
        self, rng: np.random.Generator, count: int, sampling: SamplingParams, *, stop: bool
    ) -> tuple[list[int], list[float]]:
        if count == 0:
            return [], []
        ids = rng.integers(0, self.vocab_size, size=count).tolist()
        if stop and sampling.stop_token_ids:
            ids[-1] = sampling.stop_token_ids[0]
        logprobs = (-rng.exponential(1.0, size=count)).tolist() if sampling.temperature > 0 else [0.0] * count
        return ids, logprobs


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)
