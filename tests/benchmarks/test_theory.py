"""ROLL Flash bounds against the worked numbers in reference/algorithms.md §4."""

import math

import pytest

from rollhub.benchmarks import theory


@pytest.mark.parametrize(
    "rho, alpha, expected",
    [(1, 1, 1.33), (1, 2, 1.50), (1, 4, 1.67), (1, math.inf, 2.00), (2, 1, 1.50), (2, 2, 1.80), (2, 4, 2.14), (2, math.inf, 3.00)],
)
def test_speedup_table(rho, alpha, expected):
    assert theory.speedup_bound_from_ratio(rho, alpha) == pytest.approx(expected, abs=0.005)


def test_worked_case():
    w = theory.Workload(samples_per_step=256, workers=32, mu_gen_s=30.0, l_gen_s=320.0, train_s_per_sample=10.0)
    assert w.balanced_time_s == pytest.approx(320.0)
    assert w.tail_ratio == pytest.approx(1.0)
    assert theory.sync_step_bound_s(w) == pytest.approx(640.0)
    assert theory.async_step_bound_s(w, 2) == pytest.approx(426.67, abs=0.01)
    assert theory.speedup_bound(w, 2) == pytest.approx(1.5)
    assert theory.optimal_training_share(w, 2) == pytest.approx(2560 / 13653.33, abs=1e-4)
    assert theory.optimal_training_share(w, 2) == pytest.approx(0.19, abs=0.005)


def test_alpha_zero_is_sync_and_bound_grows_with_alpha():
    w = theory.Workload(samples_per_step=64, workers=8, mu_gen_s=5.0, l_gen_s=60.0, train_s_per_sample=1.0)
    assert theory.async_step_bound_s(w, 0) == theory.sync_step_bound_s(w)
    assert theory.speedup_bound(w, 0) == pytest.approx(1.0)
    values = [theory.speedup_bound(w, a) for a in (0, 1, 2, 4, math.inf)]
    assert values == sorted(values) and values[-1] == pytest.approx(1 + w.tail_ratio)


def test_tail_fraction_and_prop1():
    assert [round(theory.tail_fraction_removed(a), 2) for a in (1, 2, 4)] == [0.5, 0.67, 0.8]
    # async queues (alpha+1) N samples, shrinking the tail term by alpha + 1
    sync = theory.mean_completion_bound(30.0, 320.0, workers=32, queued_samples=256)
    asyn = theory.mean_completion_bound(30.0, 320.0, workers=32, queued_samples=3 * 256)
    assert sync - 30 / 32 == pytest.approx(3 * (asyn - 30 / 32))


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        theory.speedup_bound_from_ratio(1.0, -1)
    with pytest.raises(ValueError):
        theory.Workload(samples_per_step=0, workers=1, mu_gen_s=1, l_gen_s=1, train_s_per_sample=1)
