"""The tokens every row of a batch starts with, run once; every micro-batch reads their keys and values.

Agent episodes repeat a long opening (system prompt, tool schema, a worked example) before
anything that differs: on MathTool with SmolLM2 270 of an episode's ~470 tokens. A padded
micro-batch forwards and backwards that opening once per row. Here the opening runs once per
training step (`PrefixKV.compute`): its per-layer keys and values are detached into leaves that
each micro-batch's cache reads (expanded over its rows, no copy); the micro-batches' backward
passes gather the gradient of the loss with respect to those leaves, and `backward` sends the
sum through the opening's own graph once. The gradient is the full one, up to float rounding
(`tests/trainer/test_prefix_kv.py` compares it with the padded path's).

Only tokens before every row's first predicted response token are shared: the opening's hidden
states are never projected, so it needs no head and no row-specific output.

The opening's keys are rotated once, in a forward of the opening's own length, and read by rows of
another length. That holds only for rotary embeddings whose frequencies do not depend on the
sequence length; `refuse_length_dependent_rope` turns the others away (`dynamic` NTK scaling
recomputes them past the pretraining length, `longrope` switches between short and long factors).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

#: shorter common openings run with the rows: below this the extra forward call costs more than it saves
MIN_SHARED_TOKENS = 16


def shared_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor) -> int:
    """How many leading tokens every row holds alike and none of them needs a prediction from.

    Token t is predicted at position t - 1, so the shared span stops one before the earliest
    response token; it also leaves every row at least one token of its own to run.
    """
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0)
    common = int(same.long().cumprod(0).sum())
    lengths = attention_mask.sum(-1)
    responding = response_mask.gt(0)
    if bool(responding.any()):
        first = int(torch.where(responding.any(-1), responding.float().argmax(-1), lengths).min())
    else:
        first = int(lengths.min())
    return max(0, min(common, first - 1, int(lengths.min()) - 1))


def rope_types(model: Any) -> set[str]:
    """Every rope type `model` runs: its rotary modules' `rope_type` (a name, or one per layer type)
    and its config's `rope_parameters` / `rope_scaling` (one dict, or one per layer type)."""
    found: set[str] = set()

    def add(value: Any) -> None:
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, dict):
            if isinstance(value.get("rope_type", value.get("type")), str):
                found.add(value.get("rope_type", value.get("type")))
            for inner in value.values():
                if isinstance(inner, dict):
                    add(inner)

    for module in model.modules():
        add(getattr(module, "rope_type", None))
    config = getattr(model, "config", None)
    for config_part in (config, getattr(config, "text_config", None)):
        for key in ("rope_parameters", "rope_scaling"):
            add(getattr(config_part, key, None))
    return found


def length_dependent_rope(types: set[str]) -> str | None:
    """The first of `types` whose frequencies a forward picks from its sequence length, else None: as
    transformers' `dynamic_rope_update` does, any type naming "dynamic", and `longrope`."""
    return next((t for t in sorted(types) if "dynamic" in t or t == "longrope"), None)


def refuse_length_dependent_rope(model: Any) -> None:
    """Raise a UserError naming the fix when `model`'s RoPE makes a shared opening wrong (module docstring)."""
    from rollhub.core.errors import UserError

    bad = length_dependent_rope(rope_types(model))
    if bad is not None:
        raise UserError(
            f"optim.share_prefix cannot run this model: its RoPE (rope_type {bad!r}) picks its frequencies from "
            "the sequence length, so the shared opening's keys, rotated at the opening's length, would not be "
            "those the rows' own forward uses and every log-prob would be silently off; set optim.share_prefix: false"
        )


def _cache_argument(decoder: Any) -> str:
    """The name a transformers decoder's forward takes its cache under (renamed within 5.x)."""
    parameters = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@dataclass
class PrefixKV:
    """One run of a batch's shared opening (see the module docstring)."""

    length: int
    computed: list[torch.Tensor]  # keys and values per layer as the opening's forward made them
    leaves: list[torch.Tensor]  # the same values, detached: the micro-batches' caches read these
    cache_argument: str

    @classmethod
    def compute(cls, decoder: Any, input_ids: torch.Tensor, length: int) -> PrefixKV:
        """Run `input_ids[0, :length]` through `decoder` (with gradient if enabled by the caller)."""
        from transformers import DynamicCache

        name, cache = _cache_argument(decoder), DynamicCache()
        decoder(
            input_ids=input_ids[:1, :length],
            attention_mask=torch.ones((1, length), dtype=torch.long, device=input_ids.device),
            use_cache=True,
            **{name: cache},
        )
        computed = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in computed]
        return cls(length, computed, leaves, name)

    def inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, Any]:
        """Decoder keyword arguments for right-padded rows that start with the opening: their own
        tokens only, at their true positions, with a cache over the shared keys and values."""
        from transformers import DynamicCache

        rows, width = input_ids.shape
        expanded = [t.expand(rows, -1, -1, -1) for t in self.leaves]
        cache = DynamicCache(list(zip(expanded[0::2], expanded[1::2])))
        positions = torch.arange(self.length, width, device=input_ids.device).expand(rows, -1)
        return {
            "input_ids": input_ids[:, self.length :],
            "attention_mask": attention_mask,
            "position_ids": positions,
            self.cache_argument: cache,
        }

    def backward(self) -> None:
        """Send the gradient the micro-batches left on the leaves through the opening's graph."""
        pairs = [(c, leaf.grad) for c, leaf in zip(self.computed, self.leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([c for c, _ in pairs], [g for _, g in pairs])
        self.computed, self.leaves = [], []
