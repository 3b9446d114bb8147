"""The sampler draws from the right distribution and reports log_softmax(logits / T)."""

from __future__ import annotations

import torch

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.sampling import sample_tokens

LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0])


def draw(params: SamplingParams, n: int = 4000) -> tuple[torch.Tensor, list[float]]:
    logits = LOGITS.repeat(n, 1)
    generators = [torch.Generator().manual_seed(i) for i in range(n)]
    tokens, logprobs = sample_tokens(logits, [params] * n, generators)
    return torch.tensor(tokens), logprobs


def test_empirical_frequencies_match_tempered_softmax():
    tokens, logprobs = draw(SamplingParams(temperature=0.7))
    expected = torch.softmax(LOGITS / 0.7, -1)
    observed = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert torch.allclose(observed, expected, atol=0.03)
    reference = torch.log_softmax(LOGITS / 0.7, -1)
    assert all(abs(lp - float(reference[t])) < 1e-6 for t, lp in zip(tokens.tolist(), logprobs))


def test_top_p_and_top_k_never_sample_outside_and_report_the_renormalised_logprob():
    tokens, logprobs = draw(SamplingParams(top_p=0.8), n=2000)
    assert set(tokens.tolist()) <= {0, 1}  # softmax(LOGITS): 0.64, 0.23 -> nucleus {0, 1}
    kept = torch.log_softmax(LOGITS[:2], -1)  # the nucleus, renormalised: what the token was drawn with
    assert abs(logprobs[tokens.tolist().index(0)] - float(kept[0])) < 1e-6
    tokens, _ = draw(SamplingParams(top_k=2), n=2000)
    assert set(tokens.tolist()) == {0, 1}


def test_greedy_and_seed_reproducibility():
    tokens, logprobs = draw(SamplingParams(temperature=0.0), n=5)
    assert tokens.tolist() == [0] * 5 and abs(logprobs[0] - float(torch.log_softmax(LOGITS, -1)[0])) < 1e-6
    a, _ = draw(SamplingParams(), n=50)
    b, _ = draw(SamplingParams(), n=50)
    assert a.tolist() == b.tolist()
