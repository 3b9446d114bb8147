"""Token sampling with the behaviour log-prob every RL trainer needs.

The reported log-prob is that of the distribution the token was drawn from: log_softmax(logits / T)
renormalised over the tokens top-k / top-p kept (`sampling_logprobs`); without truncation that is
log_softmax(logits / T)[token], so the trainer divides its logits by the same T. The off-policy
weight pi / mu needs mu to be the sampling probability (SGLang reports the tempered log-prob
before truncation instead); the trainer scores pi untruncated, so top-p / top-k with a loss that
reads mu is refused on every engine (rollhub.trainer.logprob_check). T = 0 means greedy, reported
at T = 1.
"""

from __future__ import annotations

from typing import Any

import torch

from rollhub.inference.engines.base import SamplingParams


def behaviour_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) over the last dim, in fp32; T = 0 is treated as 1."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


def sampling_logprobs(logprobs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """The log-probs tokens are sampled with: `logprobs` (log_softmax(logits / T), last dim the
    vocabulary) renormalised over the top-k / top-p set, -inf outside it; unchanged without truncation."""
    if top_p >= 1.0 and not 0 < top_k < logprobs.shape[-1]:
        return logprobs
    kept = _truncate(logprobs, top_p, top_k)
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


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


def _uniform(generator: Any) -> float:
    """One uniform in [0, 1) from a `random.Random` (the engine's, ~50 ns) or a `torch.Generator`."""
    if isinstance(generator, torch.Generator):
        return float(torch.rand((), generator=generator))
    return generator.random()


def sample_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[Any]
) -> tuple[list[int], list[float]]:
    """Sample one token per row of `logits` [B, V]; returns (token ids, behaviour log-probs).

    Vectorised inverse-CDF sampling: each row draws one uniform number from its own
    generator (a `random.Random` or a `torch.Generator`, so per-request seeds reproduce),
    then one batched searchsorted picks the tokens. `torch.multinomial` per row cost ~1 ms
    each and dominated small-model decoding. The common case (no top-k/top-p) never builds
    the full log-softmax: the CDF comes from exp(z - max z), and only the chosen tokens'
    log-probs z - logsumexp(z) are formed. A truncated row reports its token's log-prob within
    the kept set (`sampling_logprobs`), the probability it was actually drawn with.
    """
    vocab = logits.shape[-1]
    scaled = logits.float()
    temperatures = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    if any(t != 1.0 for t in temperatures):
        scaled = scaled / torch.tensor(temperatures, dtype=torch.float32, device=scaled.device).unsqueeze(-1)
    greedy = [p.temperature == 0 for p in params]
    truncated_rows = [i for i, p in enumerate(params) if not greedy[i] and (p.top_p < 1.0 or 0 < p.top_k < vocab)]
    maxima = scaled.amax(dim=-1, keepdim=True)
    shifted = scaled - maxima
    weights = shifted.exp()
    log_normaliser = maxima + weights.sum(dim=-1, keepdim=True).log()  # logsumexp(z), per row
    sampled: torch.Tensor | None = None
    kept_normaliser: dict[int, torch.Tensor] = {}  # truncated row -> log of the kept set's probability mass
    if not all(greedy):
        if truncated_rows:
            logprobs = scaled - log_normaliser
            for row in truncated_rows:
                kept = _truncate(logprobs[row], params[row].top_p, params[row].top_k)
                weights[row] = (kept - kept.max()).exp()
                kept_normaliser[row] = torch.logsumexp(kept, dim=-1)
        cdf = weights.cumsum(dim=-1)
        uniforms = torch.tensor([_uniform(g) for g in generators], dtype=torch.float32, device=cdf.device)
        targets = uniforms.unsqueeze(-1) * cdf[:, -1:]
        sampled = torch.searchsorted(cdf, targets, right=True).squeeze(-1).clamp_(max=vocab - 1)
    if any(greedy):
        argmax = scaled.argmax(dim=-1)
        if sampled is None:
            sampled = argmax
        else:
            sampled = torch.where(torch.tensor(greedy, device=argmax.device), argmax, sampled)
    chosen = (scaled.gather(-1, sampled.unsqueeze(-1)) - log_normaliser).squeeze(-1)
    for row, mass in kept_normaliser.items():
        chosen[row] = chosen[row] - mass
    return sampled.tolist(), chosen.tolist()
