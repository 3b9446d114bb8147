"""The env-level async gain prediction is bounded by the env's share of a lockstep batch (Amdahl)."""

from __future__ import annotations

import pytest

from rollhub.bench.async_gain import batch_times, predicted_gain, tiny_cpu_generation_s
from rollhub.bench.env_card import predicted_speedups


def test_negligible_env_steps_predict_no_gain_however_spread():
    # steps of 0 to 0.1 ms, wildly spread, against 100 ms of generation per turn
    episodes = [[1e-5] + [1e-7 if (i + t) % 3 else 1e-4 for t in range(10)] for i in range(8)]
    gain = predicted_gain(episodes, 0.1, batch=8)
    assert gain["predicted_gain"] == pytest.approx(1.0, abs=1e-3)
    assert gain["amdahl_bound"] == pytest.approx(1.0, abs=2e-3)
    # counting env time alone, the same latencies promised a large gain
    assert predicted_speedups(episodes, batch=8)["lockstep_over_env_async"] > 2.0


def test_slow_staggered_steps_gain_up_to_the_bound():
    staggered = [[0.0] + [0.1] * t + [1.0] + [0.1] * (9 - t) for t in range(10)]
    gain = predicted_gain(staggered, 0.1, batch=10)
    assert 1.5 < gain["predicted_gain"] <= gain["amdahl_bound"]
    lockstep, env_async, generation = batch_times(staggered, 0.1)
    assert lockstep == pytest.approx(10 * (0.1 + 1.0))  # every turn waits for someone's slow step
    assert env_async == pytest.approx(10 * 0.1 + 9 * 0.1 + 1.0)
    assert generation == pytest.approx(1.0)


def test_generation_pace_and_errors():
    assert tiny_cpu_generation_s(16, 32) > tiny_cpu_generation_s(1, 32) > 0
    assert predicted_gain([], 0.1, batch=4)["predicted_gain"] == 1.0
    with pytest.raises(ValueError, match="generation_s_per_turn"):
        predicted_gain([[0.1, 0.1]], -1.0, batch=2)
