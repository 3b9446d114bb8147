"""The engine's fast path (FastDecoder over a slot KV cache): exact log-probs in every batch
shape the scheduler makes, weights never stale, one-token turns kept out of decode steps, and
the benchmark that compares it with `model.generate`."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
import torch

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine

NO_STOP = (10**9,)


def direct_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(lp[len(prompt) - 1 + i, tok]) for i, tok in enumerate(output)]


def prompt(k: int, length: int) -> list[int]:
    return [1] + [(37 * k + 11 * j) % 7000 + 10 for j in range(length - 1)]


async def mixed_workload(engine: HFEngine) -> list[tuple[list[int], object]]:
    """Staggered arrivals, different prompt and output lengths (rows leave at different steps,
    so survivors are moved into the holes), one-token turns, and prefix-cache follow-ups."""

    async def one(k: int):
        await asyncio.sleep(0.003 * (k % 5))
        ids = prompt(k, 5 + 7 * (k % 4))
        new_tokens = 1 if k % 3 == 0 else 3 + 4 * (k % 5)
        sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.8, seed=k, stop_token_ids=NO_STOP)
        first = await engine.generate(ids, sampling)
        follow_up = ids + first.token_ids + [5, 6 + k]
        second = await engine.generate(
            follow_up, SamplingParams(max_new_tokens=4, seed=100 + k, stop_token_ids=NO_STOP)
        )
        return [(ids, first, 0.8), (follow_up, second, 1.0)]

    pairs = await asyncio.gather(*(one(k) for k in range(12)))
    return [item for pair in pairs for item in pair]


@pytest.mark.parametrize("fast_path", [True, False])
async def test_both_paths_match_a_plain_forward_under_mixed_batching(tiny_model_and_tokenizer, fast_path):
    model, tokenizer = tiny_model_and_tokenizer
    async with HFEngine(model, tokenizer, max_batch_size=8, fast_path=fast_path) as engine:
        assert (engine._decoder is not None) is fast_path
        results = await mixed_workload(engine)
        assert engine.prefix_cache.hits > 0 and engine.stats.mean_batch_size > 1.0
    for ids, generation, temperature in results:
        assert len(generation.token_ids) == len(generation.logprobs) > 0
        assert generation.logprobs == pytest.approx(
            direct_logprobs(model, ids, generation.token_ids, temperature), abs=1e-4
        )


async def test_one_token_turns_never_join_a_decode_step(tiny_model_and_tokenizer):
    """The recipe's one-token turns: their single token comes from the prefill, and the
    running batch's decode steps never carry them."""
    model, tokenizer = tiny_model_and_tokenizer
    async with HFEngine(model, tokenizer, max_batch_size=16) as engine:
        long = asyncio.create_task(
            engine.generate(prompt(0, 9), SamplingParams(max_new_tokens=40, seed=1, stop_token_ids=NO_STOP))
        )
        while engine.stats.decode_steps < 2:
            await asyncio.sleep(0.002)
        turns = [
            engine.generate(prompt(k, 6 + k), SamplingParams(max_new_tokens=1, seed=k, stop_token_ids=NO_STOP))
            for k in range(1, 9)
        ]
        singles = await asyncio.gather(*turns)
        generation = await long
        assert engine.stats.mean_batch_size == 1.0  # only the long request was ever decoded
    assert all(len(g.token_ids) == 1 and g.finish_reason == "length" for g in singles)
    assert generation.logprobs == pytest.approx(direct_logprobs(model, prompt(0, 9), generation.token_ids), abs=1e-4)
    for k, single in enumerate(singles, start=1):
        assert single.logprobs == pytest.approx(direct_logprobs(model, prompt(k, 6 + k), single.token_ids), abs=1e-4)


@pytest.mark.parametrize("fast_path", [True, False])
async def test_in_place_weight_change_is_picked_up(tiny_model_dir, fast_path):
    """A parameter changed behind the engine's back (a shared model's optimizer step) is seen
    before the next step: neither path decodes with stale weights or reuses a prompt's KV and
    logits cached under the old ones (the same prompt is sent again)."""
    from rollhub.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)  # a private copy: it is modified
    async with HFEngine(model, tokenizer, fast_path=fast_path) as engine:
        sampling = SamplingParams(max_new_tokens=4, seed=3, stop_token_ids=NO_STOP)
        before = await engine.generate(prompt(1, 8), sampling)
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.mul_(3.0)
            model.model.layers[0].self_attn.q_proj.weight.add_(0.05)
        after = await engine.generate(prompt(1, 8), sampling)
        # the next turn of the first conversation: its prefix KV was cached under the old weights
        turn = prompt(1, 8) + before.token_ids + prompt(2, 3)
        next_turn = await engine.generate(turn, sampling)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert after.logprobs == pytest.approx(direct_logprobs(model, prompt(1, 8), after.token_ids), abs=1e-4)
    assert next_turn.logprobs == pytest.approx(direct_logprobs(model, turn, next_turn.token_ids), abs=1e-4)


async def test_prefill_padding_past_the_last_position_is_split(tiny_model_and_tokenizer):
    """A long cached prefix and a long new prompt in one cohort would pad past the model's
    last position; the engine prefills them one at a time instead, still exact."""
    model, tokenizer = tiny_model_and_tokenizer
    limit = model.config.max_position_embeddings
    async with HFEngine(model, tokenizer, batch_window_s=0.05) as engine:
        base = prompt(2, limit - 700)
        first = await engine.generate(base, SamplingParams(max_new_tokens=2, seed=0, stop_token_ids=NO_STOP))
        cached_follow_up = base + first.token_ids + [7]
        fresh = prompt(3, 900)
        results = await asyncio.gather(
            engine.generate(cached_follow_up, SamplingParams(max_new_tokens=3, seed=1, stop_token_ids=NO_STOP)),
            engine.generate(fresh, SamplingParams(max_new_tokens=3, seed=2, stop_token_ids=NO_STOP)),
        )
        assert engine.prefix_cache.hits >= 1
    for ids, generation in zip((cached_follow_up, fresh), results):
        assert generation.logprobs == pytest.approx(direct_logprobs(model, ids, generation.token_ids), abs=1e-4)


SMOLLM2 = Path(__file__).resolve().parents[2] / "runs" / "models" / "smollm2-135m-instruct"


@pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(), reason="no local SmolLM2 export (rollhub model smollm2)")
async def test_smollm2_takes_the_fast_path_with_forward_logprobs():
    """A real Llama-architecture checkpoint (GQA with 3 kv heads, rope theta 1e5, tied head)."""
    from rollhub.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(SMOLLM2)
    prompts = [tokenizer.encode("Hello, how are you today?"), tokenizer.encode("The capital of France is")]
    async with HFEngine(model, tokenizer) as engine:
        assert engine._decoder is not None
        generations = await asyncio.gather(
            *(
                engine.generate(ids, SamplingParams(max_new_tokens=5, seed=k, stop_token_ids=NO_STOP))
                for k, ids in enumerate(prompts)
            )
        )
    for ids, generation in zip(prompts, generations):
        assert generation.logprobs == pytest.approx(direct_logprobs(model, ids, generation.token_ids), abs=1e-4)


def test_bench_reports_speedup_against_generate_per_batch_size(tmp_path):
    from rollhub.bench.rollout_engine import run

    overrides = ["decode_only=true", "new_tokens=6", "prompt_tokens=8", "repeats=1", "concurrency=[1, 3]"]
    result = run(argparse.Namespace(out=str(tmp_path), quick=False, overrides=overrides))
    assert set(result["speedup_vs_generate"]) == {"1", "3"}
    for row in result["decode"]:
        assert row["engine_tokens_per_s"] > 0 and row["generate_tokens_per_s"] > 0
        assert row["speedup_vs_generate"] == pytest.approx(row["engine_tokens_per_s"] / row["generate_tokens_per_s"])
    assert (tmp_path / "rollout_engine.json").exists()


@pytest.mark.slow
def test_engine_outpaces_generate_at_batch_16(tmp_path):
    """The speed claim itself, with a margin for a shared machine (target 1.5x; measured
    interleaved in one process, so load shifts both sides)."""
    from rollhub.bench.rollout_engine import run

    overrides = ["decode_only=true", "new_tokens=64", "repeats=5", "concurrency=[16]"]
    result = run(argparse.Namespace(out=str(tmp_path), quick=False, overrides=overrides))
    assert result["speedup_vs_generate"]["16"] >= 1.2
