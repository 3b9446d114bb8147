"""Contract of the SIMULATED latency-model engine, run on the virtual clock."""

import asyncio

import numpy as np
import pytest

from rollhub.bench.sim import latency_model
from rollhub.bench.sim.latency_model import LatencyModelEngine, LatencyParams, OutputLengths
from rollhub.bench.sim.virtual_clock import run_virtual
from rollhub.inference.engines.base import SamplingParams

PARAMS = LatencyParams(
    prefill_base_s=0.5,
    prefill_per_token_s=0.01,
    decode_base_s=0.1,
    decode_per_request_s=0.05,
    max_batch=4,
    prefill_blocks_decode=False,
)
FIXED = OutputLengths(kind="fixed", mean_tokens=20)


def test_marked_as_simulation():
    assert latency_model.SIMULATION and LatencyModelEngine.simulation


def test_single_request_timing_and_token_records():
    async def main():
        engine = LatencyModelEngine(PARAMS, output_lengths=FIXED)
        loop = asyncio.get_running_loop()
        gen = await engine.generate(list(range(50)), SamplingParams(max_new_tokens=100, stop_token_ids=(7,)))
        return gen, loop.time()

    gen, elapsed = run_virtual(main())
    assert elapsed == pytest.approx(0.5 + 0.01 * 50 + 20 * 0.1)
    assert gen.finish_reason == "stop" and len(gen.token_ids) == 20 and gen.token_ids[-1] == 7
    assert len(gen.logprobs) == 20 and all(lp <= 0 for lp in gen.logprobs)
    assert gen.token_versions == [0] * 20 and gen.prompt_tokens == 50 and gen.meta["simulated"]


def test_batch_slowdown_and_queueing():
    async def one(engine, n):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await engine.generate([1], SamplingParams(max_new_tokens=1000), meta_length=n)
        return loop.time() - t0

    async def main(concurrent):
        engine = LatencyModelEngine(PARAMS)
        return await asyncio.gather(*(one(engine, 10) for _ in range(concurrent)))

    alone = run_virtual(main(1))[0]
    pair = run_virtual(main(2))
    assert pair[0] > alone  # each request slows down in a bigger batch
    assert 2 * 10 / (pair[0] - 0.51) > 10 / (alone - 0.51)  # but throughput rises
    six = run_virtual(main(6))  # max_batch 4: two requests queue behind the first four
    ordered = sorted(six)
    assert ordered[3] == pytest.approx(ordered[0]) and ordered[4] > ordered[3] + 1.0


def test_blocking_prefill_pauses_the_decode_batch():
    params = LatencyParams(prefill_base_s=0.5, prefill_per_token_s=0.0, decode_base_s=0.1, decode_per_request_s=0.05)

    async def timed(engine, delay_s):
        loop = asyncio.get_running_loop()
        await asyncio.sleep(delay_s)
        await engine.generate([1], SamplingParams(max_new_tokens=100), meta_length=10)
        return loop.time()

    async def main(delays):
        engine = LatencyModelEngine(params)
        return await asyncio.gather(*(timed(engine, d) for d in delays))

    # together: prefills run back to back (0-0.5, 0.5-1.0), then 10 iterations at batch 2
    assert run_virtual(main([0.0, 0.0])) == pytest.approx([2.5, 2.5])
    # B arrives at 0.7 when A has 2 tokens: A stalls during B's prefill (0.7-1.2),
    # both decode at batch 2 until A ends (1.2 + 8 * 0.15), B finishes alone
    assert run_virtual(main([0.0, 0.7])) == pytest.approx([2.4, 2.6])


def test_length_cap_and_replica_spread():
    async def main():
        engine = LatencyModelEngine(PARAMS, output_lengths=FIXED, replicas=3)
        gens = await asyncio.gather(*(engine.generate([1], SamplingParams(max_new_tokens=5)) for _ in range(3)))
        return gens

    gens = run_virtual(main())
    assert all(g.finish_reason == "length" and len(g.token_ids) == 5 for g in gens)
    assert sorted(g.meta["replica"] for g in gens) == [0, 1, 2]


def test_abort_returns_partial_output():
    async def main():
        engine = LatencyModelEngine(PARAMS, output_lengths=FIXED)
        task = asyncio.create_task(engine.generate([1] * 10, SamplingParams(max_new_tokens=100), request_id="r1"))
        await asyncio.sleep(0.6 + 0.55)  # prefill 0.6 s, then 5.5 iterations of 0.1 s
        await engine.abort("r1")
        await engine.abort("unknown")  # no-op
        gen = await task
        return gen, engine.in_flight()

    gen, left = run_virtual(main())
    assert gen.finish_reason == "abort" and len(gen.token_ids) == 5
    assert len(gen.logprobs) == len(gen.token_versions) == 5 and left == 0


def test_pause_aborts_holds_and_versions_follow_updates():
    async def main():
        engine = LatencyModelEngine(PARAMS, output_lengths=FIXED)
        sampling = SamplingParams(max_new_tokens=100)
        first = asyncio.create_task(engine.generate([1], sampling))
        await asyncio.sleep(1.0)
        with pytest.raises(RuntimeError):
            await engine.update_weights(None, 1)
        await engine.pause()
        held = asyncio.create_task(engine.generate([1], sampling))
        await asyncio.sleep(50.0)
        assert not held.done()  # new requests wait while paused
        await engine.update_weights("ckpt", 1)
        await engine.resume()
        return await first, await held, engine.weight_version

    first, held, version = run_virtual(main())
    assert first.finish_reason == "abort" and 0 < len(first.token_ids) < 20 and set(first.token_versions) == {0}
    assert held.finish_reason == "stop" and held.token_versions == [1] * 20 and version == 1


def test_cancelled_caller_frees_its_slot():
    async def main():
        engine = LatencyModelEngine(PARAMS, output_lengths=FIXED)
        task = asyncio.create_task(engine.generate([1], SamplingParams(max_new_tokens=100)))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return engine.in_flight()

    assert run_virtual(main()) == 0


@pytest.mark.parametrize("kind", ["lognormal", "pareto"])
def test_long_tailed_lengths_keep_their_mean(kind):
    lengths = OutputLengths(kind=kind, mean_tokens=200, sigma=1.0, pareto_shape=2.5)
    rng = np.random.default_rng(0)
    draws = np.array([lengths.sample(rng) for _ in range(20000)])
    assert draws.mean() == pytest.approx(200, rel=0.08)
    assert np.percentile(draws, 99) > 3 * np.median(draws)  # a real tail


def test_params_round_trip(tmp_path):
    PARAMS.to_json(tmp_path / "p.json")
    assert LatencyParams.from_json(tmp_path / "p.json") == PARAMS
    with pytest.raises(ValueError):
        LatencyParams(decode_base_s=0)


def test_iteration_table_interpolates_and_extends():
    params = LatencyParams(decode_base_s=1.0, iteration_table=((1, 0.010), (4, 0.016), (8, 0.020)))
    assert params.iteration_s(1) == pytest.approx(0.010)
    assert params.iteration_s(2) == pytest.approx(0.012)
    assert params.iteration_s(6) == pytest.approx(0.018)
    assert params.iteration_s(12) == pytest.approx(0.024)  # last segment's slope continues
    assert LatencyParams(iteration_table=[[2, 0.5], [1, 0.25]]).iteration_table == ((1, 0.25), (2, 0.5))
    with pytest.raises(ValueError):
        LatencyParams(iteration_table=((1, 0.0),))
