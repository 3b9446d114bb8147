"""KV-cache helpers of the in-process engine: prefix reuse, in-place growth, padding."""

from __future__ import annotations

import collections
from typing import Any

import torch


def pad_left(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class PrefixCache:
    """KV of finished requests, reused when a new prompt starts with the same ids.

    Multi-turn prompts repeat the whole history (and the N members of a group share their
    opening), so without this every turn re-prefills the full context, which dominates
    CPU time. Exact-prefix match, LRU eviction by total cached tokens; cleared on every
    weight update (the cached keys/values were computed by the old weights).

    An entry stored with `logits` (the next-token logits after its last id) also answers a
    prompt equal to it: `lookup_exact` gives its KV and those logits, so a repeated prompt
    costs no forward at all. Markov agents repeat whole prompts all the time (the samples of
    a group stand on the same board until their moves differ: 73% of the main job's prompts
    within one policy version), and a one-token turn is nothing but that first distribution.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: collections.OrderedDict[tuple[int, ...], tuple[list[torch.Tensor], list[torch.Tensor]]] = (
            collections.OrderedDict()
        )
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}
        self.tokens = 0
        self.hits = 0
        self.hit_tokens = 0
        self.exact_hits = 0

    def store(
        self,
        ids: list[int],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        logits: torch.Tensor | None = None,
    ) -> None:
        """Keep the KV of `ids` (and, with `logits`, the next-token logits after them)."""
        if self.max_tokens <= 0 or len(ids) < 2 or len(ids) > self.max_tokens:
            return
        key = tuple(ids)
        if logits is not None:
            self._logits[key] = logits
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = (keys, values)
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._logits.pop(old, None)
            self.tokens -= len(old)

    def lookup_exact(
        self, prompt: list[int] | tuple[int, ...]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor] | None:
        """KV and next-token logits of exactly `prompt`, if stored with logits."""
        key = tuple(prompt)  # (no copy when given a tuple)
        logits = self._logits.get(key)
        if logits is None:
            return None
        self._entries.move_to_end(key)
        self.exact_hits += 1
        keys, values = self._entries[key]
        return keys, values, logits

    def lookup(self, prompt: list[int]) -> tuple[int, list[torch.Tensor], list[torch.Tensor]] | None:
        """Longest cached prefix strictly shorter than `prompt` (>= 1 token left to prefill)."""
        best: tuple[int, ...] | None = None
        for key in self._entries:
            n = len(key)
            if n < len(prompt) and (best is None or n > len(best)) and prompt[:n] == list(key):
                best = key
        if best is None:
            return None
        self._entries.move_to_end(best)
        self.hits += 1
        self.hit_tokens += len(best)
        keys, values = self._entries[best]
        return len(best), keys, values

    def clear(self) -> None:
        self._entries.clear()
        self._logits.clear()
        self.tokens = 0


def growing_layer_class() -> type:
    """A DynamicLayer that appends into spare capacity instead of torch.cat every step.

    The stock layer copies the whole cache on every decoded token (O(T) per step); this one
    over-allocates and writes in place, reallocating only when full or when the engine
    replaced `keys`/`values` (row selection, merges).
    """
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self._key_store = self._value_store = None
            used = self.keys.shape[-2] if self.keys.numel() else 0
            needed = used + key_states.shape[-2]
            store = getattr(self, "_key_store", None)
            fits = (
                store is not None
                and store.shape[:2] == key_states.shape[:2]
                and store.shape[-2] >= needed
                and used > 0
                and self.keys.data_ptr() == store.data_ptr()
            )
            if not fits:
                capacity = needed + max(64, needed // 2)
                shape = (*key_states.shape[:2], capacity, key_states.shape[-1])
                self._key_store = key_states.new_empty(shape)
                self._value_store = value_states.new_empty(shape)
                if used:
                    self._key_store[:, :, :used] = self.keys
                    self._value_store[:, :, :used] = self.values
            self._key_store[:, :, used:needed] = key_states
            self._value_store[:, :, used:needed] = value_states
            self.keys = self._key_store[:, :, :needed]
            self.values = self._value_store[:, :, :needed]
            return self.keys, self.values

    return GrowingLayer
