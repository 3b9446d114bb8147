"""Actions for an env that ships no random agent: drawn from the examples its own messages show.

`rollhub envs try --agent random` must play every env, including one written in ten lines
(the README's `mine/Coin-v0`) or adapted from another standard, which rarely implement
`random_action`. Every env does tell its player how to answer, in its messages
("Say <action>heads</action>", "Answer with <guess>N</guess>", "put it in \\boxed{}") or in its
declared `tools`. `example_action` reads that: it keeps the answer's markup and fills it with
the example's own content or a word or number of the latest message. It is a smoke-test
player, not a baseline: it shows that an episode runs end to end, not how hard the task is.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollhub.envs.base import Observation, wrap_action

_TAGGED = re.compile(r"<(?P<tag>[A-Za-z_][\w-]*)>(?P<content>[^<>]{0,80})</(?P=tag)>")
_BOXED = re.compile(r"\\boxed\{(?P<content>[^{}]{0,80})\}")
_MARKUP = re.compile(r"<[^<>]*>")
_WORD = re.compile(r"-?\d+(?:\.\d+)?|[A-Za-z][\w'-]*")


def action_or_example(env: Any, conversation: Observation, rng: Any) -> str:
    """The env's own `random_action` where it has one, else `example_action`."""
    try:
        return env.random_action(rng)
    except NotImplementedError:
        return example_action(env, conversation, rng)


def example_action(env: Any, conversation: Observation, rng: Any) -> str:
    """A well-formed guess at an action of `env`, from what `conversation` (every message so far)
    and `env.tools` show. `rng` is a `numpy.random.Generator`."""
    latest = conversation[-1]["content"] if conversation else ""
    words = _WORD.findall(_MARKUP.sub(" ", latest))
    if env.tools:
        return _tool_call(env.tools[int(rng.integers(len(env.tools)))], words, rng)
    text = "\n".join(message["content"] for message in conversation)
    tagged = [m for m in _TAGGED.finditer(text) if m.group("tag") not in ("think", "tool_call")]
    own = [m for m in tagged if m.group("tag") == env.action_tag]
    if own or tagged:
        shown = own or tagged
        tag = shown[int(rng.integers(len(shown)))].group("tag")
        contents = [m.group("content").strip() for m in shown if m.group("tag") == tag] + words
        return f"<{tag}>{_pick(contents, rng)}</{tag}>"
    boxed = [m.group("content").strip() for m in _BOXED.finditer(text)]
    if boxed:
        return f"\\boxed{{{_pick(boxed + words, rng)}}}"
    return wrap_action(_pick(words, rng), env.action_tag)


def _pick(candidates: list[str], rng: Any) -> str:
    candidates = [c for c in candidates if c]
    return candidates[int(rng.integers(len(candidates)))] if candidates else "yes"


def _tool_call(tool: dict[str, Any], words: list[str], rng: Any) -> str:
    """A `<tool_call>` of an OpenAI-style tool spec with arguments of the declared types."""
    function = tool.get("function", tool)
    schema = function.get("parameters") or {}
    numbers = [w for w in words if re.fullmatch(r"-?\d+(?:\.\d+)?", w)]
    arguments: dict[str, Any] = {}
    for name, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if isinstance(spec, dict) and spec.get("enum"):
            arguments[name] = spec["enum"][int(rng.integers(len(spec["enum"])))]
        elif kind == "integer":
            arguments[name] = int(float(_pick(numbers, rng))) if numbers else int(rng.integers(10))
        elif kind == "number":
            arguments[name] = float(_pick(numbers, rng)) if numbers else float(rng.integers(10))
        elif kind == "boolean":
            arguments[name] = bool(rng.integers(2))
        elif kind == "array":
            arguments[name] = []
        elif kind == "object":
            arguments[name] = {}
        else:
            arguments[name] = _pick(words, rng)
    return f"<tool_call>{json.dumps({'name': function.get('name', ''), 'arguments': arguments})}</tool_call>"
