"""Gateway answers in OpenAI's response shapes, plus the `rollhub` extension field.

The extension field carries what an RL trainer needs and OpenAI does not return:
`response.rollhub` = {session_id, call_kind, prompt_token_ids} and per choice
`choice.rollhub` = {node_id, token_ids, logprobs, token_versions, engine_finish_reason,
tool_call_errors}. Clients that do not know it ignore it (the `openai` package keeps it in
`model_extra`).

Streaming (`stream: true`) sends the completion as server-sent events: a role chunk, the
content (each delta the text new tokens add), tool calls as one delta, a finish chunk,
optionally a usage chunk, then `[DONE]`. Where the engine hands out tokens as it samples them
(`Gateway.streams_incrementally`) the content deltas are sent live (`LiveText`); otherwise
(n > 1, stop strings, tool calls to parse, an engine that returns whole generations) the same
events are sent once the generation is whole (`chat_stream_chunks`).
"""

from __future__ import annotations

import time
from typing import Any

from rollhub.rollout.gateway.service import CallResult, Choice


def _usage(result: CallResult) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in result.choices)
    return {
        "prompt_tokens": len(result.prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(result.prompt_ids) + completion,
    }


def _call_extension(result: CallResult) -> dict[str, Any]:
    return {"session_id": result.session_id, "call_kind": result.kind, "prompt_token_ids": result.prompt_ids}


def _choice_extension(choice: Choice) -> dict[str, Any]:
    return {
        "node_id": choice.node_id,
        "token_ids": choice.token_ids,
        "logprobs": choice.logprobs,
        "token_versions": choice.versions,
        "engine_finish_reason": choice.engine_finish_reason,
        "tool_call_errors": choice.tool_call_errors,
    }


def _token_texts(tokenizer: Any, choice: Choice) -> list[str]:
    return [tokenizer.decode([token]) for token in choice.token_ids]


def _chat_logprobs(tokenizer: Any, choice: Choice) -> dict[str, Any]:
    return {
        "content": [
            {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")), "top_logprobs": []}
            for text, logprob in zip(_token_texts(tokenizer, choice), choice.logprobs)
        ],
        "refusal": None,
    }


def chat_message(choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.content, "refusal": None}
    if choice.tool_calls:
        message["tool_calls"] = choice.tool_calls
    return message


def chat_response(
    result: CallResult, model: str, tokenizer: Any, *, logprobs: bool, with_tokens: bool
) -> dict[str, Any]:
    """The `chat.completion` object."""
    choices = []
    for choice in result.choices:
        entry: dict[str, Any] = {
            "index": choice.index,
            "message": chat_message(choice),
            "finish_reason": choice.finish_reason,
            "logprobs": _chat_logprobs(tokenizer, choice) if logprobs else None,
        }
        if with_tokens:
            entry["rollhub"] = _choice_extension(choice)
        choices.append(entry)
    return _response(result, model, "chatcmpl", "chat.completion", choices, with_tokens, system_fingerprint=None)


def chat_chunk(
    response_id: str, created: int, model: str, index: int, delta: dict[str, Any], finish: str | None = None,
    **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """One `chat.completion.chunk` with one choice."""
    choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": extra.pop("logprobs", None)}
    choice.update(extra)
    return {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [choice]}  # fmt: skip


class LiveText:
    """The content deltas of a generation streamed as its ids arrive: a character whose bytes
    are split across tokens is held back until it is whole."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def add(self, ids: list[int]) -> str:
        """The text `ids` add (possibly empty)."""
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def rest(self, content: str) -> str:
        """What of the final `content` was not sent yet."""
        return content[len(self.sent) :] if content.startswith(self.sent) else ""


def _with_stream_tail(
    chunks: list[dict[str, Any]],
    result: CallResult,
    response_id: str,
    created: int,
    model: str,
    with_tokens: bool,
    include_usage: bool,
) -> list[dict[str, Any]]:
    """A stream's last chunks: the usage chunk when asked, and the call's extension on the very last."""
    if include_usage:
        chunks.append(
            {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [], "usage": _usage(result)}
        )  # fmt: skip
    if with_tokens:
        chunks[-1]["rollhub"] = _call_extension(result)
    return chunks


def chat_stream_end(
    result: CallResult, response_id: str, created: int, model: str, *, with_tokens: bool, include_usage: bool
) -> list[dict[str, Any]]:
    """The chunks after a live stream's content: the finish chunk (with the choice's token extension),
    the usage chunk when asked, the call's extension on the last."""
    (choice,) = result.choices
    extra = {"rollhub": _choice_extension(choice)} if with_tokens else {}
    chunks = [chat_chunk(response_id, created, model, choice.index, {}, choice.finish_reason, **extra)]
    return _with_stream_tail(chunks, result, response_id, created, model, with_tokens, include_usage)


def chat_stream_chunks(
    result: CallResult, model: str, tokenizer: Any, *, logprobs: bool, with_tokens: bool, include_usage: bool
) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a streamed answer (module docstring)."""
    response_id = f"chatcmpl-{result.choices[0].node_id}"
    created = int(time.time())

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": extra.pop("logprobs", None)}
        choice.update(extra)
        return {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    chunks = []
    for choice in result.choices:
        chunks.append(chunk(choice.index, {"role": "assistant", "content": ""}))
        content = choice.content or ""
        if choice.tool_calls:
            if content:
                chunks.append(chunk(choice.index, {"content": content}))
            calls = [{"index": i, **call} for i, call in enumerate(choice.tool_calls)]
            chunks.append(chunk(choice.index, {"tool_calls": calls}))
        else:
            sent = 0
            texts = _token_texts(tokenizer, choice)
            for count in range(1, len(choice.token_ids) + 1):
                upto = tokenizer.decode(choice.token_ids[:count], skip_special_tokens=True)
                end = min(len(upto), len(content))
                if not content.startswith(upto[:end]):
                    continue  # a character split across tokens: its bytes arrive with a later token
                delta = content[sent:end] if end > sent else ""
                sent = max(sent, end)
                token_logprobs = None
                if logprobs:
                    text = texts[count - 1]
                    entry = {"token": text, "logprob": choice.logprobs[count - 1], "top_logprobs": []}
                    token_logprobs = {"content": [{**entry, "bytes": list(text.encode("utf-8"))}], "refusal": None}
                if delta or token_logprobs:
                    chunks.append(chunk(choice.index, {"content": delta}, logprobs=token_logprobs))
            if sent < len(content):
                chunks.append(chunk(choice.index, {"content": content[sent:]}))
        extra = {"rollhub": _choice_extension(choice)} if with_tokens else {}
        chunks.append(chunk(choice.index, {}, choice.finish_reason, **extra))
    return _with_stream_tail(chunks, result, response_id, created, model, with_tokens, include_usage)


def completion_response(
    result: CallResult, model: str, tokenizer: Any, *, logprobs: bool, with_tokens: bool
) -> dict[str, Any]:
    """The `text_completion` object."""
    choices = []
    for choice in result.choices:
        entry: dict[str, Any] = {
            "index": choice.index,
            "text": choice.text,
            "finish_reason": choice.finish_reason,
            "logprobs": None,
        }
        if logprobs:
            texts = _token_texts(tokenizer, choice)
            offsets, at = [], 0
            for text in texts:
                offsets.append(at)
                at += len(text)
            entry["logprobs"] = {
                "tokens": texts,
                "token_logprobs": choice.logprobs,
                "top_logprobs": None,
                "text_offset": offsets,
            }
        if with_tokens:
            entry["rollhub"] = _choice_extension(choice)
        choices.append(entry)
    return _response(result, model, "cmpl", "text_completion", choices, with_tokens)


def _response(
    result: CallResult,
    model: str,
    id_prefix: str,
    kind: str,
    choices: list[dict[str, Any]],
    with_tokens: bool,
    **extra: Any,
) -> dict[str, Any]:
    """The envelope both endpoints answer with, the call's token extension added when asked."""
    response: dict[str, Any] = {
        "id": f"{id_prefix}-{result.choices[0].node_id}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(result),
        **extra,
    }
    if with_tokens:
        response["rollhub"] = _call_extension(result)
    return response
