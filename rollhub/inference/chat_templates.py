"""Chat templates rollhub writes itself, and checks of what a template does to a conversation.

`REASONING_TEMPLATE` is a ChatML template in the style of reasoning models such as Qwen3
(written here from a description of that behaviour, not copied): an assistant message
that comes before the latest user message loses its `<think>...</think>` part when the
conversation is rendered, so a served model never re-reads its old reasoning. That makes
the template *rewrite earlier turns*: rendering one more user message changes text that
was already rendered, so a prompt built by appending token ids (`AgentConfig.multi_turn:
prefix`) is no longer what the template would render, and re-rendering each turn
(`multi_turn: per_turn`) no longer extends the previous prompt. rollhub's tests run both
modes on it. It also takes `tools=` the way Hermes / Qwen templates do: a `<tools>` block of
JSON schemas in the system message, `<tool_call>` JSON in assistant messages, and `tool`
messages rendered as `<tool_response>` blocks inside one user turn.

`build_reasoning_tokenizer()` puts that template on the committed tiny BPE tokenizer, with
`<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>` and `</tool_response>`
as added, non-special tokens (one id each, kept when decoding with skip_special_tokens,
as in Qwen3's tokenizer).

`rewrites_history(tokenizer)` tells whether a template rewrites earlier turns.
"""

from __future__ import annotations

from typing import Any

#: the added tokens of `build_reasoning_tokenizer` (ordinary text to the template, one id each)
REASONING_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

REASONING_TEMPLATE = (
    # index of the latest user message: assistant turns before it lose their reasoning
    "{%- set state = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set state.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- set has_system = messages | length > 0 and messages[0]['role'] == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "{{- 'Available functions (JSON schemas):\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson + '\\n' -}}{%- endfor -%}"
    '{{- \'</tools>\\nCall a function by writing <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.\''
    " + '<|im_end|>\\n' -}}"
    "{%- elif has_system -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = message['role'] -%}"
    "{%- if role == 'system' and loop.first -%}"
    "{%- elif role == 'assistant' -%}"
    "{%- set text = message['content'] if message['content'] is string else '' -%}"
    "{%- if loop.index0 < state.last_user and '</think>' in text -%}"
    "{%- set text = text.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + text -}}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set function = call['function'] if call['function'] is defined else call -%}"
    "{%- set arguments = function['arguments'] if function['arguments'] is string"
    " else function['arguments'] | tojson -%}"
    "{{- '\\n<tool_call>{\"name\": \"' + function['name'] + '\", \"arguments\": ' + arguments + '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + role + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_reasoning_tokenizer() -> Any:
    """The tiny model's tokenizer with `REASONING_TEMPLATE` and the `REASONING_TOKENS` added."""
    from tokenizers import AddedToken

    from rollhub.inference.models import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in REASONING_TOKENS])
    tokenizer.chat_template = REASONING_TEMPLATE
    return tokenizer


def rewrites_history(tokenizer: Any) -> bool:
    """True when rendering a later user message changes how an earlier assistant turn was rendered.

    Probed with a reply that holds a `<think>` block, the case reasoning templates rewrite; a
    template that raises on the probe counts as rewriting (rollhub cannot vouch for it).
    """
    opening = [{"role": "user", "content": "2+2?"}]
    answer = {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}
    try:
        before = tokenizer.apply_chat_template([*opening, answer], tokenize=False)
        after = tokenizer.apply_chat_template([*opening, answer, {"role": "user", "content": "3+3?"}], tokenize=False)
    except Exception:  # jinja errors: unusual roles, raise_exception in the template
        return True
    return not after.startswith(before)
