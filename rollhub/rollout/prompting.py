"""Incremental chat-template tokenisation: prompts grow by appending ids, never re-tokenising.

Re-tokenising a multi-turn history can change earlier tokens (BPE merges across what used
to be a boundary, templates that trim), so the trainer would score different ids than the
engine sampled (huggingface/trl#5224). Instead each piece of the conversation is turned
into ids once:

* `head`: the opening messages (system + first observation), rendered by the template;
* per turn: the generation prompt, the sampled response ids exactly as generated, the
  template's closing text for an assistant message, and the env's reply rendered as a
  delta (render(history + reply) minus render(history));

and a prompt is the concatenation of those segments. This works for any template that is
prefix-stable (rendering more messages only appends text), which ChatML templates are;
`ChatSegments` checks it and raises a clear error otherwise.
"""

from __future__ import annotations

from typing import Any

_SENTINEL = "\u2063ROLLHUB_SENTINEL\u2063"


def _render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


class ChatSegments:
    """Token-id builder for one conversation (see module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        probe = [{"role": "user", "content": "x"}]
        without = _render(tokenizer, probe, False)
        with_prompt = _render(tokenizer, probe, True)
        if not with_prompt.startswith(without):
            raise ValueError(
                "chat template is not prefix-stable: the generation prompt does not extend the rendered history"
            )
        self.generation_prompt_ids = _encode(tokenizer, with_prompt[len(without) :])
        closed = _render(tokenizer, probe + [{"role": "assistant", "content": _SENTINEL}], False)
        if _SENTINEL not in closed or not closed.startswith(with_prompt):
            raise ValueError(
                "chat template is not prefix-stable for assistant messages; rollhub needs a ChatML-like template"
            )
        self._assistant_close_text = closed.split(_SENTINEL, 1)[1]
        eos = tokenizer.eos_token or ""
        self._eos_id = tokenizer.eos_token_id
        self._close_after_eos = (
            self._assistant_close_text[len(eos) :] if eos and self._assistant_close_text.startswith(eos) else None
        )

    def encode_head(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of the opening messages (no generation prompt)."""
        return _encode(self.tokenizer, _render(self.tokenizer, messages, False))

    def close_assistant(self, response_ids: list[int]) -> list[int]:
        """Ids that end an assistant message after `response_ids` (e.g. "\\n" or "<|im_end|>\\n")."""
        if response_ids and response_ids[-1] == self._eos_id and self._close_after_eos is not None:
            return _encode(self.tokenizer, self._close_after_eos)
        return _encode(self.tokenizer, self._assistant_close_text)

    def encode_reply(self, history: list[dict[str, str]], reply: list[dict[str, str]]) -> list[int]:
        """Ids of `reply` messages appended after `history` (which ends with the assistant turn)."""
        if not reply:
            return []
        before = _render(self.tokenizer, history, False)
        after = _render(self.tokenizer, history + reply, False)
        if not after.startswith(before):
            raise ValueError("chat template is not prefix-stable: appending a message changed earlier text")
        return _encode(self.tokenizer, after[len(before) :])
