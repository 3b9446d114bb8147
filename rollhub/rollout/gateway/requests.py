"""Reading OpenAI request bodies into checked values, with a 400 naming the field on any mistake.

Only what the gateway can honour is accepted: a parameter it would have to ignore silently
(`top_logprobs` above 0 — the engine contract reports the sampled token's log-prob only —,
`best_of`, `echo`, `suffix`, penalties other than 0) is refused with the reason, never dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rollhub.rollout.gateway.errors import ApiError, bad_param
from rollhub.rollout.tool_calls import tool_names

#: fields of the chat API the gateway accepts but that change nothing about sampling
_IGNORED_CHAT_FIELDS = frozenset({"user", "metadata", "store", "parallel_tool_calls", "service_tier", "modalities"})
_MAX_STOPS = 4  # OpenAI's limit on `stop`


@dataclass
class Sampling:
    """The sampling fields shared by both APIs."""

    max_tokens: int | None
    temperature: float
    top_p: float
    n: int
    seed: int | None
    stop: list[str]
    logprobs: bool
    stream: bool
    include_usage: bool


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    sampling: Sampling
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    tool_names: set[str] = field(default_factory=set)


@dataclass
class CompletionRequest:
    model: str
    prompt_text: str | None  # exactly one of the two is set
    prompt_ids: list[int] | None
    sampling: Sampling


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_param(key, f"'{key}' must be a number, got {value!r}")
    if not low <= value <= high:
        raise bad_param(key, f"'{key}' must be in [{low}, {high}], got {value}")
    return float(value)


def _integer(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_param(key, f"'{key}' must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise bad_param(key, f"'{key}' must be {bound}, got {value}")
    return value


def _top_p(body: dict[str, Any]) -> float:
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise bad_param("top_p", "'top_p' must be in (0, 1]: 0 keeps no token (use temperature 0 for greedy)")
    return top_p


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_param("stop", "'stop' must be a non-empty string or a list of them")
    if len(stops) > _MAX_STOPS:
        raise bad_param("stop", f"'stop' takes at most {_MAX_STOPS} sequences, got {len(stops)}")
    return list(stops)


def _refuse_unsupported(body: dict[str, Any], fields: dict[str, Any]) -> None:
    """400 for a field set to a value the gateway cannot honour (`fields`: name -> the value that is fine)."""
    for key, neutral in fields.items():
        if key in body and body[key] is not None and body[key] != neutral:
            raise bad_param(key, f"'{key}' is not supported by the rollhub gateway (leave it out or set {neutral!r})")


def _sampling(body: dict[str, Any], max_choices: int, *, logprobs: bool) -> Sampling:
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_param("stream", f"'stream' must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_param("stream_options", "'stream_options' must be an object")
    _refuse_unsupported(body, {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}})
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_top_p(body),
        n=_integer(body, "n", 1, max_choices) or 1,
        seed=_integer(body, "seed", -(2**63), 2**63 - 1),
        stop=_stops(body),
        logprobs=logprobs,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
    )


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_param("model", "'model' is required: the id listed by GET /v1/models")
    return model


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_param("messages", "'messages' must be a non-empty list of chat messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_param(f"messages[{index}]", f"messages[{index}] must be an object with a 'role'")
        if message["role"] not in ("system", "developer", "user", "assistant", "tool"):
            raise bad_param(f"messages[{index}].role", f"messages[{index}] has unknown role {message['role']!r}")
    return messages


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, set[str]]:
    tools = body.get("tools")
    if tools is None or tools == []:
        return None, set()
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function" for t in tools):
        raise bad_param("tools", "'tools' must be a list of {'type': 'function', 'function': {...}} objects")
    try:
        names = tool_names(tools)
    except ValueError as exc:
        raise bad_param("tools", str(exc)) from None
    return tools, names


def _tool_choice(body: dict[str, Any], names: set[str]) -> Any:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto"
    if choice in ("none", "auto", "required"):
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(function, dict) or function.get("name") not in names:
        raise bad_param("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or name a declared tool")
    return choice


def parse_chat_request(body: Any, max_choices: int) -> ChatRequest:
    """A `/v1/chat/completions` body as a ChatRequest (ApiError 400 on any mistake)."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    unknown = set(body) - _IGNORED_CHAT_FIELDS - {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "seed", "stop",
        "logprobs", "top_logprobs", "stream", "stream_options", "tools", "tool_choice", "frequency_penalty",
        "presence_penalty", "logit_bias", "response_format",
    }  # fmt: skip
    if unknown:
        raise bad_param(sorted(unknown)[0], f"unknown or unsupported fields: {', '.join(sorted(unknown))}")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise bad_param(
            "response_format",
            "only response_format {'type': 'text'} is supported: the engine does not constrain output",
        )
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool) and logprobs is not None:
        raise bad_param("logprobs", f"'logprobs' must be true or false, got {logprobs!r}")
    top = _integer(body, "top_logprobs", 0, 20)
    if top:
        raise bad_param(
            "top_logprobs",
            "top_logprobs > 0 is not supported: the engine reports the sampled token's log-prob only "
            "(use logprobs: true, or top_logprobs: 0)",
        )
    tools, names = _tools(body)
    return ChatRequest(
        model=_model(body),
        messages=_messages(body),
        sampling=_sampling(body, max_choices, logprobs=bool(logprobs)),
        tools=tools,
        tool_choice=_tool_choice(body, names),
        tool_names=names,
    )


def parse_completion_request(body: Any, max_choices: int, vocab_size: int) -> CompletionRequest:
    """A `/v1/completions` body: one prompt, as text or token ids (ApiError 400 on any mistake)."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    _refuse_unsupported(body, {"best_of": 1, "echo": False, "suffix": ""})
    logprobs = _integer(body, "logprobs", 0, 5)
    if logprobs:
        raise bad_param(
            "logprobs",
            "logprobs > 0 (top alternatives) is not supported: the engine reports the sampled token's "
            "log-prob only (use logprobs: 0)",
        )
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    text: str | None = None
    ids: list[int] | None = None
    if isinstance(prompt, str) and prompt:
        text = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        if not all(0 <= i < vocab_size for i in prompt):
            raise bad_param("prompt", f"prompt token ids must be in [0, {vocab_size})")
        ids = list(prompt)
    else:
        raise bad_param("prompt", "'prompt' must be one non-empty string or one non-empty list of token ids")
    sampling = _sampling(body, max_choices, logprobs=logprobs is not None)
    if sampling.max_tokens is None:
        sampling.max_tokens = 16  # OpenAI's default for this API
    return CompletionRequest(model=_model(body), prompt_text=text, prompt_ids=ids, sampling=sampling)


def pin_sampling(body: Any, temperature: float | None, top_p: float | None) -> Any:
    """`body` with the pinned temperature / top-p filled in; 400 for a request that names another value.

    A training run scores the model's tokens at its own temperature and top-p, so a session that
    sampled otherwise would train on wrong behaviour log-probs: refused, with the value to use."""
    if not isinstance(body, dict):
        return body
    for key, pinned in (("temperature", temperature), ("top_p", top_p)):
        if pinned is None:
            continue
        given = body.get(key)
        if given is not None and given != pinned:
            raise bad_param(key, f"this gateway trains at {key}={pinned}: leave '{key}' out or send {pinned}")
        body = {**body, key: pinned}
    return body
