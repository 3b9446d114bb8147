"""A lean forward pass for Llama-family decoders (Llama, Qwen2, Qwen3) over a slot KV cache.

Why: on the CPU a small model's decode step is mostly overhead around a few small matmuls.
The transformers forward spends it on per-module Python wrappers, mask building, a cache
object that concatenates and a rotary embedding recomputed every step; the engine around it
spent more on concatenating and re-selecting the whole batch's KV every time a request
joined or left. Here a step is about twenty tensor ops per layer:

* weights are packed once per weight version: q/k/v as one pre-transposed matrix, gate/up
  as another (fewer, larger matmuls), the softmax scale folded into the query side, and the
  rotary pairs (i, i + d/2) of every query/key head interleaved, so RoPE is one complex
  multiply against a table computed once by the model's own rotary module;
* the KV cache is a set of preallocated slots (`SlotKVCache`): request r lives in row r,
  its tokens at positions 0..n-1; a decode step writes one column per row in place, a
  finished request's row is refilled by moving the last row into it (O(its length)), and
  newcomers are prefilled straight into free rows, so nothing else is ever copied.

The packed weights are checked against every parameter's data pointer and in-place version
counter at each step and rebuilt when any changed (`update_weights`, an optimizer step on a
shared model), so the pass never runs on stale weights. Numerics are those of the
transformers forward up to float rounding (tested to 1e-4 in log-prob in fp32).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def unsupported_reason(model: Any) -> str | None:
    """Why `model` cannot use the lean pass (None = it can); the engine then uses transformers."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    if getattr(config, "use_sliding_window", False) or any(
        kind != "full_attention" for kind in (getattr(config, "layer_types", None) or [])
    ):
        return "sliding-window attention"
    if getattr(config, "mlp_bias", False) or getattr(config, "pretraining_tp", 1) != 1:
        return "MLP bias or tensor-parallel pretraining split"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        return f"rope type {rope_type!r}"
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, name) for name in needed) or not hasattr(model, "lm_head"):
        return "unexpected module layout"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim % 2:
        return "odd head dimension"
    return None


class SlotKVCache:
    """Per-layer keys/values [rows, kv_heads, positions, head_dim]; row r = the r-th request.

    Grows (rows and positions, by doubling) only when a step needs more; contents are kept.
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        max_rows: int,
        max_positions: int,
    ) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.max_rows, self.max_positions = max_rows, max_positions
        self.rows = 0
        self.positions = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    @torch.inference_mode()
    def reserve(self, rows: int, positions: int) -> None:
        """Make room for `rows` rows of `positions` positions (existing contents kept)."""
        if rows <= self.rows and positions <= self.positions:
            return
        new_rows = max(self.rows, min(self.max_rows, _next_power_of_two(rows)), rows)
        new_positions = max(self.positions, positions)
        if positions > self.positions:
            new_positions = max(positions, min(self.max_positions, max(64, 2 * self.positions)))
        shape = (new_rows, self.kv_heads, new_positions, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)]
        if self.rows and self.positions:
            for new, old in zip(keys + values, self.keys + self.values):
                new[: self.rows, :, : self.positions] = old
        self.keys, self.values = keys, values
        self.rows, self.positions = new_rows, new_positions

    @torch.inference_mode()
    def move(self, source: int, target: int, length: int) -> None:
        """Copy row `source`'s first `length` positions into row `target`."""
        if length <= 0 or source == target:
            return
        for tensor in self.keys + self.values:
            tensor[target, :, :length] = tensor[source, :, :length]

    @torch.inference_mode()
    def read(self, row: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of one row's first `length` positions, per layer [1, kv_heads, length, head_dim]."""
        keys = [tensor[row : row + 1, :, :length].clone() for tensor in self.keys]
        values = [tensor[row : row + 1, :, :length].clone() for tensor in self.values]
        return keys, values

    @torch.inference_mode()
    def write(self, row: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Put per-layer [1, kv_heads, n, head_dim] tensors at positions 0..n-1 of `row`."""
        for tensor, part in zip(self.keys, keys):
            tensor[row, :, : part.shape[2]] = part[0]
        for tensor, part in zip(self.values, values):
            tensor[row, :, : part.shape[2]] = part[0]


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class _PackedLayer:
    __slots__ = ("input_norm", "qkv", "qkv_bias", "qk_norm", "output", "post_norm", "gate_up", "down")

    def __init__(self, **parts: Any) -> None:
        for name, value in parts.items():
            setattr(self, name, value)


class FastDecoder:
    """The lean forward of a supported model (check `unsupported_reason` first)."""

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FastDecoder does not support this model: {reason}")
        config = model.config
        self.model = model
        self.hidden_size = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        self.eps = float(config.rms_norm_eps)
        self.num_layers = len(model.model.layers)
        self.max_positions = int(getattr(config, "max_position_embeddings", 4096))
        parameter = next(model.parameters())
        self.dtype, self.device = parameter.dtype, parameter.device
        self._layers: list[_PackedLayer] = []
        half = self.head_dim // 2
        # query/key head dims reordered (0, d/2, 1, d/2+1, ...): each rotary pair becomes adjacent
        self._pair_order = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)
        self._rotary = self._rotary_table()

    # --- weights ---------------------------------------------------------------------

    def pack(self) -> None:
        """Repack the weights from the model's parameters (the engine calls this whenever a
        parameter changed, including in place, e.g. a shared model's optimizer step)."""
        with torch.inference_mode():
            self._pack()

    def _reorder_heads(self, weight: torch.Tensor, heads: int) -> torch.Tensor:
        """Rows of a q/k projection (or entries of its bias) with each head's dims paired."""
        shaped = weight.reshape(heads, self.head_dim, *weight.shape[1:])
        return shaped.index_select(1, self._pair_order.to(weight.device)).reshape(weight.shape)

    def _pack(self) -> None:
        scale = self.head_dim**-0.5
        layers = []
        for layer in self.model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            q_weight = self._reorder_heads(attention.q_proj.weight, self.heads)
            k_weight = self._reorder_heads(attention.k_proj.weight, self.kv_heads)
            q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
            has_qk_norm = q_norm is not None and k_norm is not None
            if not has_qk_norm:
                q_weight = q_weight * scale  # linear up to RoPE: scaling q scales the scores
            qkv = torch.cat([q_weight, k_weight, attention.v_proj.weight]).t().contiguous()
            bias = None
            if attention.q_proj.bias is not None:
                q_bias = self._reorder_heads(attention.q_proj.bias, self.heads)
                if not has_qk_norm:
                    q_bias = q_bias * scale
                k_bias = self._reorder_heads(attention.k_proj.bias, self.kv_heads)
                bias = torch.cat([q_bias, k_bias, attention.v_proj.bias]).contiguous()
            qk_norm = None
            if has_qk_norm:
                order = self._pair_order.to(q_norm.weight.device)
                qk_norm = torch.cat(
                    [
                        (q_norm.weight.index_select(0, order) * scale).expand(self.heads, -1),
                        k_norm.weight.index_select(0, order).expand(self.kv_heads, -1),
                    ]
                ).contiguous()
            layers.append(
                _PackedLayer(
                    input_norm=layer.input_layernorm.weight,
                    qkv=qkv,
                    qkv_bias=bias,
                    qk_norm=qk_norm,
                    output=attention.o_proj.weight.t().contiguous(),
                    post_norm=layer.post_attention_layernorm.weight,
                    gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous(),
                    down=mlp.down_proj.weight.t().contiguous(),
                )
            )
        self._layers = layers
        self._embedding = self.model.model.embed_tokens.weight
        self._final_norm = self.model.model.norm.weight
        head = self.model.lm_head.weight
        # a low-precision model projects in fp32 on every device: the head runs on one position
        # per row (cheap), and bf16 logits would put ~0.03 nat of rounding into every behaviour
        # log-prob the trainer's importance ratios divide by (the trainer's head is fp32 too)
        if head.dtype != torch.float32:
            head = head.float()
        self._head = head.t().contiguous()
        bias = getattr(self.model.lm_head, "bias", None)
        self._head_bias = None if bias is None else bias.to(self._head.dtype)

    def _rotary_table(self) -> torch.Tensor:
        """cos + i sin per (position, rotary pair), from the model's own rotary module (fp32)."""
        positions = torch.arange(self.max_positions, device=self.device).unsqueeze(0)
        probe = torch.zeros(1, dtype=torch.float32, device=self.device)
        with torch.inference_mode():
            cos, sin = self.model.model.rotary_emb(probe, positions)
        half = self.head_dim // 2
        return torch.complex(cos[0, :, :half].float(), sin[0, :, :half].float())

    def new_cache(self, max_rows: int) -> SlotKVCache:
        return SlotKVCache(
            self.num_layers,
            self.kv_heads,
            self.head_dim,
            dtype=self.dtype,
            device=self.device,
            max_rows=max_rows,
            max_positions=self.max_positions,
        )

    # --- forward ---------------------------------------------------------------------

    def forward(
        self,
        cache: SlotKVCache,
        input_ids: torch.Tensor,
        first_row: int,
        starts: torch.Tensor,
        last: torch.Tensor,
        span: int,
    ) -> torch.Tensor:
        """Run `input_ids` [B, Q] for cache rows first_row..first_row+B-1 and return fp32 logits [B, V].

        Row b's tokens sit at positions starts[b] .. starts[b]+Q-1 (its earlier positions
        already hold its KV); rows shorter than Q are right-padded, their padding writes KV
        past the row's end, which is masked until overwritten. `last[b]` is the index of
        row b's last real token (whose logits are returned); `span` = max(starts) + Q, the
        positions attention reads. The caller has reserved the cache for that.
        """
        batch, width = input_ids.shape
        device = self.device
        input_ids = input_ids.to(device)
        starts = starts.to(device)
        steps = torch.arange(width, device=device)
        positions = starts.unsqueeze(1) + steps  # [B, Q]
        visible = torch.arange(span, device=device) <= positions.unsqueeze(-1)  # [B, Q, T]
        hidden_mask = ~visible.unsqueeze(1).unsqueeze(1)  # [B, 1, 1, Q, T]
        rotary = self._rotary[positions].unsqueeze(2)  # [B, Q, 1, d/2]
        rows = torch.arange(first_row, first_row + batch, device=device).unsqueeze(1).expand(batch, width)
        heads, kv_heads, head_dim, group = self.heads, self.kv_heads, self.head_dim, self.group
        qk_heads = heads + kv_heads
        x = F.embedding(input_ids, self._embedding)
        for index, layer in enumerate(self._layers):
            h = F.rms_norm(x, (self.hidden_size,), layer.input_norm, self.eps)
            qkv = h @ layer.qkv
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            qkv = qkv.view(batch, width, qk_heads + kv_heads, head_dim)
            qk = qkv[:, :, :qk_heads]
            if layer.qk_norm is not None:
                qk = F.rms_norm(qk, (head_dim,), None, self.eps) * layer.qk_norm
            pairs = torch.view_as_complex(qk.float().reshape(batch, width, qk_heads, head_dim // 2, 2))
            qk = torch.view_as_real(pairs * rotary).reshape(batch, width, qk_heads, head_dim).to(x.dtype)
            keys, values = cache.keys[index], cache.values[index]
            keys[rows, :, positions] = qk[:, :, heads:]
            values[rows, :, positions] = qkv[:, :, qk_heads:]
            keys = keys[first_row : first_row + batch, :, :span]
            values = values[first_row : first_row + batch, :, :span]
            # [B, Q, kv, G, d] -> [B, kv, G*Q, d]: the G query heads of a kv head share its keys
            query = qk[:, :, :heads].reshape(batch, width, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
            query = query.reshape(batch, kv_heads, group * width, head_dim)
            scores = (query @ keys.transpose(-1, -2)).view(batch, kv_heads, group, width, span)
            scores = scores.masked_fill(hidden_mask, float("-inf"))
            probabilities = torch.softmax(scores, dim=-1).view(batch, kv_heads, group * width, span)
            attended = (probabilities @ values).view(batch, kv_heads, group, width, head_dim)
            attended = attended.permute(0, 3, 1, 2, 4).reshape(batch, width, heads * head_dim)
            x = x + attended @ layer.output
            h = F.rms_norm(x, (self.hidden_size,), layer.post_norm, self.eps)
            gate, up = (h @ layer.gate_up).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer.down
        x = x[torch.arange(batch, device=device), last.to(device)]  # [B, hidden]
        x = F.rms_norm(x, (self.hidden_size,), self._final_norm, self.eps)
        logits = x.to(self._head.dtype) @ self._head
        if self._head_bias is not None:
            logits = logits + self._head_bias
        return logits.float()
