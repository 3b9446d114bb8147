"""Token ids of a chat conversation, built so the trainer sees exactly what the engine saw.

Re-tokenising a multi-turn history can change earlier tokens (BPE merges across what used
to be a boundary, templates that trim or rewrite), so the trainer would score different ids
than the engine sampled (huggingface/trl#5224). Nothing the model generated is ever turned
back into ids here: its response ids are kept exactly as generated, and everything around
them is rendered by the model's own chat template from text the model did not write:

* `head`: the opening messages (system + first observation, and the env's `tools`),
  rendered by the template;
* `generation_prompt_ids`: what the template adds to let the assistant speak;
* `close_assistant`: the template's end of an assistant message after the response (only
  its remainder when the response already ends with the stop token, e.g. "\\n" after
  `<|im_end|>`);
* `encode_reply`: the env's reply messages as the template renders them after an assistant
  message. They are rendered after a fixed placeholder conversation, never after the
  model's decoded text, so a template that rewrites earlier turns (Qwen3-style `<think>`
  stripping, see rollhub.inference.chat_templates) or hostile model text cannot change them.

A prompt is the concatenation of those segments (`AgentConfig.multi_turn: prefix`). The
other mode, `per_turn`, renders the whole visible conversation for each turn with
`encode_conversation`: the earlier responses are then the template's rendering of their
decoded text, i.e. prompt tokens the engine sees and the trainer never trains on.

Templates that ignore `tools=` (ChatML, SmolLM2) get the tool schemas as a system-message
block (`rollhub.rollout.tool_calls.tools_system_text`) instead; `template_takes_tools` says
which case applies.
"""

from __future__ import annotations

from typing import Any

from rollhub.rollout.tool_calls import tools_system_text

_SENTINEL = "\u2063ROLLHUB_SENTINEL\u2063"
_PROBE_TOOL = "rollhub_probe_tool"
#: the conversation an env reply is rendered after (see module docstring)
_REPLY_CONTEXT = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of rendered text. Env text can hold lone surrogates (a tool printing '\\ud800'), which the
    tokenizer refuses: they become '?' here, so a program's output can never fail its episode."""
    if not text:
        return []
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:  # only text the tokenizer refuses pays for the copy
        return list(tokenizer.encode(text.encode("utf-8", "replace").decode("utf-8"), add_special_tokens=False))


class ChatSegments:
    """Token-id builder for one model's chat template (see module docstring); shared by many episodes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        probe = [{"role": "user", "content": "x"}]
        without = self._render(probe, False)
        with_prompt = self._render(probe, True)
        if not with_prompt.startswith(without):
            raise ValueError(
                "chat template is not prefix-stable: the generation prompt does not extend the rendered history"
            )
        self.generation_prompt_ids = _encode(tokenizer, with_prompt[len(without) :])
        closed = self._render(probe + [{"role": "assistant", "content": _SENTINEL}], False)
        if _SENTINEL not in closed or not closed.startswith(with_prompt):
            raise ValueError(
                "chat template is not prefix-stable for assistant messages; rollhub needs a ChatML-like template"
            )
        self._assistant_close_text = closed.split(_SENTINEL, 1)[1]
        self._close_ids = _encode(tokenizer, self._assistant_close_text)
        self._close_after_stop: dict[int, list[int]] = {}  # stop-token id -> ids of the rest of the close
        probe_tool = {"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {"type": "object"}}}
        #: whether the template renders `tools=` itself (else a system block is added, see module docstring)
        self.template_takes_tools = _PROBE_TOOL in self._render(probe, False, tools=[probe_tool])

    # --- rendering ----------------------------------------------------------------------

    def _render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> str:
        if tools and not getattr(self, "template_takes_tools", True):
            messages = _with_tools_system_message(messages, tools)
            tools = None
        extra = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )

    # --- segments -----------------------------------------------------------------------

    def encode_head(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Ids of the opening messages (no generation prompt), with the env's tools when it has any."""
        return _encode(self.tokenizer, self._render(messages, False, tools))

    def encode_conversation(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Ids of the whole conversation as the template renders it, with the generation prompt (`per_turn`)."""
        return _encode(self.tokenizer, self._render(messages, True, tools))

    def close_assistant(self, response_ids: list[int]) -> list[int]:
        """Ids that end an assistant message after `response_ids` (e.g. "\\n" or "<|im_end|>\\n").

        When the response already ends with a token whose text starts the template's closing
        text (the end-of-turn token the engine stopped on), only the rest is added.
        """
        if not response_ids:
            return list(self._close_ids)
        last = response_ids[-1]
        if last not in self._close_after_stop:
            text = self.tokenizer.convert_ids_to_tokens(last) if self._is_added_token(last) else None
            if text and self._assistant_close_text.startswith(text):
                self._close_after_stop[last] = _encode(self.tokenizer, self._assistant_close_text[len(text) :])
            else:
                self._close_after_stop[last] = list(self._close_ids)
        return list(self._close_after_stop[last])

    def encode_reply(self, reply: list[dict[str, Any]]) -> list[int]:
        """Ids of the env's `reply` messages as the template renders them right after an assistant message."""
        if not reply:
            return []
        rendered = self._render([*_REPLY_CONTEXT, *reply], False)
        marker = _SENTINEL + self._assistant_close_text
        at = rendered.find(marker)
        if at < 0:
            raise ValueError(
                "chat template rewrote the assistant message before the env's reply; "
                "rollhub needs a template that renders an assistant message's content verbatim"
            )
        return _encode(self.tokenizer, rendered[at + len(marker) :])

    def _is_added_token(self, token_id: int) -> bool:
        """Whether `token_id` is a special/added token (matched whole in text, so encoding the rest is exact)."""
        added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        return token_id in added or token_id in set(getattr(self.tokenizer, "all_special_ids", []) or [])


def _with_tools_system_message(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with the tools block appended to the system message (one added when there is none)."""
    block = tools_system_text(tools)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{block}".lstrip("\n")
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
