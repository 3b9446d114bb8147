"""SIMULATION ONLY: a cheap tokenizer with a ChatML template, for scheduling benchmarks.

The agent layer renders the chat template and tokenises every env reply. With the real
BPE tokenizer that costs a few milliseconds per turn, which is real work of a real run but
not scheduling; it would dominate a simulation of thousands of trajectories and hide what
the benchmark measures. This tokenizer keeps the shape (ChatML, prefix-stable, ~4
characters per token, so prompt lengths and prefill costs stay realistic) at a fraction of
the cost. `rollhub bench sched-overhead` reports both tokenizers side by side.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

_CHARS_PER_TOKEN = 4
_SPECIAL = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class SimTokenizer:
    """Enough of the transformers tokenizer interface for `rollhub.rollout.prompting`."""

    eos_token = "<|im_end|>"
    pad_token = "<|pad|>"
    padding_side = "left"

    def __init__(self, vocab_size: int = 8192):
        if vocab_size <= len(_SPECIAL):
            raise ValueError("vocab_size too small")
        self.vocab_size = vocab_size
        self.eos_token_id = _SPECIAL.index(self.eos_token)
        self.pad_token_id = _SPECIAL.index(self.pad_token)
        self.busy_s = 0.0  # real time spent in this tokenizer (benchmarks subtract it)
        self._pieces = list(_SPECIAL) + [f"t{i} " for i in range(len(_SPECIAL), vocab_size)]

    def __len__(self) -> int:
        return self.vocab_size

    def apply_chat_template(
        self, messages: list[dict[str, str]], tokenize: bool = False, add_generation_prompt: bool = False, **_: Any
    ) -> Any:
        cpu = time.perf_counter()
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        self.busy_s += time.perf_counter() - cpu
        return self.encode(text) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        cpu = time.perf_counter()
        ids = self._encode(text)
        self.busy_s += time.perf_counter() - cpu
        return ids

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _split_special(text):
            if piece in _SPECIAL:
                ids.append(_SPECIAL.index(piece))
                continue
            for i in range(0, len(piece), _CHARS_PER_TOKEN):
                chunk = piece[i : i + _CHARS_PER_TOKEN].encode()
                ids.append(len(_SPECIAL) + zlib.crc32(chunk) % (self.vocab_size - len(_SPECIAL)))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        cpu = time.perf_counter()
        pieces = self._pieces
        if skip_special_tokens:
            text = "".join(pieces[t] for t in ids if t >= len(_SPECIAL))
        else:
            text = "".join(pieces[t] for t in ids)
        self.busy_s += time.perf_counter() - cpu
        return text


def _split_special(text: str) -> list[str]:
    """Split text so special tokens stand alone."""
    pieces = [text]
    for special in _SPECIAL:
        split: list[str] = []
        for piece in pieces:
            if piece in _SPECIAL:
                split.append(piece)
                continue
            parts = piece.split(special)
            for k, part in enumerate(parts):
                if k:
                    split.append(special)
                if part:
                    split.append(part)
        pieces = split
    return pieces
