"""Token sampling with the behaviour log-prob every RL trainer needs.

The reported log-prob is log_softmax(logits / T)[token]: after temperature, before
top-k/top-p truncation (the SGLang convention; reference/sglang.md §6), so the trainer
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


def sample_tokens(logits: torch.Tensor, params: list[SamplingParams], generators: list[Any]) -> tuple[list[int], list[float]]:
    """Sample one token per row of `logits` [B, V]; returns (token ids, behaviour log-probs)."""
    tokens: list[int] = []
    logprobs: list[float] = []
    for row, (sampling, generator) in enumerate(zip(params, generators)):
        lp = behaviour_logprobs(logits[row], sampling.temperature)
        if sampling.temperature == 0:
            token = int(torch.argmax(lp))
        else:
            probs = _truncate(lp, sampling.top_p, sampling.top_k).exp()
            token = int(torch.multinomial(probs, 1, generator=generator))
        tokens.append(token)
        logprobs.append(float(lp[token]))
    return tokens, logprobs
