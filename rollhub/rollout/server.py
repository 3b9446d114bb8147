"""`rollhub serve`: the in-process engine behind the SGLang-native HTTP subset.

So the SGLang client path (rollhub/rollout/engines/sglang.py) runs on a CPU machine, and any
SGLang-speaking tool can use our engine. Endpoints and shapes follow SGLang's native HTTP
API: `/generate` (input_ids or text, single or
batch, `return_logprob`, `meta_info.output_token_logprobs` as [logprob, id, null] triples,
`finish_reason` objects), `/abort_request`, `/pause_generation` (mode "abort"),
`/continue_generation`, `/update_weights_from_disk`, `/flush_cache` (400 while busy),
`/get_model_info`, `/get_weight_version`, `/update_weight_version`, `/health`,
`/health_generate`, `/v1/loads`. Streaming is not supported (400).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from rollhub.rollout.engines.base import Generation, SamplingParams
from rollhub.rollout.engines.build import EngineConfig, build_engine
from rollhub.rollout.engines.hf import HFEngine

logger = logging.getLogger(__name__)

ENGINE_KEY = web.AppKey("engine", HFEngine)


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=400)


def sampling_from_json(params: dict[str, Any]) -> SamplingParams:
    """SGLang `sampling_params` -> ours (unknown keys ignored, as SGLang clients expect)."""
    stop_ids = params.get("stop_token_ids") or ()
    return SamplingParams(
        max_new_tokens=int(params.get("max_new_tokens", 128)),
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=int(params.get("top_k", -1)),
        stop_token_ids=tuple(int(t) for t in stop_ids),
        seed=params.get("sampling_seed"),
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
    return {"text": text, "output_ids": list(generation.token_ids), "meta_info": meta}


async def handle_generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await request.json()
    except ValueError:
        return _bad_request("body must be JSON")
    if body.get("stream"):
        return _bad_request("streaming is not supported by rollhub serve; send stream=false")
    inputs = body.get("input_ids")
    if inputs is None and body.get("text") is not None:
        texts = body["text"]
        encode = lambda t: list(engine.tokenizer.encode(t, add_special_tokens=False))  # noqa: E731
        inputs = [encode(t) for t in texts] if isinstance(texts, list) else encode(texts)
    if not inputs:
        return _bad_request("exactly one of input_ids or text is required")
    batched = isinstance(inputs[0], list)
    prompts = inputs if batched else [inputs]
    rids = body.get("rid")
    if rids is None:
        rids = [uuid.uuid4().hex for _ in prompts]
    elif not isinstance(rids, list):
        rids = [rids]
    if len(rids) != len(prompts):
        return _bad_request("rid must have one entry per prompt")
    try:
        sampling = sampling_from_json(body.get("sampling_params") or {})
    except (TypeError, ValueError) as exc:
        return _bad_request(f"bad sampling_params: {exc}")
    return_logprob = bool(body.get("return_logprob", False))
    started = time.perf_counter()
    try:
        generations = await asyncio.gather(
            *(engine.generate(p, sampling, request_id=str(r)) for p, r in zip(prompts, rids))
        )
    except ValueError as exc:
        return _bad_request(str(exc))
    results = [generation_json(engine, g, return_logprob, started) for g in generations]
    return web.json_response(results if batched else results[0])


async def handle_abort(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _json_or_empty(request)
    if body.get("abort_all"):
        await engine.abort_all()
    elif body.get("rid") is not None:
        await engine.abort(str(body["rid"]))
    return web.Response(status=200)


async def handle_pause(request: web.Request) -> web.Response:
    body = await _json_or_empty(request)
    mode = body.get("mode", "abort")
    if mode != "abort":
        return _bad_request(f"pause mode '{mode}' is not supported by rollhub serve; use 'abort'")
    await request.app[ENGINE_KEY].pause()
    return web.json_response({"success": True})


async def handle_continue(request: web.Request) -> web.Response:
    await request.app[ENGINE_KEY].resume()
    return web.json_response({"success": True})


async def handle_update_from_disk(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _json_or_empty(request)
    path = body.get("model_path")
    if not path:
        return web.json_response({"success": False, "message": "model_path is required"}, status=400)
    in_flight = engine.num_in_flight
    if body.get("abort_all_requests"):
        await engine.abort_all()
    version = body.get("weight_version")
    try:
        await engine.update_weights(path, int(version) if version is not None else engine.weight_version + 1)
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        return web.json_response(
            {"success": False, "message": f"update failed: {exc}", "num_paused_requests": 0}, status=400
        )
    return web.json_response(
        {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": in_flight}
    )


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
    if body.get("abort_all_requests"):
        await engine.abort_all()
    engine.weight_version = int(body["new_version"])
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


async def _json_or_empty(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def build_app(engine: HFEngine) -> web.Application:
    """The aiohttp app; the caller owns the engine (closed on app cleanup)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = engine
    app.router.add_post("/generate", handle_generate)
    app.router.add_post("/abort_request", handle_abort)
    app.router.add_post("/pause_generation", handle_pause)
    app.router.add_post("/continue_generation", handle_continue)
    app.router.add_post("/update_weights_from_disk", handle_update_from_disk)
    app.router.add_route("*", "/flush_cache", handle_flush_cache)
    app.router.add_get("/get_model_info", handle_model_info)
    app.router.add_get("/get_weight_version", handle_weight_version)
    app.router.add_post("/update_weight_version", handle_update_weight_version)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/health_generate", handle_health_generate)
    app.router.add_get("/v1/loads", handle_loads)

    async def close_engine(app: web.Application) -> None:
        await app[ENGINE_KEY].close()

    app.on_cleanup.append(close_engine)
    return app


def serve_forever(
    model_path: str, *, host: str = "127.0.0.1", port: int = 30000, threads: int = 1, max_batch_size: int = 32
) -> None:
    """Load the model and serve until interrupted (the `rollhub serve` command)."""
    from pathlib import Path

    from rollhub.core.errors import UserError

    if not (Path(model_path) / "config.json").exists():
        raise UserError(
            f"{model_path} is not a model directory; create one with 'rollhub model init-tiny --out {model_path}'"
        )
    import torch

    torch.set_num_threads(threads)
    engine = build_engine(EngineConfig(threads=threads, max_batch_size=max_batch_size), model_path)
    print(f"rollhub serve: {model_path} on http://{host}:{port} (SGLang-native /generate)", flush=True)
    web.run_app(build_app(engine), host=host, port=port, print=None)
