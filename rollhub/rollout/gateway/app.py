"""The gateway's HTTP routes (aiohttp): OpenAI's API, per session in the URL, and the RL session API.

OpenAI API (also under `/sessions/{session_id}/v1/...`, so an agent program changes only
its `base_url`; calls outside a session are answered and not recorded):
  GET  /v1/models
  POST /v1/chat/completions   (stream or not; tools in, tool_calls out)
  POST /v1/completions
RL session API:
  POST /rl/sessions                  {"env_id"?, "seed"?, "group_id"?, "metadata"?} -> {"session_id", "base_url"}
  GET  /sessions/{session_id}        the session's tree in numbers
  POST /sessions/{session_id}/reward {"reward", "node_id"?, "success"?}: the whole session's, or the leaves
                                     under one node; `success` marks the episode solved (success-rate metrics)
  POST /sessions/{session_id}/end    -> its trajectories (one per leaf), kept for the trainer
  GET  /rl/metrics                   bridge_break_rate, branches per session, calls by kind, 429s

Every error is OpenAI's error JSON (rollhub.rollout.gateway.errors), unknown routes included.

Authentication (`GatewayConfig.api_keys`): off by default, when the gateway listens on loopback
only. With keys, every route wants `Authorization: Bearer KEY` (else 401); a session's own key
(`api_key` in the /rl/sessions answer) opens that session's routes only, so a program handed it
as OPENAI_API_KEY can neither read nor touch other sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from rollhub.rollout.gateway.errors import ApiError, bad_param
from rollhub.rollout.gateway.replies import (
    LiveText,
    chat_chunk,
    chat_response,
    chat_stream_chunks,
    chat_stream_end,
    completion_response,
)
from rollhub.rollout.gateway.requests import ChatRequest, parse_chat_request, parse_completion_request, pin_sampling
from rollhub.rollout.gateway.rewards import checked_reward
from rollhub.rollout.gateway.service import Gateway
from rollhub.rollout.gateway.sessions import Session
from rollhub.rollout.serialization import trajectory_to_dict

logger = logging.getLogger(__name__)

GATEWAY_KEY = web.AppKey("gateway", Gateway)


@web.middleware
async def openai_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every refusal as OpenAI's error JSON (module docstring)."""
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status, headers=exc.headers)
    except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, body too large
        if exc.status < 400:
            raise
        error = ApiError(f"{exc.reason}: {request.method} {request.path}", status=exc.status, code=exc.reason)
        return web.json_response(error.body(), status=exc.status)
    except Exception:
        logger.exception("gateway error on %s %s", request.method, request.path)
        error = ApiError("internal gateway error (see the gateway's log)", status=500, code="internal_error")
        return web.json_response(error.body(), status=500)


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _key_matches(token: str, key: str | None) -> bool:
    return key is not None and hmac.compare_digest(token.encode(), key.encode())


@web.middleware
async def authenticate(request: web.Request, handler: Any) -> web.StreamResponse:
    """401 unless the call carries a gateway key, or its session's own key on that session's routes."""
    gateway = _gateway(request)
    if not gateway.config.api_keys:
        return await handler(request)
    token = _bearer(request)
    if token is not None:
        if any(_key_matches(token, key) for key in gateway.config.api_keys):
            return await handler(request)
        session = gateway.sessions.get(request.match_info.get("session_id", ""))
        if session is not None and _key_matches(token, session.api_key):
            return await handler(request)
    raise ApiError(
        "missing or wrong API key: send 'Authorization: Bearer KEY' with a gateway key, or the session's own key "
        "on its routes",
        status=401,
        code="invalid_api_key",
    )


#: deeper than any real request (tool schemas nest a few levels); checked explicitly, because what
#: nests deeper would otherwise be refused or served depending on the process's recursion limit
MAX_JSON_DEPTH = 64


async def _json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    except RecursionError:  # a body nested deeper than the parser recurses is the client's mistake
        raise ApiError("the request body nests too deeply to parse", code="invalid_json") from None
    if _nests_deeper_than(body, MAX_JSON_DEPTH):
        raise ApiError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
    return body


def _nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests more than `limit` arrays/objects deep (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _gateway(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]


def _session(request: web.Request) -> Session | None:
    session_id = request.match_info.get("session_id")
    return _gateway(request).session(session_id) if session_id is not None else None


async def handle_models(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    _session(request)  # an unknown session is a 404 here too
    model = {"id": gateway.config.model_name, "object": "model", "created": 0, "owned_by": "rollhub"}
    return web.json_response({"object": "list", "data": [model]})


def _sse(chunk: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(chunk)}\n\n".encode()


async def _stream_live(
    request: web.Request, gateway: Gateway, parsed: ChatRequest, session: Session | None
) -> web.StreamResponse:
    """A streamed chat call whose content is sent as the engine samples it (replies.LiveText). A call
    that fails before its first token still answers with an error status; one that fails later ends
    its stream with an error event (the status is sent by then)."""
    tokens: asyncio.Queue[list[int]] = asyncio.Queue()
    sampling = parsed.sampling
    async with gateway.admit(session):
        call = asyncio.ensure_future(gateway.chat(parsed, session, on_token=tokens.put_nowait))
        waiting = asyncio.ensure_future(tokens.get())
        response: web.StreamResponse | None = None
        try:
            await asyncio.wait({call, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if call.done() and call.exception() is not None and not waiting.done():
                raise call.exception()  # type: ignore[misc]
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            response_id, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
            live = LiveText(gateway.tokenizer)
            await response.write(
                _sse(chat_chunk(response_id, created, parsed.model, 0, {"role": "assistant", "content": ""}))
            )
            while True:
                if waiting.done():
                    delta = live.add(waiting.result())
                    if delta:
                        await response.write(
                            _sse(chat_chunk(response_id, created, parsed.model, 0, {"content": delta}))
                        )
                    waiting = asyncio.ensure_future(tokens.get())
                    continue
                if call.done() and tokens.empty():
                    break
                await asyncio.wait({call, waiting}, return_when=asyncio.FIRST_COMPLETED)
            try:
                result = call.result()
            except ApiError as exc:
                await response.write(_sse(exc.body()))
                await response.write(b"data: [DONE]\n\n")
                return response
            rest = live.rest(result.choices[0].content or "")
            if rest:
                await response.write(_sse(chat_chunk(response_id, created, parsed.model, 0, {"content": rest})))
            end = chat_stream_end(
                result, response_id, created, parsed.model, with_tokens=gateway.config.return_tokens,
                include_usage=sampling.include_usage,
            )  # fmt: skip
            for chunk in end:
                await response.write(_sse(chunk))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            waiting.cancel()
            if not call.done():  # the client went away mid-stream: the generation is aborted, not recorded
                call.cancel()


async def handle_chat(request: web.Request) -> web.StreamResponse:
    gateway = _gateway(request)
    session = _session(request)
    body = pin_sampling(await _json(request), gateway.config.temperature, gateway.config.top_p)
    parsed = parse_chat_request(body, gateway.config.max_choices)
    if parsed.sampling.stream and gateway.streams_incrementally(parsed):
        return await _stream_live(request, gateway, parsed, session)
    async with gateway.admit(session):
        result = await gateway.chat(parsed, session)
    sampling = parsed.sampling
    with_tokens = gateway.config.return_tokens
    if not sampling.stream:
        body = chat_response(
            result, parsed.model, gateway.tokenizer, logprobs=sampling.logprobs, with_tokens=with_tokens
        )
        return web.json_response(body)
    chunks = chat_stream_chunks(
        result,
        parsed.model,
        gateway.tokenizer,
        logprobs=sampling.logprobs,
        with_tokens=with_tokens,
        include_usage=sampling.include_usage,
    )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(_sse(chunk))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def handle_completions(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    session = _session(request)
    body = pin_sampling(await _json(request), gateway.config.temperature, gateway.config.top_p)
    parsed = parse_completion_request(body, gateway.config.max_choices, gateway.vocab_size)
    if parsed.sampling.stream:
        raise bad_param("stream", "streaming is supported on /v1/chat/completions only; set stream: false")
    async with gateway.admit(session):
        result = await gateway.complete(parsed, session)
    body = completion_response(
        result,
        parsed.model,
        gateway.tokenizer,
        logprobs=parsed.sampling.logprobs,
        with_tokens=gateway.config.return_tokens,
    )
    return web.json_response(body)


async def handle_start_session(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    body = await _json(request)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    env_id, seed, group_id = body.get("env_id"), body.get("seed"), body.get("group_id")
    metadata = body.get("metadata") or {}
    if env_id is not None and (not isinstance(env_id, str) or not env_id):
        raise bad_param("env_id", "'env_id' must be a non-empty string, e.g. 'rollhub/MathTool-v0'")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad_param("seed", f"'seed' must be an integer, got {seed!r}")
    if group_id is not None and (not isinstance(group_id, str) or not group_id):
        raise bad_param("group_id", "'group_id' must be a non-empty string")
    if not isinstance(metadata, dict):
        raise bad_param("metadata", "'metadata' must be an object")
    session = gateway.start_session(env_id, seed, group_id, metadata)
    base = f"{request.scheme}://{request.host}/sessions/{session.session_id}/v1"
    answer = {"session_id": session.session_id, "base_url": base, "env_id": session.env_id, "seed": session.seed,
              "group_id": session.group_id}  # fmt: skip
    if session.api_key is not None:
        answer["api_key"] = session.api_key
    return web.json_response(answer)


def _summary(session: Session) -> dict[str, Any]:
    return {
        "session_id": session.session_id,
        "env_id": session.env_id,
        "seed": session.seed,
        "group_id": session.group_id,
        "calls": session.calls,
        "branched_calls": session.branched_calls,
        "nodes": len(session.nodes),
        "leaves": len(session.leaves()),
    }


async def handle_get_session(request: web.Request) -> web.Response:
    session = _session(request)
    assert session is not None  # the route has a session id
    return web.json_response(_summary(session))


async def handle_reward(request: web.Request) -> web.Response:
    session = _session(request)
    assert session is not None
    body = await _json(request)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    if "reward" not in body:
        raise bad_param("reward", "'reward' is required: a finite number")
    reward = checked_reward(body["reward"], _gateway(request).config.max_abs_reward)
    node_id = body.get("node_id")
    if node_id is not None and session.node(node_id) is None:
        raise ApiError(
            f"session has no node '{node_id}' (node ids are in each choice's rollhub.node_id)",
            status=404,
            param="node_id",
            code="node_not_found",
        )
    success = body.get("success")
    if success is not None and not isinstance(success, bool):
        raise bad_param("success", f"'success' must be true or false, got {success!r}")
    session.rewards[node_id] = reward
    if success is not None:
        session.success = success
    return web.json_response({"session_id": session.session_id, "node_id": node_id, "reward": reward})


async def handle_end(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    session_id = request.match_info["session_id"]
    summary = _summary(gateway.session(session_id))
    trajectories = gateway.end_session(session_id)
    summary["trajectories"] = [trajectory_to_dict(t) for t in trajectories]
    return web.json_response(summary)


async def handle_metrics(request: web.Request) -> web.Response:
    gateway = _gateway(request)
    return web.json_response(
        {**gateway.metrics.snapshot(), "in_flight": gateway.in_flight, "open_sessions": len(gateway.sessions),
         "time": time.time()}
    )  # fmt: skip


async def _end_idle_sessions(gateway: Gateway) -> None:
    """Every so often, end the sessions their programs abandoned (Gateway.end_idle_sessions)."""
    timeout = gateway.config.session_idle_timeout_s
    assert timeout is not None
    while True:
        await asyncio.sleep(min(max(timeout / 4, 0.05), 30.0))
        try:
            gateway.end_idle_sessions()
        except Exception:  # an on_end writer failing must not stop the reaping
            logger.exception("ending idle sessions failed")


def build_gateway_app(gateway: Gateway) -> web.Application:
    """The aiohttp application serving `gateway` (module docstring for the routes)."""
    app = web.Application(middlewares=[openai_errors, authenticate], client_max_size=gateway.config.max_body_bytes)
    app[GATEWAY_KEY] = gateway

    async def reap_idle(_: web.Application) -> Any:
        if gateway.config.session_idle_timeout_s is None:
            yield
            return
        task = asyncio.create_task(_end_idle_sessions(gateway), name="gateway-idle-sessions")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(reap_idle)
    for prefix in ("", "/sessions/{session_id}"):
        app.router.add_get(f"{prefix}/v1/models", handle_models)
        app.router.add_post(f"{prefix}/v1/chat/completions", handle_chat)
        app.router.add_post(f"{prefix}/v1/completions", handle_completions)
    app.router.add_post("/rl/sessions", handle_start_session)
    app.router.add_get("/rl/metrics", handle_metrics)
    app.router.add_get("/sessions/{session_id}", handle_get_session)
    app.router.add_post("/sessions/{session_id}/reward", handle_reward)
    app.router.add_post("/sessions/{session_id}/end", handle_end)
    return app
