"""Gateway: OpenAI-style calls turned into engine requests with exact token bookkeeping.

The gateway speaks to the fleet only through the InferenceEngine contract
(rollhub.inference.engines.base: `await generate(input_ids, sampling) -> Generation` with
per-token log-probs and policy versions), so the in-process HFEngine, the `rollhub serve`
client, SGLang and the router all plug in the same way. Prompts are built with the
project's one prompt builder, `ChatSegments` (rollhub.rollout.prompting), the way the agent
loop builds them: a call that extends its session appends to the earlier call's ids
(`close_assistant` + `encode_reply` of the new messages + `generation_prompt_ids`); a call
that starts a root or a branch renders its messages whole (`encode_conversation`).

Hostile or broken programs cost only their own session: a session's calls are capped
(`max_calls_per_session`, `max_in_flight_per_session`: 400 / 429), open sessions are capped
(429 on the next start), and a session idle past `session_idle_timeout_s` is ended as failed by
`end_idle_sessions` (the app runs it periodically), so no session stays open forever.

A generation aborted by a weight update (finish reason "abort") is resumed with its partial
output appended to the prompt, like the agent loop's partial rollouts, so each token keeps
the version that produced it; after `max_resubmits` aborts the call fails with 503.

`stop` strings are applied to the text after generation: the completion ends with the token
that completed the stop string (those are the ids recorded and trained on: what the model
wrote), and the text returned ends before it, as OpenAI returns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams
from rollhub.rollout.gateway.config import GatewayConfig
from rollhub.rollout.gateway.errors import ApiError
from rollhub.rollout.gateway.messages import message_key, template_message
from rollhub.rollout.gateway.requests import ChatRequest, CompletionRequest, Sampling
from rollhub.rollout.gateway.sessions import CallKind, GatewayMetrics, Node, Session, new_node_id
from rollhub.rollout.prompting import ChatSegments
from rollhub.rollout.tool_calls import parse_tool_calls
from rollhub.rollout.types import Trajectory

logger = logging.getLogger(__name__)


@dataclass
class Choice:
    """One completion as the gateway answers it, with the exact ids behind it."""

    index: int
    node_id: str
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    text: str  # the completion's text (after stop strings), tool-call blocks included
    finish_reason: str  # OpenAI's: stop, length, tool_calls
    engine_finish_reason: str
    content: str | None = None  # chat: text outside tool-call blocks
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_errors: list[str] = field(default_factory=list)


@dataclass
class CallResult:
    prompt_ids: list[int]
    choices: list[Choice]
    session_id: str | None
    kind: CallKind | None  # None outside sessions


class Gateway:
    """The gateway's state: engine, prompt builder, sessions, finished trajectories, metrics."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        config: GatewayConfig | None = None,
        *,
        segments: ChatSegments | None = None,
        on_end: Callable[[list[Trajectory]], None] | None = None,
    ) -> None:
        self.config = config or GatewayConfig()
        self.on_end = on_end  # called with each ended session's trajectories (e.g. a JSONL writer)
        self.config.validate()
        self.engine = engine
        self.tokenizer = tokenizer
        self.segments = segments or ChatSegments(tokenizer)
        self.max_context_tokens = self.config.max_context_tokens or _engine_context(engine)
        self.vocab_size = len(tokenizer)
        self.sessions: dict[str, Session] = {}
        self.ended_session_ids: set[str] = set()  # so a late call on an ended session is told so (409), not 404
        self.finished: list[Trajectory] = []  # trajectories of ended sessions, taken by `take_trajectories`
        self.metrics = GatewayMetrics()
        self.in_flight = 0

    # --- sessions ----------------------------------------------------------------------

    def start_session(
        self,
        env_id: str | None = None,
        seed: int | None = None,
        group_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session:
        """A new session; sessions of the same task (env id and seed) share a group unless one is named."""
        cap = self.config.max_open_sessions
        if cap is not None and len(self.sessions) >= cap:
            self.metrics.rejected_busy += 1
            raise ApiError(
                f"the gateway has {cap} sessions open (max_open_sessions); end some, or retry after "
                f"{self.config.retry_after_s} s",
                status=429,
                code="too_many_sessions",
                headers={"Retry-After": str(self.config.retry_after_s)},
            )
        session_id = uuid.uuid4().hex
        env_id = env_id or "gateway"
        group = group_id or (f"{env_id}:{seed}" if seed is not None else session_id)
        session = Session(session_id, env_id=env_id, seed=seed, group_id=group, metadata=dict(metadata or {}))
        if self.config.api_keys:
            session.api_key = f"rh-session-{secrets.token_urlsafe(24)}"
        self.sessions[session_id] = session
        self.metrics.sessions_started += 1
        return session

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None and session_id in self.ended_session_ids:
            raise ApiError(f"session '{session_id}' has ended", status=409, code="session_ended")
        if session is None:
            raise ApiError(
                f"unknown session '{session_id}': start one with POST /rl/sessions",
                status=404,
                code="session_not_found",
            )
        return session

    def end_session(self, session_id: str, failure: str | None = None) -> list[Trajectory]:
        """End a session: its leaves become trajectories (kept for `take_trajectories`) and it is forgotten.
        With `failure` (why it ended without its program) they are INFRA_FAILED: kept, never scored."""
        session = self.session(session_id)
        session.ended = True
        if failure is not None:
            session.failure = failure
        trajectories = session.to_trajectories()
        del self.sessions[session_id]
        self.ended_session_ids.add(session_id)
        self.finished.extend(trajectories)
        if self.on_end is not None:
            self.on_end(trajectories)
        self.metrics.sessions_ended += 1
        self.metrics.leaves_exported += len(trajectories)
        return trajectories

    def end_idle_sessions(self, now: float | None = None) -> list[str]:
        """End (as failed) every session with no call running and none for `session_idle_timeout_s`."""
        timeout = self.config.session_idle_timeout_s
        if timeout is None:
            return []
        now = time.monotonic() if now is None else now
        idle = [s for s in self.sessions.values() if s.in_flight == 0 and now - s.last_active_s > timeout]
        for session in idle:
            logger.warning("session %s idle for over %.0f s without /end: ended as failed", session.session_id, timeout)
            self.end_session(session.session_id, failure=f"session idle for over {timeout:g} s without /end")
            self.metrics.sessions_timed_out += 1
        return [s.session_id for s in idle]

    def claim_trajectories(self, session_id: str) -> list[Trajectory]:
        """Take the trajectories of one ended session out of the finished ones (a producer that owns it)."""
        mine = [t for t in self.finished if t.info.get("session_id") == session_id]
        self.finished = [t for t in self.finished if t.info.get("session_id") != session_id]
        return mine

    def take_trajectories(self) -> list[Trajectory]:
        """The trajectories of sessions ended since the last call (group them with `group_trajectories`)."""
        taken, self.finished = self.finished, []
        return taken

    # --- back-pressure -----------------------------------------------------------------

    def _busy(self, message: str) -> ApiError:
        self.metrics.rejected_busy += 1
        return ApiError(
            f"{message}; retry after {self.config.retry_after_s} s",
            status=429,
            code="too_many_requests",
            headers={"Retry-After": str(self.config.retry_after_s)},
        )

    @contextlib.asynccontextmanager
    async def admit(self, session: Session | None = None) -> AsyncIterator[None]:
        """Hold one in-flight slot for a generation call (and one of its session's); 429 with Retry-After
        when all are taken; 400 when the session has used up its calls (a program calling in a loop)."""
        cap = self.config.max_in_flight
        if cap is not None and self.in_flight >= cap:
            raise self._busy(f"the gateway is at its limit of {cap} calls in flight")
        if session is not None:
            per_session = self.config.max_in_flight_per_session
            if per_session is not None and session.in_flight >= per_session:
                raise self._busy(f"this session already has {per_session} calls in flight")
            calls = self.config.max_calls_per_session
            if calls is not None and session.calls + session.in_flight >= calls:
                raise ApiError(
                    f"this session has made its {calls} calls (max_calls_per_session); end it",
                    code="session_call_limit",
                )
            session.in_flight += 1
            session.last_active_s = time.monotonic()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if session is not None:
                session.in_flight -= 1
                session.last_active_s = time.monotonic()

    # --- chat ----------------------------------------------------------------------------

    def streams_incrementally(self, request: ChatRequest) -> bool:
        """Whether a streamed call can send tokens as they are sampled: the engine hands them out
        (`streams_tokens`), one choice, no stop strings, no tool calls to parse (the text of a tool
        call is not content: it is known only once the generation is whole). Else one chunk per part."""
        parse = request.tools is not None and request.tool_choice != "none"
        sampling = request.sampling
        return (
            bool(getattr(self.engine, "streams_tokens", False)) and sampling.n == 1 and not sampling.stop and not parse
        )

    async def chat(
        self, request: ChatRequest, session: Session | None, on_token: Callable[[list[int]], None] | None = None
    ) -> CallResult:
        """Answer one chat call; on a session, record its choices as nodes of the session tree. `on_token`
        (only where `streams_incrementally`) is told each engine step's new ids."""
        self._check_model(request.model)
        keys = [message_key(m, i) for i, m in enumerate(request.messages)]
        takes_tools = self.segments.template_takes_tools
        rendered = [template_message(m, i, takes_tools) for i, m in enumerate(request.messages)]
        tools_key = json.dumps(request.tools, sort_keys=True) if request.tools else ""
        parent, covered = session.find_chat_parent(keys, tools_key) if session is not None else (None, 0)
        try:
            if parent is not None:
                prompt = (
                    parent.prompt_ids
                    + parent.response_ids
                    + self.segments.close_assistant(parent.response_ids)
                    + self.segments.encode_reply(rendered[covered:])
                    + self.segments.generation_prompt_ids
                )
            else:
                prompt = self.segments.encode_conversation(rendered, request.tools)
        except ApiError:
            raise
        except Exception as exc:  # jinja errors: roles or orders the model's template refuses
            raise ApiError(f"the model's chat template refused these messages: {exc}", param="messages") from None
        generations = await self._generate_choices(prompt, request.sampling, on_token)
        parse = request.tools is not None and request.tool_choice != "none"
        choices = [self._chat_choice(i, g, text, parse, request.tool_names) for i, (g, text) in enumerate(generations)]
        return self._result(
            session,
            parent,
            prompt,
            choices,
            lambda c: {
                "message_keys": keys,
                "tools_key": tools_key,
                "answer_key": message_key(
                    {"role": "assistant", "content": c.content, "tool_calls": c.tool_calls}, len(keys)
                ),
            },
        )

    def _chat_choice(self, index: int, generation: Generation, text: str, parse: bool, names: set[str]) -> Choice:
        choice = self._choice(index, generation, text)
        choice.content = text
        if parse:
            parsed = parse_tool_calls(text, allowed_names=names)
            choice.tool_call_errors = parsed.errors
            if parsed.calls:
                choice.content = parsed.content or None
                choice.tool_calls = [
                    {
                        "id": f"call_{uuid.uuid4().hex[:24]}",
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                    }
                    for call in parsed.calls
                ]
                if choice.finish_reason == "stop":
                    choice.finish_reason = "tool_calls"
        return choice

    # --- completions --------------------------------------------------------------------

    async def complete(self, request: CompletionRequest, session: Session | None) -> CallResult:
        """Answer one completions call; on a session, a prompt that continues an earlier completion reuses its ids."""
        self._check_model(request.model)
        parent = None
        if session is not None:
            parent, rest = session.find_completion_parent(request.prompt_ids, request.prompt_text)
        if request.prompt_ids is not None:
            prompt = list(request.prompt_ids)
        elif parent is not None:
            prompt = parent.prompt_ids + parent.response_ids + self._encode(rest)
        else:
            prompt = self._encode(request.prompt_text or "")
        if not prompt:
            raise ApiError("the prompt encodes to no tokens", param="prompt")
        generations = await self._generate_choices(prompt, request.sampling)
        choices = [self._choice(i, g, text) for i, (g, text) in enumerate(generations)]
        return self._result(
            session,
            parent,
            prompt,
            choices,
            lambda c: {"message_keys": None, "tools_key": "", "answer_key": None, "prompt_text": request.prompt_text},
        )

    # --- shared -------------------------------------------------------------------------

    def _result(
        self,
        session: Session | None,
        parent: Node | None,
        prompt: list[int],
        choices: list[Choice],
        keys_of: Callable[[Choice], dict[str, Any]],
    ) -> CallResult:
        """Record each choice as a node of the session's tree (`keys_of`: how the call kind names it)."""
        kind = None
        if session is not None:
            nodes = [
                Node(
                    node_id=c.node_id,
                    parent=parent,
                    prompt_ids=prompt,
                    response_ids=c.token_ids,
                    logprobs=c.logprobs,
                    versions=c.versions,
                    text=c.text,
                    finish_reason=c.engine_finish_reason,
                    **keys_of(c),
                )
                for c in choices
            ]
            kind = self._record(session, parent, nodes)
        else:
            self.metrics.stateless_calls += 1
        return CallResult(prompt, choices, session.session_id if session else None, kind)

    def _check_model(self, model: str) -> None:
        if model != self.config.model_name:
            raise ApiError(
                f"the model '{model}' does not exist here; this gateway serves '{self.config.model_name}'",
                status=404,
                param="model",
                code="model_not_found",
            )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _record(self, session: Session, parent: Node | None, nodes: list[Node]) -> CallKind:
        kind = session.record(parent, nodes)
        self.metrics.calls += 1
        self.metrics.kinds[kind] += 1
        return kind

    def _choice(self, index: int, generation: Generation, text: str) -> Choice:
        finish = "length" if generation.finish_reason == "length" else "stop"
        self.metrics.completion_tokens += len(generation.token_ids)
        return Choice(
            index=index,
            node_id=new_node_id(),
            token_ids=list(generation.token_ids),
            logprobs=list(generation.logprobs),
            versions=list(generation.token_versions),
            text=text,
            finish_reason=finish,
            engine_finish_reason=generation.finish_reason,
        )

    async def _generate_choices(
        self, prompt: list[int], sampling: Sampling, on_token: Callable[[list[int]], None] | None = None
    ) -> list[tuple[Generation, str]]:
        """`sampling.n` generations of `prompt` (concurrently), each with its text after stop strings."""
        room = self.max_context_tokens - len(prompt)
        if room < 1:
            raise ApiError(
                f"the prompt has {len(prompt)} tokens and leaves no room in the context of "
                f"{self.max_context_tokens} tokens; shorten the conversation",
                param="messages",
                code="context_length_exceeded",
            )
        max_new = min(sampling.max_tokens or self.config.default_max_tokens, room)
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(sampling.n)]
        if on_token is not None and sampling.n != 1:
            raise ValueError("on_token streams one choice only")
        generations = await asyncio.gather(
            *(self._generate(prompt, max_new, sampling, seed, on_token) for seed in seeds)
        )
        return [self._apply_stops(g, sampling.stop) for g in generations]

    async def _generate(
        self,
        prompt: list[int],
        max_new: int,
        sampling: Sampling,
        seed: int | None,
        on_token: Callable[[list[int]], None] | None = None,
    ) -> Generation:
        """One generation, resumed after aborts (module docstring)."""
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for _ in range(self.config.max_resubmits + 1):
            params = SamplingParams(
                max_new_tokens=max_new - len(ids),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=self.config.top_k,
                seed=seed if not ids else None,
            )
            try:
                if on_token is not None:  # resumed after an abort: the new ids follow the ones already sent
                    generation = await self.engine.generate(prompt + ids, params, on_token=on_token)  # type: ignore[call-arg]
                else:
                    generation = await self.engine.generate(prompt + ids, params)
            except ValueError as exc:  # the engine refused the request itself (ids, lengths)
                raise ApiError(f"the engine refused the request: {exc}") from None
            except Exception as exc:  # the machinery: a server down, a connection lost
                logger.warning("engine failed: %r", exc)
                raise ApiError(
                    f"the inference engine failed ({type(exc).__name__}); retry later",
                    status=502,
                    code="engine_unavailable",
                ) from exc
            ids += generation.token_ids
            logprobs += generation.logprobs
            versions += generation.token_versions
            if generation.finish_reason != "abort":
                return Generation(ids, logprobs, versions, generation.finish_reason, prompt_tokens=len(prompt))
            if len(ids) >= max_new:
                return Generation(ids, logprobs, versions, "length", prompt_tokens=len(prompt))
        raise ApiError(
            f"the generation was interrupted by weight updates more than {self.config.max_resubmits} times; retry",
            status=503,
            code="engine_interrupted",
        )

    def _apply_stops(self, generation: Generation, stops: list[str]) -> tuple[Generation, str]:
        """The generation cut at the token that completes the earliest stop string, and the text before it."""
        text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        hits = [(at, stop) for stop in stops if (at := text.find(stop)) >= 0]
        if not hits:
            return generation, text
        at, stop = min(hits)
        end = at + len(stop)
        for count in range(1, len(generation.token_ids) + 1):
            if len(self.tokenizer.decode(generation.token_ids[:count], skip_special_tokens=True)) >= end:
                break
        cut = Generation(
            generation.token_ids[:count],
            generation.logprobs[:count],
            generation.token_versions[:count],
            "stop",
            prompt_tokens=generation.prompt_tokens,
        )
        return cut, text[:at]


def _engine_context(engine: InferenceEngine) -> int:
    """The context an engine serves: the in-process engine's `max_positions`, a server client's
    `context_length` once known, else 4096 (a server refuses longer requests itself)."""
    for name in ("max_positions", "context_length"):
        value = getattr(engine, name, None)
        if isinstance(value, int) and value > 1:
            return value
    return 4096
