"""Hermes / Qwen `<tool_call>` parsing on hostile model output: never raises, bounded work."""

from __future__ import annotations

import json
import time

import pytest

from rollhub.inference.chat_templates import build_reasoning_tokenizer
from rollhub.rollout.tool_calls import (
    ToolCall,
    ToolCallText,
    parse_tool_calls,
    tool_names,
    tools_system_text,
)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_one_call_and_the_text_around_it():
    parsed = parse_tool_calls("Let me look.\n" + call("bash", command="ls -la") + "\nthen wait")
    assert parsed.calls == [ToolCall("bash", {"command": "ls -la"})]
    assert parsed.errors == [] and parsed.content == "Let me look.\n\nthen wait"


def test_several_calls_in_order_and_arguments_as_a_json_string():
    text = call("a", x=1) + ' <tool_call>\n{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}\n</tool_call>' + call("c")
    parsed = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("a", {"x": 1}), ("b", {"y": [1, 2]}), ("c", {})]


def test_no_call_is_not_an_error():
    parsed = parse_tool_calls("just text with </tool_call> stray closing tag")
    assert parsed.calls == [] and parsed.errors == []
    assert "</tool_call>" in parsed.content


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("{oops", "not valid JSON"),
        ("", "empty"),
        ("[1, 2]", "JSON object"),
        ('{"arguments": {}}', "'name'"),
        ('{"name": "rm -rf /", "arguments": {}}', "'name'"),
        ('{"name": "a", "arguments": [1]}', "JSON object"),
        ('{"name": "a", "arguments": "not json"}', "not JSON"),
        ('{"name": "a", "arguments": {"x": NaN}}', "not valid JSON"),
        ('{"name": "a", "arguments": {"x": ' + "9" * 5000 + "}}", "not valid JSON"),
        ('{"name": "a", "arguments": {}} trailing', "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
    ids=lambda value: value[:20] if isinstance(value, str) else str(value),
)
def test_malformed_calls_become_errors(payload, reason):
    parsed = parse_tool_calls(f"<tool_call>{payload}</tool_call>" + call("ok"), max_call_chars=1_000_000)
    assert [c.name for c in parsed.calls] == ["ok"]  # the good call after a bad one still counts
    assert len(parsed.errors) == 1 and reason in parsed.errors[0], parsed.errors


def test_unterminated_and_nested_tags():
    parsed = parse_tool_calls(call("a") + '<tool_call>{"name": "b", "arguments": {}')  # cut off by max tokens
    assert [c.name for c in parsed.calls] == ["a"] and "unterminated" in parsed.errors[0]
    nested = parse_tool_calls(
        "<tool_call><tool_call>" + json.dumps({"name": "inner", "arguments": {}}) + "</tool_call></tool_call>"
    )
    assert [c.name for c in nested.calls] == ["inner"]
    assert len(nested.errors) == 1 and "nested" in nested.errors[0]


def test_unknown_tool_names_are_refused_when_the_env_lists_its_tools():
    parsed = parse_tool_calls(call("bash", command="ls") + call("rm_everything"), allowed_names={"bash"})
    assert [c.name for c in parsed.calls] == ["bash"] and "unknown tool 'rm_everything'" in parsed.errors[0]


def test_huge_arguments_and_floods_are_bounded():
    big = call("write", text="x" * 2_000_000)
    parsed = parse_tool_calls(big)
    assert parsed.calls == [] and "exceeds the limit" in parsed.errors[0]
    flood = call("a") * 10_000
    started = time.perf_counter()
    parsed = parse_tool_calls(flood, max_calls=4)
    assert len(parsed.calls) == 4 and len(parsed.errors) <= 5 and "more refused" in parsed.errors[-1]
    # many opening tags and a single close at the end: linear, not quadratic
    parse_tool_calls("<tool_call>" * 200_000 + "</tool_call>")
    parse_tool_calls("<tool_call>" * 200_000)
    assert time.perf_counter() - started < 5.0


def test_parsing_text_decoded_from_real_token_ids():
    tokenizer = build_reasoning_tokenizer()
    text = "<think>need a sum</think>" + call("add", a=2, b=3)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids  # one id, like Qwen's tokenizer
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert parse_tool_calls(decoded).calls == [ToolCall("add", {"a": 2, "b": 3})]


def test_tool_call_text_is_the_text_with_calls_attached():
    action = ToolCallText("hi " + call("a"), parse_tool_calls("hi " + call("a")))
    assert isinstance(action, str) and action.startswith("hi ") and action.tool_calls == [ToolCall("a", {})]
    assert ToolCall("a", {"x": 1}).to_text() == call("a", x=1)


def test_tool_specs_helpers():
    spec = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    assert tool_names([spec]) == {"add"}
    with pytest.raises(ValueError, match="function name"):
        tool_names([{"type": "function", "function": {}}])
    assert '"name": "add"' in tools_system_text([spec])
