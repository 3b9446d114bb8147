"""Chat messages as the gateway compares them and as chat templates render them.

A call continues an earlier one when its messages start with that call's messages plus the
assistant message the gateway answered. Clients echo that message back in their own shape
(the `openai` package's `model_dump()`, a hand-written dict, content `None` or `""`, tool-call
arguments as a JSON string, with ids and extra null fields), so messages are compared by
`message_key`: role, text, tool calls by name and parsed arguments, the tool message's
`tool_call_id`; tool-call ids and fields that do not reach the template are left out.

`template_message` turns an OpenAI message into what chat templates take: text content,
`tool_calls` with arguments as objects. A template that does not render `tool_calls`
(ChatML, SmolLM2) gets them written into the content the way the model writes them
(`ToolCall.to_text`), so a re-rendered history still shows the calls.
"""

from __future__ import annotations

import json
from typing import Any

from rollhub.rollout.gateway.errors import bad_param
from rollhub.rollout.tool_calls import ToolCall


def content_text(message: dict[str, Any], where: str) -> str:
    """A message's content as text: a string, null, or a list of text parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_param(f"{where}.content", f"{where}: only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_param(f"{where}.content", f"{where}: content must be a string, null or a list of text parts")


def message_tool_calls(message: dict[str, Any], where: str) -> list[ToolCall]:
    """The assistant message's `tool_calls` as ToolCall objects (arguments parsed from JSON text)."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise bad_param(f"{where}.tool_calls", f"{where}: tool_calls must be a list")
    result = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise bad_param(f"{where}.tool_calls[{index}]", f"{where}.tool_calls[{index}] needs function.name")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):
                raise bad_param(
                    f"{where}.tool_calls[{index}]", f"{where}.tool_calls[{index}]: arguments are not JSON"
                ) from None
        if not isinstance(arguments, dict):
            raise bad_param(f"{where}.tool_calls[{index}]", f"{where}.tool_calls[{index}]: arguments must be an object")
        result.append(ToolCall(name, arguments))
    return result


def message_key(message: dict[str, Any], index: int) -> str:
    """What decides whether two messages are the same turn (module docstring), as a comparable string."""
    where = f"messages[{index}]"
    role = "system" if message["role"] == "developer" else message["role"]
    key: dict[str, Any] = {"role": role, "content": content_text(message, where)}
    if role == "assistant":
        key["tool_calls"] = [[c.name, c.arguments] for c in message_tool_calls(message, where)]
    if role == "tool":
        key["tool_call_id"] = message.get("tool_call_id")
    return json.dumps(key, sort_keys=True, ensure_ascii=False)


def template_message(message: dict[str, Any], index: int, template_takes_tools: bool) -> dict[str, Any]:
    """An OpenAI message in the shape chat templates render (module docstring)."""
    where = f"messages[{index}]"
    role = "system" if message["role"] == "developer" else message["role"]
    text = content_text(message, where)
    if role != "assistant":
        rendered: dict[str, Any] = {"role": role, "content": text}
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            rendered["tool_call_id"] = message["tool_call_id"]
        return rendered
    calls = message_tool_calls(message, where)
    if not calls:
        return {"role": "assistant", "content": text}
    if template_takes_tools:
        return {"role": "assistant", "content": text, "tool_calls": [c.to_message_call() for c in calls]}
    written = "\n".join(c.to_text() for c in calls)
    return {"role": "assistant", "content": f"{text}\n{written}" if text else written}
