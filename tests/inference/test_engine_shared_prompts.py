"""HFEngine: a repeated prompt takes the KV and first logits of its twin, and stays exact.

Markov agents send the same board many times under one policy version (the samples of a
group stand on the same board until their moves differ); the engine runs one forward for
them. These tests try to catch what sharing could break: log-probs that are not the model's,
samples that are copies instead of independent draws, KV that decoding then reads wrong, and
logits that outlive the weights that made them.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine

PROMPT = [1, 41, 200, 301, 17, 41, 200, 301, 17, 5]
NO_STOP = (10**9,)


def direct_logprobs(model, prompt: list[int], output: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[len(prompt) - 1 + i, tok]) for i, tok in enumerate(output)]


async def test_concurrent_twins_share_one_forward_and_decode_exactly(engine: HFEngine):
    generations = await asyncio.gather(
        *(engine.generate(PROMPT, SamplingParams(max_new_tokens=10, seed=k, stop_token_ids=NO_STOP)) for k in range(8))
    )
    assert engine.stats.shared_prompts >= 7  # one forward for eight requests
    assert engine.stats.prefill_tokens <= len(PROMPT) + 8  # (+ at most a split admission)
    for generation in generations:
        # the copied KV is what every later decode step attends to: a wrong copy shows here
        assert generation.logprobs == pytest.approx(
            direct_logprobs(engine.model, PROMPT, generation.token_ids), abs=1e-4
        )
    # independent draws, not one sample handed to eight callers
    assert len({tuple(g.token_ids) for g in generations}) >= 6


async def test_one_token_turns_repeat_without_any_forward(engine: HFEngine):
    first = await engine.generate(PROMPT, SamplingParams(max_new_tokens=1, seed=0))
    forwarded = engine.stats.prefill_tokens
    later = await asyncio.gather(
        *(engine.generate(PROMPT, SamplingParams(max_new_tokens=1, seed=k)) for k in range(1, 41))
    )
    assert engine.stats.prefill_tokens == forwarded  # 40 turns, no prefill at all
    assert engine.prefix_cache.exact_hits >= 40
    tokens = [first.token_ids[0]] + [g.token_ids[0] for g in later]
    logits = engine.model(torch.tensor([PROMPT])).logits[0, -1].float()
    expected = torch.log_softmax(logits.detach(), dim=-1)
    for generation in [first, *later]:
        assert generation.logprobs[0] == pytest.approx(float(expected[generation.token_ids[0]]), abs=1e-4)
    assert len(set(tokens)) >= 10  # a random-init model is near uniform: 41 draws must differ


async def test_same_seed_gives_the_same_token_shared_or_not(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    alone = HFEngine(model, tokenizer, threads=1, max_batch_size=32, prefix_cache_tokens=0)
    try:
        solo = [
            await alone.generate(PROMPT, SamplingParams(max_new_tokens=4, seed=k, stop_token_ids=NO_STOP))
            for k in range(5)
        ]
        assert alone.stats.shared_prompts == 0  # one at a time, no cache: nothing to share
    finally:
        await alone.close()
    sharing = HFEngine(model, tokenizer, threads=1, max_batch_size=32)
    try:
        together = await asyncio.gather(
            *(
                sharing.generate(PROMPT, SamplingParams(max_new_tokens=4, seed=k, stop_token_ids=NO_STOP))
                for k in range(5)
            )
        )
        assert sharing.stats.shared_prompts >= 4
    finally:
        await sharing.close()
    assert [g.token_ids for g in together] == [g.token_ids for g in solo]


async def test_weight_update_retires_the_shared_logits(engine: HFEngine, tiny_model_dir, tmp_path):
    from rollhub.inference.models import init_tiny_model

    await engine.generate(PROMPT, SamplingParams(max_new_tokens=1, seed=0))
    other = init_tiny_model(tmp_path / "other", seed=1)
    try:
        await engine.update_weights(other, version=1)
        hits = engine.prefix_cache.exact_hits
        after = await engine.generate(PROMPT, SamplingParams(max_new_tokens=3, seed=1, stop_token_ids=NO_STOP))
        assert engine.prefix_cache.exact_hits == hits  # the old weights' logits are gone
        assert after.token_versions == [1, 1, 1]
        assert after.logprobs == pytest.approx(direct_logprobs(engine.model, PROMPT, after.token_ids), abs=1e-4)
    finally:
        await engine.update_weights(tiny_model_dir, version=0)  # the session model is shared


async def test_weight_update_drops_the_cache_once_and_at_once(engine: HFEngine, tiny_model_dir, tmp_path):
    """update_weights drops the cache before it returns, and the next step does not drop it again."""
    from rollhub.inference.models import init_tiny_model

    await engine.generate(PROMPT, SamplingParams(max_new_tokens=1, seed=0))
    assert engine.prefix_cache.tokens > 0
    epoch = engine._weights_epoch
    other = init_tiny_model(tmp_path / "other", seed=2)
    try:
        await engine.update_weights(other, version=1)
        assert engine.prefix_cache.tokens == 0  # nothing can read the old weights' KV after the update
        assert engine._weights_epoch == epoch + 1
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=1, seed=1))
        assert engine._weights_epoch == epoch + 1  # the step saw the update as already followed
        assert engine.prefix_cache.tokens > 0  # and caches under the new weights again
    finally:
        await engine.update_weights(tiny_model_dir, version=0)  # the session model is shared


async def test_share_prompts_off_runs_every_prompt(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, threads=1, max_batch_size=32, share_prompts=False)
    try:
        await asyncio.gather(*(engine.generate(PROMPT, SamplingParams(max_new_tokens=1, seed=k)) for k in range(6)))
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=1, seed=7))
    finally:
        await engine.close()
    assert engine.stats.shared_prompts == 0 and engine.prefix_cache.exact_hits == 0
    assert engine.stats.prefill_tokens >= 6 * len(PROMPT)  # (the 7th may reuse a shorter prefix)
