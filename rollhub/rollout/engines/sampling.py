"""Token sampling with the behaviour log-prob every RL trainer needs.

The reported log-prob is log_softmax(logits / T)[token]: after temperature, before
top-k/top-p truncation (the SGLang convention), so the trainer
divides its logits by the same T. T = 0 means greedy, reported at T = 1.
"""

from __future__ import annotations

from typing import Any

import torch

from rollhub.rollout.engines.base import SamplingParams


def behaviour_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) over the last dim, in fp32; T = 0 is treated as 1."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


def _truncate(logprobs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Mask (to -inf) the tokens outside top-k and the top-p nucleus, for sampling only."""
    out = logprobs
    if top_k > 0 and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lp, order = torch.sort(out, descending=True)
        cumulative = torch.cumsum(sorted_lp.exp(), dim=-1)
        remove_sorted = cumulative - sorted_lp.exp() >= top_p  # keep the token that crosses top_p
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        out = out.masked_fill(remove, float("-inf"))
    return out


def sample_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[Any]
) -> tuple[list[int], list[float]]:
    """Sample one token per row of `logits` [B, V]; returns (token ids, behaviour log-probs).

    Vectorised inverse-CDF sampling: each row draws one uniform number from its own
    generator (so per-request seeds reproduce), then one batched searchsorted picks the
    tokens. `torch.multinomial` per row cost ~1 ms each and dominated small-model decoding.
    """
    temperatures = torch.tensor(
        [p.temperature if p.temperature > 0 else 1.0 for p in params], dtype=torch.float32
    ).unsqueeze(-1)
    logprobs = torch.log_softmax(logits.float() / temperatures, dim=-1)
    sampling_lp = logprobs
    truncated_rows = [
        i for i, p in enumerate(params) if p.temperature > 0 and (p.top_p < 1.0 or 0 < p.top_k < logits.shape[-1])
    ]
    if truncated_rows:
        sampling_lp = logprobs.clone()
        for row in truncated_rows:
            sampling_lp[row] = _truncate(logprobs[row], params[row].top_p, params[row].top_k)
    cdf = sampling_lp.exp().cumsum(dim=-1)
    uniforms = torch.stack([torch.rand((), generator=g) for g in generators]).unsqueeze(-1)
    sampled = torch.searchsorted(cdf, uniforms * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    greedy = torch.tensor([p.temperature == 0 for p in params])
    tokens = torch.where(greedy, logprobs.argmax(dim=-1), sampled)
    chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens.tolist(), chosen.tolist()
