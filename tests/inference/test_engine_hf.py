"""HFEngine: exact log-probs, continuous batching, pause/abort/cancel, versions, weight updates."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine

PROMPTS = [[1, 40 + k, 200, 300 + k, 17] * (k + 1) for k in range(6)]
NO_STOP = (10**9,)  # never matches: forces full-length outputs


def direct_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(lp[len(prompt) - 1 + i, tok]) for i, tok in enumerate(output)]


async def test_logprobs_equal_direct_forward_under_batching(engine: HFEngine):
    async def staggered(i: int):
        await asyncio.sleep(0.005 * i)  # joins the running batch mid-decode
        return await engine.generate(
            PROMPTS[i % len(PROMPTS)],
            SamplingParams(max_new_tokens=12, temperature=0.7, seed=i, stop_token_ids=NO_STOP),
        )

    generations = await asyncio.gather(*(staggered(i) for i in range(10)))
    assert engine.stats.mean_batch_size > 1.0  # requests really shared decode steps
    for i, generation in enumerate(generations):
        assert generation.finish_reason == "length" and len(generation.token_ids) == 12
        reference = direct_logprobs(engine.model, PROMPTS[i % len(PROMPTS)], generation.token_ids, temperature=0.7)
        assert generation.logprobs == pytest.approx(reference, abs=1e-4)
        assert generation.token_versions == [0] * 12


async def test_prefix_cache_hit_keeps_logprobs_exact(engine: HFEngine):
    first = await engine.generate(PROMPTS[3], SamplingParams(max_new_tokens=8, seed=1, stop_token_ids=NO_STOP))
    follow_up = PROMPTS[3] + first.token_ids + [5, 6, 7]
    hits_before = engine.prefix_cache.hits
    second = await engine.generate(follow_up, SamplingParams(max_new_tokens=8, seed=2, stop_token_ids=NO_STOP))
    assert engine.prefix_cache.hits == hits_before + 1
    assert second.logprobs == pytest.approx(direct_logprobs(engine.model, follow_up, second.token_ids), abs=1e-4)


async def test_concurrent_prefix_hits_of_different_lengths_batch_exactly(engine: HFEngine):
    """Hits are prefilled together with holes between prefix and suffix; still exact."""
    firsts = await asyncio.gather(
        *(
            engine.generate(PROMPTS[k], SamplingParams(max_new_tokens=3 + 2 * k, seed=k, stop_token_ids=NO_STOP))
            for k in range(4)
        )
    )
    follow_ups = [PROMPTS[k] + g.token_ids + [9] * (1 + 3 * k) for k, g in enumerate(firsts)]
    hits_before = engine.prefix_cache.hits
    seconds = await asyncio.gather(
        *(
            engine.generate(f, SamplingParams(max_new_tokens=10, seed=10 + k, stop_token_ids=NO_STOP))
            for k, f in enumerate(follow_ups)
        )
    )
    assert engine.prefix_cache.hits == hits_before + 4
    for follow_up, second in zip(follow_ups, seconds):
        assert second.logprobs == pytest.approx(direct_logprobs(engine.model, follow_up, second.token_ids), abs=1e-4)
    # the KV stored from rows with holes is reusable too
    third_prompt = follow_ups[2] + seconds[2].token_ids + [4, 4]
    third = await engine.generate(third_prompt, SamplingParams(max_new_tokens=5, seed=3, stop_token_ids=NO_STOP))
    assert engine.prefix_cache.hits == hits_before + 5
    assert third.logprobs == pytest.approx(direct_logprobs(engine.model, third_prompt, third.token_ids), abs=1e-4)


async def test_same_seed_same_tokens_and_greedy_is_argmax(engine: HFEngine):
    a = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=6, seed=7, stop_token_ids=NO_STOP))
    b = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=6, seed=7, stop_token_ids=NO_STOP))
    assert a.token_ids == b.token_ids
    greedy = await engine.generate(
        PROMPTS[1], SamplingParams(max_new_tokens=4, temperature=0.0, stop_token_ids=NO_STOP)
    )
    with torch.no_grad():
        logits = engine.model(torch.tensor([PROMPTS[1] + greedy.token_ids])).logits[0]
    assert greedy.token_ids == [int(logits[len(PROMPTS[1]) - 1 + i].argmax()) for i in range(4)]


async def test_stop_token_ends_generation_and_is_included(engine: HFEngine):
    probe = await engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=5, seed=3, stop_token_ids=NO_STOP))
    stop_at = probe.token_ids[2]
    again = await engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=5, seed=3, stop_token_ids=(stop_at,)))
    assert again.finish_reason == "stop"
    assert again.token_ids == probe.token_ids[: probe.token_ids.index(stop_at) + 1]


async def test_pause_aborts_in_flight_and_blocks_new_requests(engine: HFEngine):
    long = asyncio.create_task(engine.generate(PROMPTS[4], SamplingParams(max_new_tokens=400, stop_token_ids=NO_STOP)))
    while engine.stats.generated_tokens < 3:
        await asyncio.sleep(0.01)
    await engine.pause()
    aborted = await long
    assert aborted.finish_reason == "abort"
    assert 0 < len(aborted.token_ids) < 400 and len(aborted.logprobs) == len(aborted.token_ids)
    assert engine.num_in_flight == 0
    blocked = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=2)))
    await asyncio.sleep(0.1)
    assert not blocked.done()  # waits while paused
    await engine.resume()
    assert len((await asyncio.wait_for(blocked, 30)).token_ids) >= 1


async def test_abort_one_request_and_cancelled_caller_leave_nothing_behind(engine: HFEngine):
    keep = asyncio.create_task(
        engine.generate(
            PROMPTS[0], SamplingParams(max_new_tokens=30, seed=0, stop_token_ids=NO_STOP), request_id="keep"
        )
    )
    drop = asyncio.create_task(
        engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=400, stop_token_ids=NO_STOP), request_id="drop")
    )
    gone = asyncio.create_task(
        engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=400, stop_token_ids=NO_STOP), request_id="gone")
    )
    await asyncio.sleep(0.05)
    await engine.abort("drop")
    gone.cancel()
    assert (await drop).finish_reason == "abort"
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert len((await keep).token_ids) == 30
    for _ in range(100):
        if engine.num_in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.num_in_flight == 0
    assert engine.stats.requests_aborted == 2


async def test_versions_per_token_across_in_flight_update(engine: HFEngine, tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    original = {k: v.clone() for k, v in model.state_dict().items()}
    task = asyncio.create_task(
        engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=60, seed=0, stop_token_ids=NO_STOP))
    )
    while engine.stats.generated_tokens < 5:
        await asyncio.sleep(0.005)
    await engine.update_weights(original, version=3)  # not paused: later tokens come from v3
    generation = await task
    versions = generation.token_versions
    assert versions[0] == 0 and versions[-1] == 3
    assert versions == sorted(versions)  # one switch, never back
    assert engine.weight_version == 3


async def test_update_from_state_dict_and_checkpoint_changes_logprobs(engine: HFEngine, tiny_model_dir, tmp_path):
    from rollhub.inference.models import init_tiny_model

    before = await engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=5, seed=1, stop_token_ids=NO_STOP))
    other = init_tiny_model(tmp_path / "other", seed=1)
    await engine.pause()
    await engine.update_weights(other, version=1)
    await engine.resume()
    after = await engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=5, seed=1, stop_token_ids=NO_STOP))
    assert after.token_versions == [1] * 5
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    with pytest.raises(ValueError, match="unknown parameter"):
        await engine.update_weights({"not.a.weight": torch.zeros(1)}, version=2)
    # restore for other tests sharing the session model
    await engine.update_weights(tiny_model_dir, version=0)


async def test_close_aborts_and_rejects(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    eng = HFEngine(model, tokenizer)
    task = asyncio.create_task(eng.generate(PROMPTS[0], SamplingParams(max_new_tokens=500, stop_token_ids=NO_STOP)))
    await asyncio.sleep(0.05)
    await eng.close()
    assert (await task).finish_reason == "abort"
    with pytest.raises(RuntimeError, match="closed"):
        await eng.generate(PROMPTS[0], SamplingParams(max_new_tokens=1))


async def test_close_releases_callers_blocked_by_pause(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    eng = HFEngine(model, tokenizer)
    await eng.pause()
    blocked = asyncio.create_task(eng.generate(PROMPTS[0], SamplingParams(max_new_tokens=1)))
    await asyncio.sleep(0.05)
    await eng.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(blocked, 5)


def test_engine_survives_successive_event_loops(tiny_model_and_tokenizer):
    """Callers that use asyncio.run() per phase (eval, then training) share one engine."""
    model, tokenizer = tiny_model_and_tokenizer
    eng = HFEngine(model, tokenizer)
    first = asyncio.run(eng.generate(PROMPTS[0], SamplingParams(max_new_tokens=3, seed=1, stop_token_ids=NO_STOP)))
    second = asyncio.run(eng.generate(PROMPTS[0], SamplingParams(max_new_tokens=3, seed=1, stop_token_ids=NO_STOP)))
    assert first.token_ids == second.token_ids
    asyncio.run(eng.close())


async def test_out_of_vocabulary_ids_are_refused_before_they_join_a_batch(tiny_model_dir):
    async with HFEngine(tiny_model_dir, max_batch_size=4) as engine:
        vocab = engine.model.get_input_embeddings().num_embeddings
        good = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.0)))
        for bad in ([1, vocab], [-1, 2]):
            with pytest.raises(ValueError, match="input_ids"):
                await engine.generate(bad, SamplingParams(max_new_tokens=4))
        assert len((await good).token_ids) == 4  # the request in flight is untouched


def test_device_and_dtype_are_explicit(tiny_model_dir, tiny_model_and_tokenizer, monkeypatch):
    """The engine runs where it is told or refuses: no silent CPU fallback, no silent move."""
    from rollhub.core.errors import UserError
    from rollhub.inference.engines.placement import resolve_dtype

    engine = HFEngine(tiny_model_dir)
    assert engine.device.type == "cpu" and engine.dtype == torch.float32  # cpu -> fp32 by default
    assert HFEngine(tiny_model_dir, dtype="bf16").dtype == torch.bfloat16
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16  # cuda -> bf16 by default
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="no CUDA device"):
        HFEngine(tiny_model_dir, device="cuda")
    with pytest.raises(UserError, match="not a device name|not supported"):
        HFEngine(tiny_model_dir, device="tpu:7")
    with pytest.raises(UserError, match="not known"):
        HFEngine(tiny_model_dir, dtype="int7")
    model, tokenizer = tiny_model_and_tokenizer
    with pytest.raises(UserError, match="dtype"):
        HFEngine(model, tokenizer, dtype=torch.bfloat16)  # a passed-in model is never converted
    assert next(model.parameters()).dtype == torch.float32
