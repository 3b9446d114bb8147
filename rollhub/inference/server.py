"""`rollhub serve`: the in-process engine behind the SGLang-native HTTP subset.

So the SGLang client path (rollhub/inference/engines/sglang.py) runs on a CPU machine, and any
SGLang-speaking tool can use our engine. Endpoints and shapes follow SGLang's native HTTP
API: `/generate` (input_ids or text, single or
batch, `return_logprob`, `meta_info.output_token_logprobs` as [logprob, id, null] triples,
`finish_reason` objects), `/abort_request`, `/pause_generation` (mode "abort"),
`/continue_generation`, `/update_weights_from_disk`, `/flush_cache` (400 while busy),
`/get_model_info`, `/get_weight_version`, `/update_weight_version`, `/health`,
`/health_generate`, `/v1/loads`, and the collective weight path `/init_weights_update_group`,
`/update_weights_from_distributed`, `/destroy_weights_update_group` (gloo on CPU, NCCL on a
GPU engine; the trainer side is rollhub/inference/weight_sync.py), inside a weight-update session
(`/begin_weight_update` ... `/end_weight_update`) as SGLang's current release requires, so a client
that forgets the session fails here as it would on a GPU. Streaming is not supported (400).

Weight updates under hostile input: a distributed update is checked name by name against the
served model (known names, exact shapes, float dtypes, no duplicates) before a single byte is
received, tensors arrive in fresh buffers and reach the model only when all arrived, a
broadcast that never comes times out (`weight_sync_timeout_s`) and drops the group instead of
hanging, and a group init is refused while another update is running or a group exists.

Hardening: one server batches the requests of many clients, so a malformed request must be
refused before it reaches the engine (a bad token id in a shared forward pass would fail
every request decoded with it). Every request body is validated here (400 with a JSON
error: token ids in [0, vocab), finite sampling values in range, bounded lengths), and a
bearer token (`api_key`) guards every endpoint except `/health`; `rollhub serve` always has
one (given, from ROLLHUB_API_KEY, or generated per launch into an owner-only key file) unless
`--no-auth` is asked for on a loopback address.

A web page in the operator's browser can reach a loopback server, so requests browsers make
are refused before authentication: an `Origin` or a cross-site `Sec-Fetch-Site` not on the
allow-list (403), a `Host` that is a DNS name other than localhost or an allowed name (403:
DNS rebinding points the page's own name at 127.0.0.1, and the page keeps sending that
name), and a body not declared `application/json` (415: a cross-site `text/plain` or form
POST needs no CORS preflight, a JSON one does). Slow or huge requests cannot hold the
server: bodies are capped (413), a connection that has not sent a whole request head within
`header_timeout_s` (aiohttp's keep-alive timer, which also runs before the first request)
is closed, and so is one whose body is not in within `body_timeout_s` (408). JSON decoding,
validation and tokenisation run on a worker thread, so a long batch of texts does not stall
the event loop that answers every other client; a `text` longer than the context could hold
is refused on its length alone, before it is tokenised.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import math
import os
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from rollhub.inference.engines.base import Generation, SamplingParams
from rollhub.inference.engines.build import EngineConfig, build_engine
from rollhub.inference.engines.hf import HFEngine
from rollhub.inference.engines.sglang import API_KEY_ENV, resolve_api_key
from rollhub.inference.weight_sync import (
    GROUP_NAME_PATTERN,
    UpdateGroup,
    check_weights,
    parse_dtype,
    read_checked_checkpoint,
    receive_tensors,
)

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health"})  # liveness probes need no token (SGLang does the same)
MAX_PROMPTS_PER_REQUEST = 4096
MAX_STOP_TOKEN_IDS = 1024
MAX_NEW_TOKENS_CAP = 1 << 20  # even for models that claim an unbounded context
GREEDY_BELOW = 1e-5  # SGLang's sampling epsilon: smaller temperatures mean greedy (and would overflow)
MAX_VERSION = (1 << 63) - 1
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # a batch of 256 prompts of 4k token ids is ~7 MB of JSON
DEFAULT_HEADER_TIMEOUT_S = 20.0  # above aiohttp clients' 15 s idle keep-alive, so a reused connection is not cut
DEFAULT_BODY_TIMEOUT_S = 60.0
#: no tokenizer packs more characters than this into one token on average over a real prompt,
#: so a text longer than context x this cannot fit and is refused without tokenising it
TEXT_CHARS_PER_TOKEN_BOUND = 32
BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: the types a web page may POST cross-site without a CORS preflight
CORS_SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
LOOPBACK_NAMES = frozenset({"localhost"})


@dataclass(frozen=True)
class RequestLimits:
    """What a request may ask of this engine; checked before anything is queued."""

    vocab_size: int
    max_new_tokens: int
    max_prompt_tokens: int = MAX_NEW_TOKENS_CAP


@dataclass(frozen=True)
class HttpGuard:
    """What a request must look like at the HTTP level (see the module docstring)."""

    allowed_hosts: frozenset[str] = frozenset()
    allowed_origins: frozenset[str] = frozenset()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S


class WeightReceiver:
    """The receiving side of weight sync for one server: at most one update group, and at
    most one weight operation (group init, distributed or disk update) at a time."""

    def __init__(self, engine: HFEngine, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.group: UpdateGroup | None = None
        self.group_name: str | None = None
        self.busy: str | None = None  # what is running, for the refusal message
        self.session_open = False  # between /begin_weight_update and /end_weight_update
        self.specs = {name: (tuple(t.shape), t.dtype) for name, t in engine.model.state_dict().items()}

    def claim(self, what: str) -> None:
        if self.busy is not None:
            raise RequestError(f"refused: a weight operation is running ({self.busy}); retry when it is done")
        self.busy = what

    def drop_group(self) -> None:
        group, self.group, self.group_name = self.group, None, None
        if group is not None:
            group.close()


ENGINE_KEY = web.AppKey("engine", HFEngine)
LIMITS_KEY = web.AppKey("limits", RequestLimits)
WEIGHTS_KEY = web.AppKey("weights", WeightReceiver)
GUARD_KEY = web.AppKey("guard", HttpGuard)
PARSER_KEY = web.AppKey("parser", ThreadPoolExecutor)
MAX_WORLD_SIZE = 1 << 16


class RequestError(ValueError):
    """A client's mistake: answered `status` (400) with this message; the engine never sees it."""

    def __init__(self, message: str, status: int = 400, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close  # the connection is in an unknown state (a body half read): drop it


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def _bad_request(message: str) -> web.Response:
    return _error(message, 400)


def limits_for(engine: HFEngine) -> RequestLimits:
    """Vocab size from the embedding table (ids beyond it crash the forward pass)."""
    embeddings = engine.model.get_input_embeddings()
    vocab = getattr(embeddings, "num_embeddings", None) or int(engine.model.config.vocab_size)
    context = min(int(engine.max_positions), MAX_NEW_TOKENS_CAP)
    return RequestLimits(vocab_size=int(vocab), max_new_tokens=context, max_prompt_tokens=context)


# --- validation ----------------------------------------------------------------------


def _show(value: Any) -> str:
    """A value for an error message: clients may send megabytes; echo only the start."""
    try:
        text = repr(value)
    except RecursionError:
        return "<a deeply nested value>"
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(params: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = params.get(key)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        raise RequestError(f"sampling_params.{key} must be an integer in [{low}, {high}], got {_show(value)}")
    return value


def _finite(params: dict[str, Any], key: str, default: float) -> float:
    value = params.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise RequestError(f"sampling_params.{key} must be a finite number, got {_show(value)}")
    return float(value)


def _token_ids(value: Any, what: str, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or not value:
        raise RequestError(f"{what} must be a non-empty list of token ids")
    for token in value:
        if not _is_int(token) or not 0 <= token < vocab_size:
            raise RequestError(f"{what} holds {_show(token)}: token ids must be integers in [0, {vocab_size})")
    return value


def sampling_from_json(params: Any, limits: RequestLimits | None = None) -> SamplingParams:
    """SGLang `sampling_params` -> ours, every value checked (unknown keys ignored, as SGLang
    clients expect). Temperatures below SGLang's epsilon mean greedy, as in SGLang."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RequestError("sampling_params must be a JSON object")
    max_new = limits.max_new_tokens if limits is not None else MAX_NEW_TOKENS_CAP
    temperature = _finite(params, "temperature", 1.0)
    if temperature < 0:
        raise RequestError(f"sampling_params.temperature must be >= 0, got {temperature}")
    top_p = _finite(params, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise RequestError(f"sampling_params.top_p must be in (0, 1], got {top_p}")
    top_k = _int_in(params, "top_k", -1, -1, 1 << 30)
    if top_k == 0:
        raise RequestError("sampling_params.top_k must be -1 (disabled) or >= 1, got 0")
    stop_ids = params.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise RequestError(f"sampling_params.stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} ids")
    if not all(_is_int(t) and 0 <= t < 1 << 63 for t in stop_ids):
        raise RequestError("sampling_params.stop_token_ids must hold non-negative integers")
    return SamplingParams(
        max_new_tokens=_int_in(params, "max_new_tokens", 128, 0, max_new),
        temperature=0.0 if temperature < GREEDY_BELOW else temperature,
        top_p=top_p,
        top_k=top_k,
        stop_token_ids=tuple(stop_ids),
        seed=_int_in(params, "sampling_seed", None, 0, (1 << 63) - 1),  # type: ignore[arg-type]
    )


@dataclass
class GenerateRequest:
    """A validated `/generate` body: what the engine is asked, prompt by prompt."""

    prompts: list[list[int]]
    rids: list[str]
    sampling: SamplingParams
    return_logprob: bool
    batched: bool


def _prompts(body: dict[str, Any], engine: HFEngine, limits: RequestLimits) -> tuple[list[list[int]], bool]:
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise RequestError("exactly one of input_ids or text is required")
    if text is not None:
        batched = isinstance(text, list)
        texts = text if batched else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise RequestError("text must be a string or a non-empty list of strings")
        if len(texts) > MAX_PROMPTS_PER_REQUEST:
            raise RequestError(f"at most {MAX_PROMPTS_PER_REQUEST} prompts per request, got {len(texts)}")
        if engine.tokenizer is None:
            raise RequestError("this server has no tokenizer; send input_ids")
        context = limits.max_prompt_tokens
        longest = context * TEXT_CHARS_PER_TOKEN_BOUND
        for index, one in enumerate(texts):
            if len(one) > longest:  # decided on the length alone: tokenising megabytes is the attack
                raise RequestError(
                    f"text[{index}] has {len(one)} characters, more than the model's context of {context} "
                    f"tokens can hold (at most {longest} characters); shorten it"
                )
        ids = []
        for index, one in enumerate(texts):
            encoded = list(engine.tokenizer.encode(one, add_special_tokens=False))
            if len(encoded) >= context:
                raise RequestError(
                    f"text[{index}] is {len(encoded)} tokens, which leaves no room in the model's context "
                    f"of {context} tokens; shorten it"
                )
            ids.append(encoded)
        ids = ids if batched else ids[0]
    batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    if not batched:
        return [_token_ids(ids, "input_ids", limits.vocab_size)], False
    if len(ids) > MAX_PROMPTS_PER_REQUEST:
        raise RequestError(f"at most {MAX_PROMPTS_PER_REQUEST} prompts per request, got {len(ids)}")
    return [_token_ids(p, f"input_ids[{i}]", limits.vocab_size) for i, p in enumerate(ids)], True


def _rids(raw: Any, count: int) -> list[str]:
    if raw is None:
        return [uuid.uuid4().hex for _ in range(count)]
    rids = raw if isinstance(raw, list) else [raw]
    if not all(isinstance(r, str) and r for r in rids):
        raise RequestError("rid must be a non-empty string or a list of them")
    if len(rids) != count:
        raise RequestError("rid must have one entry per prompt")
    if len(set(rids)) != len(rids):
        raise RequestError("rid values must be unique within a request")
    return rids


def parse_generate(body: Any, engine: HFEngine, limits: RequestLimits) -> GenerateRequest:
    """Check a `/generate` body completely; raises RequestError before anything is queued."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("stream"):
        raise RequestError("streaming is not supported by rollhub serve; send stream=false")
    return_logprob = body.get("return_logprob", False)
    if not isinstance(return_logprob, bool) and return_logprob is not None:
        raise RequestError("return_logprob must be true or false")
    prompts, batched = _prompts(body, engine, limits)
    return GenerateRequest(
        prompts=prompts,
        rids=_rids(body.get("rid"), len(prompts)),
        sampling=sampling_from_json(body.get("sampling_params"), limits),
        return_logprob=bool(return_logprob),
        batched=batched,
    )


def finish_reason_json(generation: Generation) -> dict[str, Any]:
    if generation.finish_reason == "stop":
        return {"type": "stop", "matched": generation.token_ids[-1] if generation.token_ids else None}
    if generation.finish_reason == "length":
        return {"type": "length", "length": len(generation.token_ids)}
    message = "Abort before prefill" if not generation.token_ids else "Abort in generation"
    return {"type": "abort", "message": message, "status_code": 200, "err_type": None}


def generation_json(engine: HFEngine, generation: Generation, return_logprob: bool, started: float) -> dict[str, Any]:
    tokenizer = engine.tokenizer
    text = tokenizer.decode(generation.token_ids, skip_special_tokens=True) if tokenizer is not None else ""
    meta: dict[str, Any] = {
        "id": generation.request_id,
        "finish_reason": finish_reason_json(generation),
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": len(generation.token_ids),
        "cached_tokens": 0,
        "weight_version": str(generation.token_versions[-1] if generation.token_versions else engine.weight_version),
        "e2e_latency": time.perf_counter() - started,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(generation.logprobs, generation.token_ids)]
    meta["output_token_versions"] = list(generation.token_versions)  # exact when a push lands mid-request
    return {"text": text, "output_ids": list(generation.token_ids), "meta_info": meta}


async def _generate_all(engine: HFEngine, parsed: GenerateRequest) -> list[Generation]:
    """All prompts of one request; if one is refused (e.g. its rid is already in flight) or
    the client goes away, the others are aborted instead of decoding for nobody."""
    tasks = [
        asyncio.ensure_future(engine.generate(prompt, parsed.sampling, request_id=rid))
        for prompt, rid in zip(parsed.prompts, parsed.rids)
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        failed = any(t.done() and not t.cancelled() and t.exception() is not None for t in tasks)
        if failed or not all(t.done() for t in tasks):
            for task in tasks:
                task.cancel()  # a cancelled HFEngine.generate aborts its request
            await asyncio.gather(*tasks, return_exceptions=True)
    errors = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    if errors:
        if isinstance(errors[0], ValueError):
            raise RequestError(str(errors[0]))
        raise errors[0]
    return [task.result() for task in tasks]


def _parse_generate_body(raw: bytes, engine: HFEngine, limits: RequestLimits) -> GenerateRequest:
    """Decode, validate and tokenise one `/generate` body (on the parser thread)."""
    try:
        return parse_generate(decode_json(raw), engine, limits)
    except RecursionError:
        raise RequestError("the request body nests too deeply") from None


async def handle_generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    raw = await _read_body(request)
    loop = asyncio.get_running_loop()
    parser = request.app[PARSER_KEY]
    parsed = await loop.run_in_executor(parser, _parse_generate_body, raw, engine, request.app[LIMITS_KEY])
    started = time.perf_counter()
    generations = await _generate_all(engine, parsed)

    def reply_body() -> bytes:  # decoding and serialising a big batch is CPU work too: off the event loop
        results = [generation_json(engine, g, parsed.return_logprob, started) for g in generations]
        return json.dumps(results if parsed.batched else results[0]).encode()

    body = await loop.run_in_executor(parser, reply_body)
    return web.Response(body=body, content_type="application/json", charset="utf-8")


async def handle_abort(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _json_or_empty(request)
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise RequestError("rid must be a string")
    if body.get("abort_all"):
        await engine.abort_all()
    elif rid is not None:
        await engine.abort(rid)
    return web.Response(status=200)


async def handle_pause(request: web.Request) -> web.Response:
    body = await _json_or_empty(request)
    mode = body.get("mode", "abort")
    if mode != "abort":
        return _bad_request(f"pause mode {_show(mode)} is not supported by rollhub serve; use 'abort'")
    await request.app[ENGINE_KEY].pause()
    return web.json_response({"success": True})


async def handle_continue(request: web.Request) -> web.Response:
    await request.app[ENGINE_KEY].resume()
    return web.json_response({"success": True})


async def handle_update_from_disk(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _json_or_empty(request)
    path = body.get("model_path")
    if not path or not isinstance(path, str):
        return web.json_response({"success": False, "message": "model_path (a string) is required"}, status=400)
    raw_version = body.get("weight_version")
    version = _version(raw_version, "weight_version") if raw_version is not None else engine.weight_version + 1
    in_flight = engine.num_in_flight
    receiver = request.app[WEIGHTS_KEY]
    receiver.claim("update_weights_from_disk")
    try:
        # read and checked in full before the model is touched: a refused update changes nothing
        state = await asyncio.to_thread(read_checked_checkpoint, path, receiver.specs)
        if body.get("abort_all_requests"):
            await engine.abort_all()
        await engine.update_weights(state, version)
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        message = f"update refused, weights and version unchanged: {str(exc)[:500]}"
        return web.json_response({"success": False, "message": message, "num_paused_requests": 0}, status=400)
    finally:
        receiver.busy = None
    return web.json_response(
        {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": in_flight}
    )


def _failed(message: str) -> web.Response:
    """SGLang's answer to a weight operation that was valid but did not succeed."""
    return web.json_response({"success": False, "message": message}, status=400)


def _group_name(body: dict[str, Any]) -> str:
    name = body.get("group_name", "weight_update_group")
    if not isinstance(name, str) or not GROUP_NAME_PATTERN.match(name):
        raise RequestError(f"group_name must match {GROUP_NAME_PATTERN.pattern}, got {_show(name)}")
    return name


def _required_int(body: dict[str, Any], key: str, low: int, high: int) -> int:
    value = body.get(key)
    if not _is_int(value) or not low <= value <= high:
        raise RequestError(f"{key} must be an integer in [{low}, {high}], got {_show(value)}")
    return value


async def handle_init_weights_update_group(request: web.Request) -> web.Response:
    """Join the trainer's weight-update group as rank `rank_offset` (one rank per server)."""
    engine, receiver = request.app[ENGINE_KEY], request.app[WEIGHTS_KEY]
    body = await _json_or_empty(request)
    address = body.get("master_address")
    if not isinstance(address, str) or not 0 < len(address) <= 253 or any(c.isspace() or c in "/@" for c in address):
        raise RequestError(f"master_address must be a host name or IP address, got {_show(address)}")
    port = _required_int(body, "master_port", 1, 65535)
    world_size = _required_int(body, "world_size", 2, MAX_WORLD_SIZE)
    rank = _required_int(body, "rank_offset", 1, world_size - 1)
    name = _group_name(body)
    backend = body.get("backend", "nccl")
    if backend not in ("gloo", "nccl"):
        raise RequestError(f"backend must be 'gloo' or 'nccl', got {_show(backend)}")
    if backend == "nccl" and engine.device.type != "cuda":
        raise RequestError("backend 'nccl' needs a GPU engine; this server runs on the CPU: use 'gloo'")
    receiver.claim("init_weights_update_group")  # refused while any weight operation runs
    try:
        if receiver.group is not None:
            raise RequestError(
                f"refused: this server is already in weight update group '{receiver.group_name}'; "
                "call /destroy_weights_update_group first"
            )
        group = await asyncio.to_thread(
            UpdateGroup.join,
            master_address=address,
            master_port=port,
            rank=rank,
            world_size=world_size,
            group_name=name,
            backend=backend,
            timeout_s=receiver.timeout_s,
        )
    except RequestError:
        raise
    except (RuntimeError, ValueError, OSError) as exc:  # torch raises DistStoreError / RuntimeError on timeouts
        return _failed(f"could not join the weight update group at {address}:{port}: {str(exc)[:300]}")
    finally:
        receiver.busy = None
    if backend == "nccl":
        group.device = str(engine.device)  # NCCL receives straight onto the engine's GPU
    receiver.group, receiver.group_name = group, name
    logger.info("joined weight update group '%s' (%s) as rank %d of %d", name, backend, rank, world_size)
    return web.json_response({"success": True, "message": f"joined '{name}' as rank {rank} of {world_size}"})


def _tensor_specs(body: dict[str, Any], receiver: WeightReceiver) -> tuple[list[str], list[Any], list[tuple]]:
    """names / dtypes / shapes checked against the served model before anything is received."""
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    if not all(isinstance(v, list) for v in (names, dtypes, shapes)):
        raise RequestError("names, dtypes and shapes must be lists")
    if not names or not len(names) == len(dtypes) == len(shapes):
        raise RequestError("names, dtypes and shapes must be non-empty and of equal length")
    if len(names) > len(receiver.specs):
        raise RequestError(f"at most {len(receiver.specs)} tensors (the model's count), got {len(names)}")
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise RequestError("names must be strings and must not repeat")
    parsed_dtypes, parsed_shapes = [], []
    for name, dtype, shape in zip(names, dtypes, shapes):
        if name not in receiver.specs:
            raise RequestError(f"unknown parameter name {_show(name)}: not in the served model")
        expected = receiver.specs[name][0]
        if not isinstance(shape, list) or not all(_is_int(d) for d in shape) or tuple(shape) != expected:
            raise RequestError(f"shape of {name} must be {list(expected)}, got {_show(shape)}")
        try:
            parsed_dtypes.append(parse_dtype(dtype))
        except ValueError as exc:
            raise RequestError(f"{name}: {exc}") from None
        parsed_shapes.append(expected)
    return names, parsed_dtypes, parsed_shapes


async def handle_update_weights_from_distributed(request: web.Request) -> web.Response:
    """Receive one broadcast per name from rank 0, then load them all and take the version."""
    engine, receiver = request.app[ENGINE_KEY], request.app[WEIGHTS_KEY]
    body = await _json_or_empty(request)
    name = _group_name(body) if "group_name" in body else receiver.group_name
    if receiver.group is None:
        raise RequestError("no weight update group: call /init_weights_update_group first")
    if name != receiver.group_name:
        raise RequestError(f"group_name {_show(name)} is not this server's group '{receiver.group_name}'")
    if not receiver.session_open:  # SGLang refuses it without receiving; dropping the group fails rank 0 fast
        receiver.drop_group()
        return _failed(
            "update_weights_from_distributed must run between begin_weight_update() and end_weight_update() "
            "(the weight update group was dropped)"
        )
    receiver.claim("update_weights_from_distributed")
    try:
        names, dtypes, shapes = _tensor_specs(body, receiver)
        raw_version = body.get("weight_version")
        version = _version(raw_version, "weight_version") if raw_version is not None else engine.weight_version + 1
        load_format = body.get("load_format")
        if load_format not in (None, "flattened_bucket"):
            raise RequestError(f"load_format {_show(load_format)} is not supported; use 'flattened_bucket' or none")
    except RequestError as exc:
        # rank 0 is broadcasting what we refused: leaving the group fails its broadcast at once
        # (instead of after its timeout) and no stale bytes are left queued for the next update
        receiver.drop_group()
        receiver.busy = None
        raise RequestError(f"{exc} (refused before receiving; the weight update group was dropped)") from None
    try:
        started = time.perf_counter()
        try:
            tensors = await asyncio.to_thread(receive_tensors, receiver.group, names, dtypes, shapes, load_format)
        except (RuntimeError, ValueError) as exc:  # gloo / NCCL timeouts and broken peers
            receiver.drop_group()
            return _failed(
                f"receiving weights failed after {time.perf_counter() - started:.1f} s ({str(exc)[:300]}); "
                "the group was dropped: initialise a new one"
            )
        try:
            check_weights(tensors, receiver.specs)  # shapes were checked before receiving; values now
        except ValueError as exc:
            return _failed(f"refused the received weights, weights and version unchanged: {exc}")
        if body.get("abort_all_requests"):
            await engine.abort_all()
        try:
            await engine.update_weights(tensors, version)
        except (ValueError, TypeError, RuntimeError) as exc:
            return _failed(f"loading the received weights failed: {exc}")
    finally:
        receiver.busy = None
    return web.json_response({"success": True, "message": f"updated {len(names)} tensors to version {version}"})


async def handle_begin_weight_update(request: web.Request) -> web.Response:
    """Open the weight-update session distributed updates must run in (SGLang's rule and messages)."""
    receiver = request.app[WEIGHTS_KEY]
    body = await _json_or_empty(request)
    selector = body.get("selector", "all")
    if selector not in ("target", "draft", "all"):
        raise RequestError(f"selector must be 'target', 'draft' or 'all', got {_show(selector)}")
    if receiver.session_open:
        return _failed("a weight-update session is already open; call end_weight_update() first")
    receiver.session_open = True
    return web.json_response({"success": True, "message": "Success"})


async def handle_end_weight_update(request: web.Request) -> web.Response:
    receiver = request.app[WEIGHTS_KEY]
    await _json_or_empty(request)
    if receiver.busy is not None:
        raise RequestError(f"refused: a weight operation is running ({receiver.busy})")
    if not receiver.session_open:
        return _failed("no weight-update session is open; call begin_weight_update() first")
    receiver.session_open = False
    return web.json_response({"success": True, "message": "Success"})


async def handle_destroy_weights_update_group(request: web.Request) -> web.Response:
    receiver = request.app[WEIGHTS_KEY]
    body = await _json_or_empty(request)
    name = _group_name(body) if "group_name" in body else receiver.group_name
    if receiver.busy is not None:
        raise RequestError(f"refused: a weight operation is running ({receiver.busy})")
    if receiver.group is None or name != receiver.group_name:
        return _failed(f"no weight update group named {_show(name)}")
    receiver.drop_group()
    return web.json_response({"success": True, "message": f"left '{name}'"})


async def handle_flush_cache(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.num_in_flight:
        return web.Response(status=400, text=f"Cache not flushed: {engine.num_in_flight} requests running or waiting")
    engine.prefix_cache.clear()
    return web.Response(status=200, text="Cache flushed.")


async def handle_model_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": str(engine.weight_version),
        }
    )


async def handle_weight_version(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": str(request.app[ENGINE_KEY].weight_version)})


async def handle_update_weight_version(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _json_or_empty(request)
    version = _version(body.get("new_version"), "new_version")
    if body.get("abort_all_requests"):
        await engine.abort_all()
    engine.weight_version = version
    return web.json_response({"success": True, "message": "ok", "new_version": str(engine.weight_version)})


async def handle_health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def handle_health_generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.paused:
        return web.Response(status=200)  # a paused engine is healthy; a generation would block
    try:
        await asyncio.wait_for(engine.generate([engine.pad_token_id], SamplingParams(max_new_tokens=1)), timeout=30)
    except (TimeoutError, RuntimeError):
        return web.Response(status=503)
    return web.Response(status=200)


async def handle_loads(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {"num_reqs": engine.num_in_flight, "num_running_reqs": engine.num_in_flight, "num_waiting_reqs": 0}
    )


def _version(value: Any, key: str) -> int:
    """Versions travel as strings in SGLang's API ("3"); both forms are accepted. Only ASCII
    digits: str.isdigit() also holds for "\u0663" (which int() reads as 3) and "\u00b2" (which int() refuses)."""
    if _is_int(value) and 0 <= value <= MAX_VERSION:
        return value
    if isinstance(value, str) and 0 < len(value) <= 19 and value.isascii() and value.isdigit():
        if int(value) <= MAX_VERSION:
            return int(value)
    raise RequestError(f"{key} must be an integer in [0, 2^63) or its decimal string, got {_show(value)}")


def decode_json(raw: bytes) -> Any:
    """A request body as JSON; every way it can fail is the client's (400), nesting included."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise RequestError("the request body nests JSON too deeply") from None
    except ValueError as exc:  # includes UnicodeDecodeError and over-long integer literals
        raise RequestError(f"the request body must be JSON ({str(exc)[:200]})") from None


async def _read_body(request: web.Request) -> bytes:
    """The whole body, within the size cap and the body timeout."""
    guard = request.app[GUARD_KEY]
    try:
        async with asyncio.timeout(guard.body_timeout_s):
            return await request.read()
    except TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {guard.body_timeout_s:g} s", status=408, close=True
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(_too_large(guard), status=413, close=True) from None


def _too_large(guard: HttpGuard) -> str:
    return f"the request body is larger than this server's limit of {guard.max_body_bytes} bytes"


async def _json_body(request: web.Request) -> Any:
    raw = await _read_body(request)
    return await asyncio.get_running_loop().run_in_executor(request.app[PARSER_KEY], decode_json, raw)


async def _json_or_empty(request: web.Request) -> dict[str, Any]:
    """Control endpoints take an optional JSON object; anything else is a client error."""
    if not request.can_read_body:
        return {}
    if not (await _read_body(request)).strip():
        return {}
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


# --- middlewares -----------------------------------------------------------------------


@web.middleware
async def client_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """RequestError anywhere in a handler -> 400 with a JSON error, logged at debug only."""
    try:
        return await handler(request)
    except RequestError as exc:
        logger.debug("%d on %s: %s", exc.status, request.path, exc)
        response = _error(str(exc), exc.status)
        if exc.close:
            response.force_close()
        return response


def _host_name(header: str) -> str:
    """A Host header's host: lower case, without the port, brackets or one trailing dot."""
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value[:-1] if value.endswith(".") else value


def host_allowed(header: str, allowed: frozenset[str]) -> bool:
    """IP literals, localhost and the configured names. A rebinding page can make its own
    name resolve to us but cannot make the browser send an IP literal or "localhost"."""
    name = _host_name(header)
    if not name:
        return False
    if name in LOOPBACK_NAMES or name in allowed:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def normalize_origin(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


def http_guard(guard: HttpGuard) -> Any:
    """Middleware: refuse what browsers send on a web page's behalf (see the module docstring)."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        hosts = request.headers.getall("Host", [])
        if len(hosts) > 1:
            return _error("more than one Host header", 400)
        if hosts and not host_allowed(hosts[0], guard.allowed_hosts):
            return _error(
                f"Host {_show(hosts[0])} is not a name of this server (a guard against DNS rebinding): connect by "
                "IP address or localhost, or start rollhub serve with --allowed-host NAME",
                403,
            )
        origins = request.headers.getall("Origin", [])
        if origins and not all(normalize_origin(o) in guard.allowed_origins for o in origins):
            return _error(
                f"requests from web pages are refused (Origin {_show(origins[0])}); "
                "allow one with rollhub serve --allowed-origin URL",
                403,
            )
        sites = request.headers.getall("Sec-Fetch-Site", [])
        if not origins and any(site.strip().lower() != "none" for site in sites):
            return _error(f"requests from web pages are refused (Sec-Fetch-Site {_show(sites[0])})", 403)
        if request.method not in BODYLESS_METHODS:
            # a body must be declared JSON; a POST without one (SGLang's `curl -X POST .../flush_cache`)
            # only must not claim a type a web page can send without a CORS preflight
            types = [t.split(";", 1)[0].strip().lower() for t in request.headers.getall("Content-Type", [])]
            empty = request.content_length in (None, 0) and "Transfer-Encoding" not in request.headers
            if (types != ["application/json"] and not empty) or any(t in CORS_SIMPLE_TYPES for t in types):
                return _error("send the body as JSON with the header 'Content-Type: application/json'", 415)
            encodings = request.headers.getall("Content-Encoding", [])
            if any(e.strip().lower() not in ("", "identity") for e in encodings):  # a small gzip can inflate a lot
                return _error("compressed request bodies are not accepted; send plain JSON", 415)
        if request.content_length is not None and request.content_length > guard.max_body_bytes:
            response = _error(_too_large(guard), 413)
            response.force_close()  # its body is not read
            return response
        return await handler(request)

    return check


def bearer_auth(api_key: str) -> Any:
    """Middleware: `Authorization: Bearer <api_key>` on every path but OPEN_PATHS, else 401.

    Compared in constant time on bytes, so the answer time says nothing about the token.
    """
    expected = api_key.encode()

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            valid = hmac.compare_digest(token.strip().encode("utf-8", "replace"), expected)
            if scheme.lower() != "bearer" or not valid:
                response = _error("missing or invalid bearer token (Authorization: Bearer <api key>)", 401)
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
        return await handler(request)

    return check


def build_app(
    engine: HFEngine,
    *,
    api_key: str | None = None,
    weight_sync_timeout_s: float = 300.0,
    allowed_hosts: Any = (),
    allowed_origins: Any = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> web.Application:
    """The aiohttp app; the caller owns the engine (closed on app cleanup).

    `api_key` (None or empty: no authentication; `serve_forever` always passes one unless
    told `--no-auth` on loopback) is required as a bearer token on every endpoint but /health.
    `allowed_hosts` are host names besides IP literals and localhost that clients may use;
    `allowed_origins` are web origins (scheme://host:port) whose pages may call us.
    `weight_sync_timeout_s` bounds joining a weight update group and each broadcast of a
    distributed update (a trainer that never sends cannot wedge us). The HTTP limits hold
    for whichever runner serves the app (they travel as the app's handler arguments).
    """
    guard = HttpGuard(
        allowed_hosts=frozenset(_host_name(h) for h in allowed_hosts),
        allowed_origins=frozenset(normalize_origin(o) for o in allowed_origins),
        max_body_bytes=int(max_body_bytes),
        body_timeout_s=float(body_timeout_s),
    )
    auth = [bearer_auth(api_key)] if api_key else []
    app = web.Application(
        client_max_size=guard.max_body_bytes,
        middlewares=[http_guard(guard), *auth, client_errors],
        handler_args={
            "keepalive_timeout": float(header_timeout_s),  # also closes a connection still sending its head
            "lingering_time": 2.0,  # after a refused body, read (and drop) the rest this long, not aiohttp's 10 s
            "max_headers": 64,
            "max_line_size": 8190,
            "max_field_size": 8190,
        },
    )
    app[ENGINE_KEY] = engine
    app[LIMITS_KEY] = limits_for(engine)
    app[WEIGHTS_KEY] = WeightReceiver(engine, weight_sync_timeout_s)
    app[GUARD_KEY] = guard
    app[PARSER_KEY] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollhub-serve-parse")
    app.router.add_post("/generate", handle_generate)
    app.router.add_post("/abort_request", handle_abort)
    app.router.add_post("/pause_generation", handle_pause)
    app.router.add_post("/continue_generation", handle_continue)
    app.router.add_post("/update_weights_from_disk", handle_update_from_disk)
    app.router.add_post("/init_weights_update_group", handle_init_weights_update_group)
    app.router.add_post("/update_weights_from_distributed", handle_update_weights_from_distributed)
    app.router.add_post("/destroy_weights_update_group", handle_destroy_weights_update_group)
    app.router.add_post("/begin_weight_update", handle_begin_weight_update)
    app.router.add_post("/end_weight_update", handle_end_weight_update)
    app.router.add_route("*", "/flush_cache", handle_flush_cache)
    app.router.add_get("/get_model_info", handle_model_info)
    app.router.add_get("/get_weight_version", handle_weight_version)
    app.router.add_post("/update_weight_version", handle_update_weight_version)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/health_generate", handle_health_generate)
    app.router.add_get("/v1/loads", handle_loads)

    async def close_engine(app: web.Application) -> None:
        app[WEIGHTS_KEY].drop_group()
        app[PARSER_KEY].shutdown(wait=False, cancel_futures=True)
        await app[ENGINE_KEY].close()

    app.on_cleanup.append(close_engine)
    return app


@dataclass(frozen=True)
class ServeKey:
    """The key a `rollhub serve` process requires, and where it came from (never the key itself in logs)."""

    key: str | None
    source: str  # "--api-key", "ROLLHUB_API_KEY", a key file's path, or "none"
    file: Path | None = None  # a key file this launch wrote (removed at exit when it is the default one)


def is_loopback(host: str) -> bool:
    name = _host_name(host)
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def default_key_file(port: int) -> Path:
    """Per user, not world-readable: $XDG_RUNTIME_DIR (a private tmpfs) or ~/.cache."""
    base = os.environ.get("XDG_RUNTIME_DIR") or str(Path.home() / ".cache")
    return Path(base) / "rollhub" / f"serve-{port}.key"


def _write_key_file(path: Path, key: str) -> None:
    """Owner-only, created fresh (never through a link someone else planted)."""
    from rollhub.core.errors import UserError

    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise UserError(f"cannot write the API key file {path} ({exc}); pass --api-key-file PATH elsewhere") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")


def _read_key_file(path: Path) -> str:
    from rollhub.core.errors import UserError

    info = path.lstat()
    if not path.is_file() or path.is_symlink():
        raise UserError(f"the API key file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise UserError(f"the API key file {path} can be read by other users; run 'chmod 600 {path}'")
    key = path.read_text().strip()
    if not key or any(c.isspace() for c in key):
        raise UserError(f"the API key file {path} must hold one key on one line")
    return key


def serve_key(
    api_key: str | None, *, key_file: str | Path | None, no_auth: bool, host: str, port: int = 30000
) -> ServeKey:
    """The key `rollhub serve` requires: --api-key, else an existing --api-key-file, else
    ROLLHUB_API_KEY, else a fresh per-launch key written to the key file (--api-key-file, or
    a default per-user path) for clients to read. `no_auth` is refused beyond loopback."""
    from rollhub.core.errors import UserError

    if no_auth:
        if api_key or key_file is not None:
            raise UserError("--no-auth contradicts --api-key / --api-key-file; drop one")
        if not is_loopback(host):
            raise UserError(
                f"--no-auth is only allowed on a loopback address (127.0.0.1, ::1, localhost), not {host}: "
                f"anyone who can connect could load weights and pause the engine; drop --no-auth and give "
                f"clients the key ({API_KEY_ENV})"
            )
        return ServeKey(None, "none")
    if api_key:
        return ServeKey(api_key, "--api-key")
    if key_file is not None and Path(key_file).exists():
        return ServeKey(_read_key_file(Path(key_file)), str(key_file))
    if from_env := resolve_api_key(None):
        return ServeKey(from_env, API_KEY_ENV)
    path = Path(key_file) if key_file is not None else default_key_file(port)
    if key_file is None and (path.exists() or path.is_symlink()):
        path.unlink()  # the default file is per launch: a previous launch's key must not stay valid
    key = secrets.token_urlsafe(32)
    _write_key_file(path, key)
    return ServeKey(key, str(path), file=path if key_file is None else None)


def _raise_open_file_limit() -> None:
    """Idle clients cost a descriptor each until the header timeout: allow as many as the hard limit."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = hard if hard != resource.RLIM_INFINITY else 1 << 16
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, 1 << 20), hard))
    except (ImportError, ValueError, OSError) as exc:
        logger.debug("could not raise the open file limit: %r", exc)


def serve_forever(
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    threads: int = 1,
    max_batch_size: int = 32,
    api_key: str | None = None,
    api_key_file: str | Path | None = None,
    no_auth: bool = False,
    allowed_hosts: tuple[str, ...] = (),
    allowed_origins: tuple[str, ...] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    seed: int = 0,
    device: str = "cpu",
    weight_sync_timeout_s: float = 300.0,
    dtype: str = "auto",
) -> None:
    """Load the model and serve until interrupted (the `rollhub serve` command).

    Always behind a key (see `serve_key`) unless `no_auth` on loopback; the key is never
    printed, only where it came from. A host name clients may use is allowed besides IP
    literals and localhost: the listening name and this machine's name when not loopback.
    """
    from rollhub.core.errors import UserError

    if not (Path(model_path) / "config.json").exists():
        raise UserError(
            f"{model_path} is not a model directory; create one with 'rollhub model init-tiny --out {model_path}'"
        )
    if max_body_bytes < 1024 or header_timeout_s <= 0 or body_timeout_s <= 0:
        raise UserError("--max-body-mb, --header-timeout-s and --body-timeout-s must be positive (body >= 1 KiB)")
    chosen = serve_key(api_key, key_file=api_key_file, no_auth=no_auth, host=host, port=port)
    names = set(allowed_hosts)
    if not is_loopback(host):
        import socket

        names.add(socket.gethostname())
        if host not in ("0.0.0.0", "::", ""):
            names.add(host)
    import torch

    torch.set_num_threads(threads)
    _raise_open_file_limit()
    engine = build_engine(
        EngineConfig(threads=threads, max_batch_size=max_batch_size, seed=seed, dtype=dtype), model_path, device=device
    )
    if chosen.key is None:
        logger.warning("rollhub serve on %s WITHOUT authentication (--no-auth): any local user can load weights", host)
        auth = "no authentication (--no-auth)"
    elif chosen.file is not None or chosen.source not in ("--api-key", API_KEY_ENV):
        auth = (
            f"bearer token required; the key is in {chosen.source} "
            f"(clients: export {API_KEY_ENV}=$(cat {chosen.source}))"
        )
    else:
        auth = f"bearer token required; the key from {chosen.source}"
    print(f"rollhub serve: {model_path} on http://{host}:{port} (SGLang-native /generate; {auth})", flush=True)
    app = build_app(
        engine,
        api_key=chosen.key,
        weight_sync_timeout_s=weight_sync_timeout_s,
        allowed_hosts=tuple(names),
        allowed_origins=allowed_origins,
        max_body_bytes=max_body_bytes,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
    )
    try:
        web.run_app(app, host=host, port=port, print=None)
    finally:
        if chosen.file is not None:
            chosen.file.unlink(missing_ok=True)
