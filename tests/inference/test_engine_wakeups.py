"""The engine's hand-offs between the event loop and the model thread, now that one model-thread
call chains many decode steps: whatever needs the loop (an abort, a newcomer, a weight update)
ends the chain after the current step, and the async trainer's pause -> abort ->
update_weights -> resume, hit mid-generation with partial rollouts resubmitted, never leaves a
request or a caller waiting.

The chains here are made unbounded (no step or time cap), so a missed interruption shows up as
a generation that runs to its full length or a test that times out, not as a slow pass."""

from __future__ import annotations

import asyncio
import random

import pytest

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.hf import HFEngine

NO_STOP = (10**9,)
LONG = 1500  # tokens: far more than any chain runs before an interruption is due


def prompt(k: int, length: int) -> list[int]:
    return [1] + [(37 * k + 11 * j) % 7000 + 10 for j in range(length - 1)]


def unbounded_chains(engine: HFEngine) -> HFEngine:
    engine.max_steps_per_call = 10**9
    engine.max_call_s = 3600.0
    return engine


async def started(engine: HFEngine, steps: int = 3) -> None:
    """Wait until the running batch has decoded `steps` steps (it is inside a chained call)."""
    async with asyncio.timeout(30):
        while engine.stats.decode_steps < steps:
            await asyncio.sleep(0.001)


async def test_abort_ends_a_chained_call(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    async with HFEngine(model, tokenizer) as engine:
        assert engine._decoder is not None  # the tiny model takes the fast path, which chains
        unbounded_chains(engine)
        long = asyncio.create_task(
            engine.generate(prompt(0, 9), SamplingParams(max_new_tokens=LONG, seed=0, stop_token_ids=NO_STOP), "long")
        )
        await started(engine)
        await engine.abort("long")
        async with asyncio.timeout(30):
            generation = await long
        assert generation.finish_reason == "abort"
        assert 0 < len(generation.token_ids) < LONG // 2
        assert engine.num_in_flight == 0


async def test_newcomer_joins_while_a_long_request_decodes(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    async with HFEngine(model, tokenizer) as engine:
        unbounded_chains(engine)
        long = asyncio.create_task(
            engine.generate(prompt(0, 9), SamplingParams(max_new_tokens=LONG, seed=0, stop_token_ids=NO_STOP), "long")
        )
        await started(engine)
        async with asyncio.timeout(30):
            short = await engine.generate(
                prompt(1, 7), SamplingParams(max_new_tokens=3, seed=1, stop_token_ids=NO_STOP)
            )
        assert len(short.token_ids) == 3 and short.finish_reason == "length"
        assert not long.done()  # the short one was admitted mid-chain, not after the long one
        await engine.abort("long")
        async with asyncio.timeout(30):
            assert (await long).finish_reason == "abort"


async def test_weight_update_lands_between_steps_of_a_running_request(tiny_model_and_tokenizer):
    """Without a pause, the update runs after the current step; the request decodes on, its
    later tokens stamped with the new version."""
    model, tokenizer = tiny_model_and_tokenizer
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    async with HFEngine(model, tokenizer) as engine:
        unbounded_chains(engine)
        long = asyncio.create_task(
            engine.generate(prompt(0, 9), SamplingParams(max_new_tokens=LONG, seed=0, stop_token_ids=NO_STOP), "long")
        )
        await started(engine)
        async with asyncio.timeout(30):
            await engine.update_weights(state, 7)
        assert not long.done()
        await started(engine, engine.stats.decode_steps + 2)
        await engine.abort("long")
        async with asyncio.timeout(30):
            generation = await long
    assert generation.token_versions[0] == 0 and generation.token_versions[-1] == 7
    assert generation.token_versions == sorted(generation.token_versions)


async def test_pause_update_resume_mid_generation_with_partial_resubmits(tiny_model_and_tokenizer):
    """The async trainer's cycle, over and over, while agents keep generating multi-turn
    episodes (one-token turns included, each aborted turn resubmitted with its partial output,
    as `EpisodeRunner.generate` does). Every episode ends, the engine drains, and no turn's
    tokens go back in version."""
    model, tokenizer = tiny_model_and_tokenizer
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    counts = {"turns": 0, "aborts": 0, "updates": 0}

    async def agent(engine: HFEngine, k: int) -> None:
        rng = random.Random(k)
        history = prompt(k, 5 + 9 * k)
        for turn in range(4):
            want = rng.choice([1, 1, 4, 12, 24])
            tokens: list[int] = []
            versions: list[int] = []
            while len(tokens) < want:
                sampling = SamplingParams(
                    max_new_tokens=want - len(tokens), seed=100 * k + turn, stop_token_ids=NO_STOP
                )
                generation = await engine.generate(history + tokens, sampling)
                tokens += generation.token_ids
                versions += generation.token_versions
                if generation.finish_reason != "abort":
                    break
                counts["aborts"] += 1
            assert len(tokens) == want and versions == sorted(versions)
            counts["turns"] += 1
            history = history + tokens + [5, 6 + k]
            await asyncio.sleep(0.002 * rng.random())  # the env's step

    async def trainer(engine: HFEngine, agents: asyncio.Future) -> None:
        version = 0
        while not agents.done():
            # like a real trainer, update only after some generation (its next batch): a pause
            # every few ms would abort every prefill before it yields a token, however fast
            seen = engine.stats.generated_tokens
            while engine.stats.generated_tokens < seen + 15 and not agents.done():
                await asyncio.sleep(0.002)
            version += 1
            await engine.pause()
            assert engine.num_in_flight == 0  # pause returns once everything in flight came back
            try:
                await engine.update_weights(state, version)
            finally:
                await engine.resume()
            counts["updates"] += 1

    async with HFEngine(model, tokenizer, max_batch_size=8) as engine:
        unbounded_chains(engine)
        agents = asyncio.gather(*(agent(engine, k) for k in range(6)))
        async with asyncio.timeout(120):
            await asyncio.gather(agents, trainer(engine, agents))
        assert engine.num_in_flight == 0
    assert counts["turns"] == 24 and counts["updates"] >= 3
    assert counts["aborts"] > 0  # the cycle really hit requests mid-generation


@pytest.mark.parametrize("window", [0.0, 0.002])
async def test_requests_sent_while_paused_run_after_resume(tiny_model_and_tokenizer, window):
    model, tokenizer = tiny_model_and_tokenizer
    async with HFEngine(model, tokenizer, batch_window_s=window) as engine:
        await engine.pause()
        waiting = [
            asyncio.create_task(
                engine.generate(prompt(k, 6), SamplingParams(max_new_tokens=2, seed=k, stop_token_ids=NO_STOP))
            )
            for k in range(4)
        ]
        await asyncio.sleep(0.05)
        assert not any(task.done() for task in waiting) and engine.num_in_flight == 0
        await engine.resume()
        async with asyncio.timeout(30):
            results = await asyncio.gather(*waiting)
    assert all(len(r.token_ids) == 2 for r in results)
