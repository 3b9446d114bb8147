"""Tool calls in the Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The model's text is hostile: it may hold no call, several, malformed JSON, a tag opened and
never closed (the generation ran out of tokens), tags nested inside each other, arguments of
megabytes or JSON nested thousands deep. `parse_tool_calls` never raises on any of these: it
returns the calls it could read, the text outside the call blocks, and one error string per
block it refused, so an env (or the agent's counters) can tell a malformed call from no call.

Limits are checked before any JSON is parsed (`max_call_chars`, `max_calls`), so a huge or
deeply nested payload costs one bounded scan, never a parse of unbounded size.

`ToolCallText` hands the parse to an env without changing the env contract: it *is* the
model's text (a `str`), with the parsed calls attached as attributes (rollhub.envs.base:
actions are text; envs that opted in read `action.tool_calls`).

`tools_system_text` is the fallback for chat templates that ignore `tools=` (ChatML, SmolLM2):
a system-message block, in our own words, that lists the JSON schemas and the call format.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

#: default cap on the characters inside one `<tool_call>` block
MAX_CALL_CHARS = 65_536
#: default cap on the calls read from one reply
MAX_CALLS = 16
#: a function name: what JSON-schema tool specs use in practice (letters, digits, _ . -)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for."""

    name: str
    arguments: dict[str, Any]

    def to_text(self) -> str:
        """The call written the way the model is asked to write it."""
        return OPEN_TAG + json.dumps({"name": self.name, "arguments": self.arguments}) + CLOSE_TAG

    def to_message_call(self) -> dict[str, Any]:
        """The OpenAI-style `tool_calls` entry chat templates render for an assistant message."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedToolCalls:
    """What one reply holds: the readable calls, the text outside the blocks, one error per refused block."""

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    errors: list[str] = field(default_factory=list)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decode_call(payload: str, allowed_names: frozenset[str] | None) -> ToolCall:
    """One block's JSON as a ToolCall; raises ValueError with the reason."""
    payload = payload.strip()
    if payload.startswith("```"):  # some models fence the JSON inside the tag
        payload = payload.strip("`").strip()
        if payload.startswith("json"):
            payload = payload[4:].strip()
    if not payload:
        raise ValueError("empty tool call")
    try:
        data = json.loads(payload, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("tool call JSON nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError, huge integers, NaN
        raise ValueError(f"tool call is not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"tool call must be a JSON object, got {type(data).__name__}")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("tool call needs a 'name': a string of letters, digits, '_', '.' or '-'")
    if allowed_names is not None and name not in allowed_names:
        raise ValueError(f"unknown tool '{name}'")
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments, parse_constant=_refuse_constant) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise ValueError(f"arguments of '{name}' are a string that is not JSON") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(f"arguments of '{name}' must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name, arguments)


def parse_tool_calls(
    text: str,
    *,
    allowed_names: set[str] | frozenset[str] | None = None,
    max_calls: int = MAX_CALLS,
    max_call_chars: int = MAX_CALL_CHARS,
) -> ParsedToolCalls:
    """Read every `<tool_call>` block of `text` (see module docstring); never raises on model output.

    A block runs from an opening tag to the next closing tag. An opening tag met again before
    that closing tag means the first one was never closed: it is refused ("nested") and reading
    restarts at the inner tag, so `<tool_call><tool_call>{...}</tool_call></tool_call>` yields the
    inner call and one error. A stray closing tag is left in `content`. `allowed_names` (the
    env's tool names) turns an unknown name into an error instead of a call.
    """
    if max_calls < 0 or max_call_chars < 1:
        raise ValueError("max_calls must be >= 0 and max_call_chars >= 1")
    allowed = frozenset(allowed_names) if allowed_names is not None else None
    result = ParsedToolCalls()
    outside: list[str] = []
    position = 0
    end = -1  # the next closing tag, searched again only once reading has passed it (keeps this linear)
    while True:
        start = text.find(OPEN_TAG, position)
        if start < 0:
            outside.append(text[position:])
            break
        outside.append(text[position:start])
        body_start = start + len(OPEN_TAG)
        if end < body_start:
            end = text.find(CLOSE_TAG, body_start)
        inner_open = text.find(OPEN_TAG, body_start, end if end >= 0 else len(text))
        if end < 0:
            result.errors.append("unterminated <tool_call> (no closing tag)")
            outside.append(text[start:])
            break
        if 0 <= inner_open < end:
            result.errors.append("nested <tool_call>: the outer tag was never closed")
            position = inner_open
            continue
        position = end + len(CLOSE_TAG)
        body_length = end - body_start
        if len(result.calls) >= max_calls:
            result.errors.append(f"more than {max_calls} tool calls in one reply: the rest are ignored")
            continue
        if body_length > max_call_chars:
            result.errors.append(f"tool call of {body_length} characters exceeds the limit of {max_call_chars}")
            continue
        try:
            result.calls.append(_decode_call(text[body_start:end], allowed))
        except ValueError as exc:
            result.errors.append(str(exc))
    result.content = "".join(outside).strip()
    # several refusals of one kind (a reply with 10,000 blocks) are reported once with a count
    if len(result.errors) > max_calls:
        kept = result.errors[:max_calls]
        result.errors = [*kept, f"... and {len(result.errors) - len(kept)} more refused blocks"]
    return result


class ToolCallText(str):
    """The model's reply text with its parsed tool calls attached (`tool_calls`, `tool_call_errors`).

    A `str` subclass, so every env that reads actions as text keeps working unchanged.
    """

    tool_calls: list[ToolCall]
    tool_call_errors: list[str]

    def __new__(cls, text: str, parsed: ParsedToolCalls) -> ToolCallText:
        value = super().__new__(cls, text)
        value.tool_calls = list(parsed.calls)
        value.tool_call_errors = list(parsed.errors)
        return value


def tool_names(tools: list[dict[str, Any]]) -> set[str]:
    """Function names of OpenAI-style tool specs (`{"type": "function", "function": {"name": ...}}`)."""
    names = set()
    for spec in tools:
        function = spec.get("function", spec) if isinstance(spec, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool spec without a function name: {str(spec)[:120]}")
        names.add(name)
    return names


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """A system-message block describing `tools`, for chat templates that ignore `tools=`."""
    schemas = "\n".join(json.dumps(spec, sort_keys=True) for spec in tools)
    return (
        "Functions you may call, as JSON schemas:\n<tools>\n"
        f"{schemas}\n</tools>\n"
        "To call a function, write "
        '<tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>; '
        "its result comes back in the next message."
    )
