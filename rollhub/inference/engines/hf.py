"""HFEngine: the in-process transformers engine, the CPU default.

One asyncio task (the scheduler) owns the model. Each iteration it admits waiting
requests (one left-padded prefill for the newcomers, whose KV rows are then merged into
the running batch), runs one batched decode step with a KV cache for every active
request, samples, and retires requests that stopped, hit their length or were aborted.
That is continuous batching: a request joins and leaves the batch at any step, so one
slow env never holds back the others.

Llama-family models (Llama, Qwen2, Qwen3) take the fast path (`FastDecoder`, see
fast_decoder.py): a slot KV cache where request r owns row r, so joining is a prefill into
free rows and leaving moves one row into the hole, never a copy of the whole batch; a
request that finishes at its prefill (a one-token turn) is retired before any decode step
sees it; and the model thread chains decode steps while nothing needs the event loop.
Other models run the transformers forward over a left-padded cache (the path below that
merges and re-selects rows).

All model work runs on one dedicated worker thread (the event loop stays free for env
steps); the torch thread count is set on that thread. Weight updates run on the same
thread between steps, so every token is stamped with the exact version that produced it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams
from rollhub.inference.engines.fast_decoder import FastDecoder, unsupported_reason
from rollhub.inference.engines.kv_cache import PrefixCache, growing_layer_class, pad_left
from rollhub.inference.engines.placement import check_model_placement, resolve_device, resolve_dtype
from rollhub.inference.engines.sampling import sample_tokens

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    generator: torch.Generator  # one uniform per sampled token; the request's seed reproduces them
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    aborted: bool = False
    finish_reason: str | None = None
    weights_epoch: int = -1  # weight load counter when its KV was computed (prefix-cache safety)
    submitted_at: float = field(default_factory=time.perf_counter)
    on_token: Callable[[list[int]], None] | None = None  # streaming: told each step's new ids (event loop)
    streamed: int = 0  # output ids already handed to `on_token`


@dataclass
class EngineStats:
    """Counters for metrics; read them, never reset them mid-run."""

    generated_tokens: int = 0
    prefill_tokens: int = 0
    decode_steps: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    shared_prompts: int = 0  # prompts that took a repeated prompt's KV and logits instead of a forward
    busy_s: float = 0.0  # wall time spent in model calls
    batch_size_sum: int = 0

    @property
    def mean_batch_size(self) -> float:
        return self.batch_size_sum / self.decode_steps if self.decode_steps else 0.0


class _Batch:
    """The running batch: a left-padded KV cache plus one row of state per request."""

    def __init__(self) -> None:
        self.requests: list[_Request] = []
        self.cache: Any = None  # DynamicCache
        self.mask: torch.Tensor | None = None  # [B, T] 1 = real token in cache
        self.lengths: torch.Tensor | None = None  # [B] real tokens in cache (= next position id)
        self.next_tokens: list[int] = []  # sampled, not yet in the cache

    def __len__(self) -> int:
        return len(self.requests)


class HFEngine(InferenceEngine):
    """Continuous-batching transformers engine (see module docstring).

    `model` is an HF checkpoint dir or a loaded causal LM; `stop_token_ids` default to the
    tokenizer/model eos ids. `max_batch_size` caps concurrent requests in the batch;
    `prefix_cache_tokens` bounds the KV kept for prefix reuse (0 disables it).

    `share_prompts` (fast path): a prompt repeated under the same weights runs no forward of
    its own (see `_prefill_slots`); False runs every prompt, for comparisons.

    `fast_path` runs Llama-family models (Llama, Qwen2, Qwen3) through `FastDecoder` over
    a slot KV cache (see fast_decoder.py; same log-probs, less overhead per token); other
    models, or `fast_path=False`, use the transformers forward with a left-padded cache.

    `device` ("cpu", "cuda", "cuda:N") is where the model runs, never silently elsewhere: a
    CUDA device this machine lacks is an error. `dtype` (torch dtype or name) defaults to
    bf16 on CUDA and fp32 on the CPU. A model loaded from a path is placed there; a model
    passed in loaded must already be on `device` (and in `dtype`, if given) — the engine
    never moves a caller's model.
    """

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        *,
        threads: int = 1,
        max_batch_size: int = 32,
        batch_window_s: float = 0.002,
        stop_token_ids: tuple[int, ...] | None = None,
        seed: int = 0,
        dtype: torch.dtype | str | None = None,
        prefix_cache_tokens: int = 32768,
        device: str = "cpu",
        fast_path: bool = True,
        share_prompts: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        target = resolve_device(device)
        if isinstance(model, (str, Path)):
            from rollhub.inference.models import load_model_and_tokenizer

            self.model_path: str | None = str(model)
            model, loaded_tokenizer = load_model_and_tokenizer(
                model, dtype=resolve_dtype(dtype, target), device=str(target)
            )
            tokenizer = tokenizer or loaded_tokenizer
        else:
            check_model_placement(model, target, None if dtype is None else resolve_dtype(dtype, target))
            self.model_path = getattr(getattr(model, "config", None), "_name_or_path", None)
        self.model = model.eval()
        self.device = next(model.parameters()).device  # KV lives here; ids, masks and sampling on the CPU
        self.dtype = next(model.parameters()).dtype
        self.tokenizer = tokenizer
        self.threads = threads
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.stop_token_ids = (
            tuple(stop_token_ids) if stop_token_ids is not None else self._default_stop_ids(model, tokenizer)
        )
        self.pad_token_id = self._pad_id(model, tokenizer)
        # transformers >= 5.2x renamed `past_key_values` to `cache`; accept both
        self._cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.weight_version = 0
        self.stats = EngineStats()
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.share_prompts = share_prompts
        self._weights_epoch = 0  # bumped by every weight change (`_follow_weights`)
        self._parameters = list(model.parameters())
        self._weights_seen: list[tuple[int, int]] = []  # (storage, version) per parameter; [] packs at the first step
        self._layer_class = growing_layer_class()
        self._head32: tuple[tuple[int, int], torch.Tensor, torch.Tensor | None] | None = None  # see _fp32_head
        reason = unsupported_reason(model) if fast_path else "fast_path=False"
        self._decoder = FastDecoder(model) if reason is None else None
        self._slots = self._decoder.new_cache(max_batch_size) if self._decoder is not None else None
        if reason is not None:
            logger.info("engine uses the transformers forward (%s)", reason)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="hf-engine", initializer=torch.set_num_threads, initargs=(threads,)
        )
        self._seed_counter = itertools.count(seed * 1_000_003)
        self._waiting: list[_Request] = []
        self._by_id: dict[str, _Request] = {}
        self._batch = _Batch()
        self._wakeup: asyncio.Event | None = None
        self._resumed: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._paused = False
        self._closed = False
        self._task: asyncio.Task | None = None
        self._interrupt = False  # set from the event loop: the worker returns after its current step
        self._finished_in_step = 0  # requests that got a finish reason during the current worker call
        self.max_steps_per_call = 64  # decode steps one worker call may chain while nothing needs the loop
        self.max_call_s = 0.05  # ... and for at most this long (bounds how late a weight update starts)

    # --- public API ------------------------------------------------------------------

    @property
    def num_in_flight(self) -> int:
        """Requests waiting or decoding (0 after pause/abort_all/close has settled)."""
        return len(self._by_id)

    @property
    def paused(self) -> bool:
        return self._paused

    #: `generate` takes `on_token` (the gateway streams tokens as they are sampled)
    streams_tokens = True

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        on_token: Callable[[list[int]], None] | None = None,
    ) -> Generation:
        """`on_token`, if given, is called on the event loop with each decode step's new ids, before
        the Generation returns (so a caller can stream them; the Generation still has them all)."""
        self._ensure_started()
        if self._closed:
            raise RuntimeError("engine is closed")
        while self._paused and not self._closed:
            await self._resumed.wait()
        if self._closed:
            raise RuntimeError("engine is closed")
        rid = request_id or uuid.uuid4().hex
        if rid in self._by_id:
            raise ValueError(f"request id {rid} is already in flight")
        if not input_ids:
            raise ValueError("input_ids must not be empty")
        vocab = self.model.get_input_embeddings().num_embeddings
        if not 0 <= min(input_ids) <= max(input_ids) < vocab:
            # checked here, before the request joins a batch: one bad id would fail every request decoded with it
            raise ValueError(f"input_ids must be integers in [0, {vocab})")
        loop = asyncio.get_running_loop()
        if sampling.max_new_tokens == 0 or len(input_ids) >= self.max_positions:
            return Generation([], [], [], "length", request_id=rid, prompt_tokens=len(input_ids))
        generator = torch.Generator().manual_seed(
            sampling.seed if sampling.seed is not None else next(self._seed_counter)
        )
        request = _Request(rid, list(input_ids), sampling, loop.create_future(), generator, on_token=on_token)
        self._by_id[rid] = request
        self._waiting.append(request)
        self._wakeup.set()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            # the caller went away (e.g. a cancelled redundant trajectory): free the slot
            self._abort_request(request)
            raise

    async def abort(self, request_id: str) -> None:
        request = self._by_id.get(request_id)
        if request is not None:
            self._abort_request(request)

    async def abort_all(self) -> None:
        for request in list(self._by_id.values()):
            self._abort_request(request)
        await self._wait_drained()

    async def pause(self) -> None:
        """Abort everything in flight (partial outputs return with "abort"); block new calls."""
        self._ensure_started()
        self._paused = True
        self._resumed.clear()
        await self.abort_all()

    async def resume(self) -> None:
        self._ensure_started()
        self._paused = False
        self._resumed.set()

    async def update_weights(self, source: Any, version: int) -> None:
        """Load a state dict (fast path, same process) or an HF checkpoint dir; set version.

        Runs on the model thread between decode steps. With the engine paused (the normal
        pause -> update -> resume sequence) nothing is in flight; otherwise in-flight
        requests continue under the new weights, their later tokens stamped `version`.
        """
        self._ensure_started()
        loop = asyncio.get_running_loop()
        self._interrupt = True
        await loop.run_in_executor(self._executor, self._load_weights, source, version)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._interrupt = True
        for request in list(self._by_id.values()):
            self._abort_request(request)
        if self._task is not None and not self._task.done() and self._task.get_loop() is asyncio.get_running_loop():
            if self._wakeup is not None:
                self._wakeup.set()
            try:
                await asyncio.wait_for(self._task, timeout=30)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        self._executor.shutdown(wait=False)
        if self._resumed is not None:
            self._resumed.set()

    # --- internals -------------------------------------------------------------------

    @staticmethod
    def _default_stop_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
        ids: set[int] = set()
        for source in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
            eos = getattr(source, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, (list, tuple)):
                ids.update(int(e) for e in eos)
        return tuple(sorted(ids))

    @staticmethod
    def _pad_id(model: Any, tokenizer: Any) -> int:
        for source in (tokenizer, getattr(model, "config", None)):
            pad = getattr(source, "pad_token_id", None)
            if isinstance(pad, int):
                return pad
        return 0

    def _ensure_started(self) -> None:
        """Start the scheduler on the running loop (again, if an earlier loop went away,
        e.g. a caller that uses asyncio.run() once per phase)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        if self._closed:
            return
        if self._task is not None and self._task.get_loop() is not loop:
            for request in list(self._by_id.values()):  # their loop is gone; nobody awaits them
                self._by_id.pop(request.rid, None)
            self._waiting.clear()
            self._batch = _Batch()
        paused = self._paused
        self._wakeup = asyncio.Event()
        self._resumed = asyncio.Event()
        self._drained = asyncio.Event()
        if not paused:
            self._resumed.set()
        self._drained.set()
        self._task = loop.create_task(self._run(), name="hf-engine-scheduler")

    def _abort_request(self, request: _Request) -> None:
        if request.future.done():
            return
        request.aborted = True
        self._interrupt = True
        if request in self._waiting:  # never prefilled: empty output, like SGLang's queued abort
            self._waiting.remove(request)
            self._finish(request, "abort")
        else:
            self._drained.clear()
            self._wakeup.set()

    @staticmethod
    def _emit(request: _Request) -> None:
        """Hand a streaming request the ids sampled since the last call (never from the model thread)."""
        if request.on_token is not None and request.streamed < len(request.output_ids):
            fresh = request.output_ids[request.streamed :]
            request.streamed = len(request.output_ids)
            try:
                request.on_token(fresh)
            except Exception:  # a listener's bug must not stop the engine
                logger.exception("on_token of request %s failed", request.rid)
                request.on_token = None

    def _finish(self, request: _Request, reason: str) -> None:
        self._emit(request)
        self._by_id.pop(request.rid, None)
        if reason == "abort":
            self.stats.requests_aborted += 1
        else:
            self.stats.requests_finished += 1
        if not request.future.done():
            request.future.set_result(
                Generation(
                    token_ids=list(request.output_ids),
                    logprobs=list(request.logprobs),
                    token_versions=list(request.versions),
                    finish_reason=reason,  # type: ignore[arg-type]
                    request_id=request.rid,
                    prompt_tokens=len(request.prompt_ids),
                    meta={"e2e_latency_s": time.perf_counter() - request.submitted_at},
                )
            )
        if not self._by_id:
            self._drained.set()

    async def _wait_drained(self) -> None:
        while self._by_id and self._task is not None and not self._task.done():
            self._wakeup.set()
            await self._drained.wait()
            await asyncio.sleep(0)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed or self._by_id:
            try:
                self._retire_aborted()
            except Exception as exc:  # a bookkeeping failure must not leave callers hanging either
                self._fail_all(exc, [])
                continue
            if not self._batch and not self._waiting:
                if self._closed:
                    break
                self._wakeup.clear()
                await self._wakeup.wait()
                if self.batch_window_s > 0 and not self._closed:
                    await asyncio.sleep(self.batch_window_s)  # gather a cohort before prefill
                continue
            newcomers = self._admit()
            try:
                started = time.perf_counter()
                self._interrupt = False  # set again by anything that needs the loop during the call
                await loop.run_in_executor(self._executor, self._step, newcomers)
                self.stats.busy_s += time.perf_counter() - started
                newcomers = []  # in the batch now
                for request in list(self._by_id.values()):
                    self._emit(request)
                self._retire_finished()
            except Exception as exc:  # a model failure must not leave callers hanging
                self._fail_all(exc, newcomers)
                continue
            await asyncio.sleep(0)  # let env coroutines run between steps

    def _fail_all(self, exc: Exception, newcomers: list[_Request]) -> None:
        logger.exception("engine step failed; failing %d requests", len(self._batch) + len(newcomers))
        for request in self._batch.requests + newcomers:
            self._by_id.pop(request.rid, None)
            if not request.future.done():
                request.future.set_exception(exc)
        self._batch = _Batch()
        if not self._by_id:
            self._drained.set()

    def _admit(self) -> list[_Request]:
        room = self.max_batch_size - len(self._batch)
        newcomers = [r for r in self._waiting[:room] if not r.aborted]
        del self._waiting[:room]
        return newcomers

    def _retire_aborted(self) -> None:
        keep = [i for i, r in enumerate(self._batch.requests) if not r.aborted]
        if len(keep) != len(self._batch):
            aborted = [r for r in self._batch.requests if r.aborted]
            self._select_rows(keep)
            for request in aborted:
                self._finish(request, "abort")

    def _retire_finished(self) -> None:
        done = [r for r in self._batch.requests if r.finish_reason is not None or r.aborted]
        if not done:
            return
        for row, request in enumerate(self._batch.requests):
            if request.finish_reason is not None and not request.aborted:
                self._store_prefix(row, request)
        self._select_rows([i for i, r in enumerate(self._batch.requests) if r.finish_reason is None and not r.aborted])
        for request in done:
            self._finish(
                request, "abort" if request.aborted and request.finish_reason is None else request.finish_reason
            )

    def _store_prefix(self, row: int, request: _Request) -> None:
        """Keep the KV of prompt + output (minus the last token, never fed) for reuse."""
        if self.prefix_cache.max_tokens <= 0:
            return
        length = int(self._batch.lengths[row])
        ids = request.prompt_ids + request.output_ids[:-1]
        if len(ids) != length or request.weights_epoch != self._weights_epoch:
            return  # never cache KV whose ids or weights we cannot vouch for
        if self._slots is not None:
            self.prefix_cache.store(ids, *self._slots.read(row, length))
            return
        columns = self._batch.mask[row].nonzero().squeeze(-1).to(self.device)  # real tokens (rows may have holes)
        keys = [layer.keys[row : row + 1].index_select(2, columns) for layer in self._batch.cache.layers]
        values = [layer.values[row : row + 1].index_select(2, columns) for layer in self._batch.cache.layers]
        self.prefix_cache.store(ids, keys, values)

    def _select_rows(self, keep: list[int]) -> None:
        batch = self._batch
        if not keep:
            self._batch = _Batch()
            return
        if self._slots is not None:
            self._compact_slots(keep)
            return
        index = torch.tensor(keep, dtype=torch.long)
        mask = batch.mask.index_select(0, index)
        first_real = int((mask.sum(0) > 0).nonzero()[0]) if mask.numel() else 0  # drop all-padding columns
        batch.mask = mask[:, first_real:]
        batch.lengths = batch.lengths.index_select(0, index)
        index = index.to(self.device)
        for layer in batch.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first_real:]
            layer.values = layer.values.index_select(0, index)[:, :, first_real:]
        batch.requests = [batch.requests[i] for i in keep]
        batch.next_tokens = [batch.next_tokens[i] for i in keep]

    def _compact_slots(self, keep: list[int]) -> None:
        """Keep rows `keep` of the slot cache as rows 0..len(keep)-1: each hole below the new
        size takes a survivor from above it (one row copy each); no other row moves."""
        batch = self._batch
        size = len(keep)
        kept = set(keep)
        holes = [row for row in range(size) if row not in kept]
        movers = [row for row in keep if row >= size]
        order = list(range(size))
        lengths = batch.lengths.tolist()
        for hole, mover in zip(holes, movers):
            self._slots.move(mover, hole, lengths[mover])
            order[hole] = mover
        batch.requests = [batch.requests[i] for i in order]
        batch.next_tokens = [batch.next_tokens[i] for i in order]
        batch.lengths = torch.tensor([lengths[i] for i in order], dtype=torch.long)

    # --- model thread ----------------------------------------------------------------

    def _follow_weights(self) -> None:
        """Notice a parameter changed since the last step, in place or by `update_weights`.

        A model shared with the trainer changes under the engine at every optimizer step. Then
        the fast path repacks, cached prompt KV and logits are dropped (sharing or extending them
        would hand out stale log-probs), and the KV of requests already running under the old
        weights is kept out of the cache (`_weights_epoch`).
        """
        signature = [(parameter.data_ptr(), parameter._version) for parameter in self._parameters]
        if signature == self._weights_seen:
            return
        self._weights_seen = signature
        self.prefix_cache.clear()
        self._weights_epoch += 1
        if self._decoder is not None:
            self._decoder.pack()

    @torch.inference_mode()
    def _step(self, newcomers: list[_Request]) -> None:
        """One decode step for the running batch, then prefill the newcomers into it.

        Newcomers never join a decode step before their prefill; one that finishes at its
        prefill (a one-token turn, or a stop token first) is retired right after this step
        without ever being decoded with the batch.
        """
        version = self.weight_version
        self._follow_weights()
        if self._decoder is not None:
            self._finished_in_step = 0
            if self._batch.requests:
                self._decode_slots(version)
            if newcomers:
                self._prefill_slots(newcomers, version)
            # Chain decode steps while nothing needs the event loop (no request finished, none
            # waiting or aborted, no weight update queued): each return to the loop is a thread
            # hand-off, which on a busy CPU can cost more than the step itself.
            deadline = time.perf_counter() + self.max_call_s
            for _ in range(self.max_steps_per_call - 1):
                admissible = self._waiting and len(self._batch) < self.max_batch_size
                if self._finished_in_step or self._interrupt or admissible or time.perf_counter() > deadline:
                    break
                self._decode_slots(version)
            return
        decoding = list(self._batch.requests)
        if decoding:
            self._decode(version)
        if newcomers:
            self._prefill(newcomers, version)

    def _decode_slots(self, version: int) -> None:
        batch = self._batch
        size = len(batch)
        ids = torch.tensor(batch.next_tokens, dtype=torch.long).view(size, 1)
        span = int(batch.lengths.max()) + 1
        self._slots.reserve(size, span)
        last = torch.zeros(size, dtype=torch.long)
        logits = self._decoder.forward(self._slots, ids, 0, batch.lengths, last, span).cpu()
        batch.lengths = batch.lengths + 1
        self.stats.decode_steps += 1
        self.stats.batch_size_sum += size
        batch.next_tokens = self._sample(batch.requests, logits, version)

    def _prefill_slots(self, requests: list[_Request], version: int) -> None:
        """Prefill newcomers into the rows after the running batch, reusing cached prefixes.

        A prompt seen whole before under these weights (`PrefixCache.lookup_exact`), or twice
        among the newcomers, runs no forward of its own: its KV is copied into its row and its
        first token is sampled from the same logits with its own generator, so the samples stay
        independent draws from the same distribution. The rest run as one batch: row r's suffix
        (the prompt past its cached prefix) is left-aligned at the prefix's end; rows are
        right-padded to the longest suffix. If that padding would run past the model's last
        position, they are prefilled one at a time instead.
        """
        computed: list[_Request] = []
        shared: list[tuple[_Request, Any]] = []  # (request, index into computed or cached KV + logits)
        first_of: dict[tuple[int, ...], int] = {}
        for request in requests:
            key = tuple(request.prompt_ids)
            exact = self.prefix_cache.lookup_exact(key) if self.share_prompts else None
            if exact is not None:
                shared.append((request, exact))
            elif self.share_prompts and key in first_of:
                shared.append((request, first_of[key]))
            else:
                first_of[key] = len(computed)
                computed.append(request)
        plans = []
        for request in computed:
            hit = self.prefix_cache.lookup(request.prompt_ids)
            plans.append((request, hit[0] if hit else 0, hit))
        span = max(len(request.prompt_ids) for request in requests)
        if plans:
            width = max(len(request.prompt_ids) - cached for request, cached, _ in plans)
            span = max(span, max(cached for _, cached, _ in plans) + width)
            if span > self._decoder.max_positions and len(requests) > 1:
                for request in requests:
                    self._prefill_slots([request], version)
                return
        batch = self._batch
        first = len(batch)
        self._slots.reserve(first + len(requests), span)
        parts = []
        if plans:
            ids = torch.full((len(plans), width), self.pad_token_id, dtype=torch.long)
            for row, (request, cached, hit) in enumerate(plans):
                if hit is not None:
                    self._slots.write(first + row, hit[1], hit[2])
                suffix = request.prompt_ids[cached:]
                ids[row, : len(suffix)] = torch.tensor(suffix, dtype=torch.long)
                self.stats.prefill_tokens += len(suffix)
            starts = torch.tensor([cached for _, cached, _ in plans], dtype=torch.long)
            last = torch.tensor(
                [len(request.prompt_ids) - cached - 1 for request, cached, _ in plans], dtype=torch.long
            )
            computed_logits = self._decoder.forward(self._slots, ids, first, starts, last, span).cpu()
            parts.append(computed_logits)
            for row, request in enumerate(computed):
                length = len(request.prompt_ids)
                if self.share_prompts and length <= self.prefix_cache.max_tokens:  # (0: caching off)
                    kv = self._slots.read(first + row, length)
                    self.prefix_cache.store(request.prompt_ids, *kv, computed_logits[row].clone())
        for offset, (request, source) in enumerate(shared):
            row = first + len(computed) + offset
            if isinstance(source, int):
                self._slots.move(first + source, row, len(request.prompt_ids))
                parts.append(computed_logits[source : source + 1])
            else:
                self._slots.write(row, source[0], source[1])
                parts.append(source[2].unsqueeze(0))
            self.stats.shared_prompts += 1
        ordered = computed + [request for request, _ in shared]
        for request in ordered:
            request.weights_epoch = self._weights_epoch
        tokens = self._sample(ordered, torch.cat(parts), version)
        lengths = torch.tensor([len(request.prompt_ids) for request in ordered], dtype=torch.long)
        batch.lengths = lengths if batch.lengths is None or not batch.requests else torch.cat([batch.lengths, lengths])
        batch.requests.extend(ordered)
        batch.next_tokens.extend(tokens)

    def _new_cache(self) -> Any:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=self.model.config)
        cache.layers = [self._layer_class() if type(layer) is DynamicLayer else layer for layer in cache.layers]
        return cache

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        cache_kwarg = {self._cache_argument: cache}
        device = self.device
        with self._fp32_head():
            out = self.model(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                use_cache=True,
                logits_to_keep=1,
                **cache_kwarg,
            )
        return out.logits[:, -1, :].float().cpu()  # bookkeeping and sampling stay on the CPU

    @contextlib.contextmanager
    def _fp32_head(self) -> Iterator[None]:
        """A low-precision model's output head projects in fp32 inside the block, as on the fast path.

        bf16 logits would round every behaviour log-prob the trainer's importance ratios divide by
        (FastDecoder keeps an fp32 copy of the head for the same reason); the head runs on one
        position per row, so fp32 costs little. Only the head's own `forward` is swapped, for this
        forward pass alone: whatever the model does to its logits after the head (scaling,
        soft-capping) applies to the fp32 ones, and a caller's model is left as it was. The fp32
        copy is rebuilt when the head's weight changes (a weight update writes it in place).
        """
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        if not isinstance(head, torch.nn.Linear) or head.weight.dtype == torch.float32:
            yield
            return
        weight = head.weight
        key = (weight.data_ptr(), weight._version)
        if self._head32 is None or self._head32[0] != key:
            bias = None if head.bias is None else head.bias.float()
            self._head32 = (key, weight.float(), bias)
        _, weight32, bias32 = self._head32
        own = head.__dict__.get("forward")  # an instance-level forward the caller set, put back after
        head.forward = lambda hidden: F.linear(hidden.float(), weight32, bias32)
        try:
            yield
        finally:
            if own is None:
                del head.forward
            else:
                head.forward = own

    def _prefill(self, requests: list[_Request], version: int) -> None:
        misses, hits = [], []
        for request in requests:
            hit = self.prefix_cache.lookup(request.prompt_ids)
            if hit is None:
                misses.append(request)
            else:
                hits.append((request, hit))
        if hits:
            self._prefill_from_prefixes(hits, version)
        if misses:
            self._prefill_batch(misses, version)

    def _prefill_from_prefixes(
        self, hits: list[tuple[_Request, tuple[int, list[torch.Tensor], list[torch.Tensor]]]], version: int
    ) -> None:
        """One forward for all cache hits: row = [pad | cached prefix KV | pad | new suffix].

        Rows have different prefix and suffix lengths, so each is right-aligned in both
        parts; the hole between them is masked out and positions count real tokens only,
        so the math is the same as an unpadded forward.
        """
        prefix_width = max(cached for _, (cached, _, _) in hits)
        suffix_width = max(len(request.prompt_ids) - cached for request, (cached, _, _) in hits)
        rows = len(hits)
        cache = self._new_cache()
        for index in range(len(hits[0][1][1])):
            keys = torch.cat([pad_left(hit[1][index], prefix_width, 2) for _, hit in hits], dim=0)
            values = torch.cat([pad_left(hit[2][index], prefix_width, 2) for _, hit in hits], dim=0)
            cache.update(keys, values, index)
        ids = torch.full((rows, suffix_width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((rows, prefix_width + suffix_width), dtype=torch.long)
        positions = torch.zeros((rows, suffix_width), dtype=torch.long)
        requests = []
        for row, (request, (cached, _, _)) in enumerate(hits):
            suffix = request.prompt_ids[cached:]
            ids[row, suffix_width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[row, prefix_width - cached : prefix_width] = 1
            mask[row, prefix_width + suffix_width - len(suffix) :] = 1
            positions[row, suffix_width - len(suffix) :] = torch.arange(cached, cached + len(suffix))
            self.stats.prefill_tokens += len(suffix)
            request.weights_epoch = self._weights_epoch
            requests.append(request)
        logits = self._forward(ids, mask, positions, cache)
        tokens = self._sample(requests, logits, version)
        self._merge(requests, cache, mask, mask.sum(-1), tokens)

    def _prefill_batch(self, requests: list[_Request], version: int) -> None:
        longest = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(requests), longest), dtype=torch.long)
        for row, request in enumerate(requests):
            n = len(request.prompt_ids)
            ids[row, longest - n :] = torch.tensor(request.prompt_ids, dtype=torch.long)
            mask[row, longest - n :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self._new_cache()
        logits = self._forward(ids, mask, positions, cache)
        self.stats.prefill_tokens += int(mask.sum())
        lengths = mask.sum(-1)
        for request in requests:
            request.weights_epoch = self._weights_epoch
        tokens = self._sample(requests, logits, version)
        self._merge(requests, cache, mask, lengths, tokens)

    def _decode(self, version: int) -> None:
        batch = self._batch
        ids = torch.tensor(batch.next_tokens, dtype=torch.long).unsqueeze(-1)
        batch.mask = torch.cat([batch.mask, torch.ones((len(batch), 1), dtype=batch.mask.dtype)], dim=-1)
        positions = batch.lengths.unsqueeze(-1)
        logits = self._forward(ids, batch.mask, positions, batch.cache)
        batch.lengths = batch.lengths + 1
        self.stats.decode_steps += 1
        self.stats.batch_size_sum += len(batch)
        batch.next_tokens = self._sample(batch.requests, logits, version)

    def _sample(self, requests: list[_Request], logits: torch.Tensor, version: int) -> list[int]:
        tokens, logprobs = sample_tokens(logits, [r.sampling for r in requests], [r.generator for r in requests])
        for request, token, logprob in zip(requests, tokens, logprobs):
            if request.aborted or request.finish_reason is not None:
                continue
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            request.versions.append(version)
            self.stats.generated_tokens += 1
            stops = request.sampling.stop_token_ids or self.stop_token_ids
            if token in stops:
                request.finish_reason = "stop"
            elif len(request.output_ids) >= request.sampling.max_new_tokens:
                request.finish_reason = "length"
            elif len(request.prompt_ids) + len(request.output_ids) >= self.max_positions:
                request.finish_reason = "length"
            if request.finish_reason is not None:
                self._finished_in_step += 1
        return tokens

    def _merge(
        self, requests: list[_Request], cache: Any, mask: torch.Tensor, lengths: torch.Tensor, tokens: list[int]
    ) -> None:
        batch = self._batch
        if not batch:
            batch.cache, batch.mask, batch.lengths = cache, mask, lengths
            batch.requests, batch.next_tokens = list(requests), list(tokens)
            return
        width = max(batch.mask.shape[1], mask.shape[1])
        batch.mask = torch.cat([pad_left(batch.mask, width, 1), pad_left(mask, width, 1)], dim=0)
        batch.lengths = torch.cat([batch.lengths, lengths])
        for old, new in zip(batch.cache.layers, cache.layers):
            old.keys = torch.cat([pad_left(old.keys, width, 2), pad_left(new.keys, width, 2)], dim=0)
            old.values = torch.cat([pad_left(old.values, width, 2), pad_left(new.values, width, 2)], dim=0)
        batch.requests.extend(requests)
        batch.next_tokens.extend(tokens)

    def _load_weights(self, source: Any, version: int) -> None:
        if isinstance(source, (str, Path)):  # checked like a distributed update: names, shapes, dtypes, finite
            from rollhub.inference.weight_sync import read_checked_checkpoint

            specs = {name: (tuple(t.shape), t.dtype) for name, t in self.model.state_dict().items()}
            source = read_checked_checkpoint(source, specs)
        if not isinstance(source, dict):
            raise TypeError(f"update_weights takes a state dict or an HF checkpoint dir, not {type(source).__name__}")
        with torch.no_grad():
            own = self.model.state_dict()
            unknown = [k for k in source if k not in own]
            if unknown:
                raise ValueError(f"update_weights: {len(unknown)} unknown parameter names, e.g. {unknown[:3]}")
            # all or nothing: every shape is checked before the first copy (copy_ would broadcast a row)
            for name, tensor in source.items():
                if tuple(tensor.shape) != tuple(own[name].shape):
                    raise ValueError(
                        f"update_weights: {name} has shape {list(tensor.shape)}, the model's is "
                        f"{list(own[name].shape)}; nothing was loaded"
                    )
            for name, tensor in source.items():
                own[name].copy_(tensor.detach().to(own[name].dtype))
        # One mechanism for every weight change: forget the last signature so that the cache is
        # dropped and the fast path repacked now, even when only buffers changed (parameters
        # alone make the signature), and the next step does not do it again.
        self._weights_seen = []
        self._follow_weights()
        self.weight_version = int(version)
        logger.info("engine weights updated to version %d (%d tensors)", version, len(source))
