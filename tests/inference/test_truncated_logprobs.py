"""Under top-p / top-k the behaviour log-prob is the probability the token was sampled with: the
tempered softmax renormalised over the kept set, so the off-policy weight pi / mu is honest."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.sampling import sample_tokens, sampling_logprobs

torch.set_num_threads(1)
LOGITS = torch.tensor([1.2, 0.7, 0.1, -0.4, -1.5, -2.0])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=0.8, top_k=3),
        SamplingParams(temperature=1.3, top_p=0.85, top_k=4),
    ],
)
def test_reported_probability_is_the_sampling_frequency(params):
    n = 8000
    rng = random.Random(7)
    tokens, logprobs = sample_tokens(LOGITS.repeat(n, 1), [params] * n, [rng] * n)
    counts = torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).double() / n
    reported = {}
    for token, logprob in zip(tokens, logprobs):
        reported.setdefault(token, logprob)
        assert logprob == pytest.approx(reported[token], abs=1e-6)
    for token, logprob in reported.items():
        # 4 standard errors of a frequency near 0.5 at n = 8000 is ~0.022; the old report was off by > 0.1
        assert math.exp(logprob) == pytest.approx(float(counts[token]), abs=0.022)
    assert sum(math.exp(lp) for lp in reported.values()) == pytest.approx(1.0, abs=1e-5)


def test_sampling_logprobs_match_the_sampler_and_leave_untruncated_rows_alone():
    scaled = torch.log_softmax(LOGITS / 0.9, -1)
    assert torch.equal(sampling_logprobs(scaled, 1.0, -1), scaled)
    kept = sampling_logprobs(scaled, 0.6, -1)
    assert torch.isinf(kept).sum() > 0 and float(torch.logsumexp(kept, -1)) == pytest.approx(0.0, abs=1e-6)
    tokens, logprobs = sample_tokens(
        LOGITS.repeat(50, 1) / 0.9, [SamplingParams(top_p=0.6)] * 50, [random.Random(1)] * 50
    )
    for token, logprob in zip(tokens, logprobs):
        assert logprob == pytest.approx(float(kept[token]), abs=1e-6)
