"""Virtual clock, latency envs, simulation tokenizer and the training driver."""

import asyncio
import time

import numpy as np
import pytest

from rollhub.bench.sim.latency_env import LatencyDistribution
from rollhub.bench.sim.latency_model import LatencyParams
from rollhub.bench.sim.tokenizer import SimTokenizer
from rollhub.bench.sim.training import (
    GPU_REPLICA,
    SimRun,
    measured_agentic_workload,
    measured_speedup_bound,
    simulate_virtual,
    token_gpu_s,
)
from rollhub.bench.sim.virtual_clock import run_virtual
from rollhub.bench.theory import agentic_sync_step_s
from rollhub.envs.registry import make, spec


def test_virtual_clock_skips_waiting():
    async def main():
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(asyncio.sleep(3600, result="a"), asyncio.sleep(5, result="b"))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), 7)
        return results, loop.time()

    wall = time.perf_counter()
    results, now = run_virtual(main())
    assert results == ["a", "b"] and now == pytest.approx(3607)
    assert time.perf_counter() - wall < 5


def test_latency_env_is_marked_and_draws_its_own_timing():
    assert spec("bench/LatencySokoban-v0").description.startswith("[benchmark simulation]")

    async def episode(latency_seed):
        env = make("bench/LatencySokoban-v0", turns=4, step_std_s=5.0, time_scale=1.0, latency_seed=latency_seed)
        loop = asyncio.get_running_loop()
        obs, info = await env.reset(seed=7)
        assert info["anchor"] == (7, 0) and obs[-1]["role"] == "user"
        done = False
        while not done:
            obs, reward, terminated, truncated, info = await env.step("<action>x</action>")
            done = terminated or truncated
        return loop.time(), env.latencies_s, info

    elapsed_a, latencies_a, info = run_virtual(episode(1))
    elapsed_b, latencies_b, _ = run_virtual(episode(2))
    assert elapsed_a == pytest.approx(sum(latencies_a)) and info["anchor"] == (7, 4)
    assert latencies_a != latencies_b  # same task seed, independent timing


def test_latency_distribution_fail_slow():
    rng = np.random.default_rng(0)
    plain = [LatencyDistribution(10, 1).sample(rng) for _ in range(2000)]
    slow = [LatencyDistribution(10, 1, fail_slow_prob=0.1, fail_slow_factor=10).sample(rng) for _ in range(2000)]
    assert min(plain) >= 0.1 and np.mean(plain) == pytest.approx(10, abs=0.2)
    assert np.mean(np.array(slow) > 50) == pytest.approx(0.1, abs=0.03)


def test_sim_tokenizer_works_with_chat_segments():
    from rollhub.rollout.prompting import ChatSegments

    tokenizer = SimTokenizer(vocab_size=512)
    segments = ChatSegments(tokenizer)
    history = [{"role": "user", "content": "hello there"}]
    head = segments.encode_head(history)
    assert head and all(0 <= t < 512 for t in head)
    assert tokenizer.decode([tokenizer.eos_token_id, 100], skip_special_tokens=True) == "t100 "


def test_driver_env_async_beats_lockstep_and_async_beats_sync():
    common = dict(groups=3, group_size=3, steps=3)
    env_kwargs = {"turns": 4, "step_std_s": 10.0}
    lockstep = simulate_virtual(SimRun(mode="lockstep", env_kwargs=env_kwargs, train_gpu_s=160.0, **common))
    env_async = simulate_virtual(SimRun(env_kwargs=env_kwargs, train_gpu_s=160.0, **common))
    asynchronous = simulate_virtual(SimRun(env_kwargs=env_kwargs, train_gpu_s=160.0, alpha=1.0, **common))
    # lockstep waits for the slowest env at every turn; env-async only for the slowest trajectory
    assert lockstep.step_s > env_async.step_s
    assert lockstep.mean_trajectory_s > env_async.mean_trajectory_s
    assert (
        asynchronous.step_s < env_async.step_s and asynchronous.trainer_idle_fraction < env_async.trainer_idle_fraction
    )
    assert 1.0 < measured_speedup_bound(env_async, 1.0) < 2.0
    # the agentic workload: env latency (4 steps of ~N(10, 10) s) is most of a trajectory,
    # GPU work (decoded tokens at the best throughput) a small part, both within its wall time
    assert 4 * 8.0 < env_async.mean_env_s < env_async.mean_trajectory_s
    assert (
        0 < env_async.mean_gen_work_s <= env_async.max_gen_work_s < env_async.mean_trajectory_s - env_async.mean_env_s
    )
    w = measured_agentic_workload(env_async, 9)
    assert w.tail_s == env_async.mean_longest_trajectory_s and w.train_load_s == pytest.approx(env_async.train_step_s)
    assert agentic_sync_step_s(w) >= env_async.step_s  # Graham's form is an upper bound on the sync step
    assert env_async.scheduler_cpu_s_per_step < env_async.cpu_s_per_step


def test_token_gpu_s_is_the_best_throughput():
    # linear iteration time: per-token cost falls with the batch, so the full batch is best
    assert token_gpu_s(GPU_REPLICA) == pytest.approx((0.03 + 0.0003 * 127) / 128)
    table = LatencyParams(max_batch=4, iteration_table=((1, 0.01), (2, 0.012), (4, 0.06)))
    assert token_gpu_s(table) == pytest.approx(0.006)  # batch 2 beats batch 4 here
