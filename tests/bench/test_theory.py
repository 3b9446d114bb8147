"""ROLL Flash bounds (arXiv 2510.11345, sec. 3) against numbers worked out by hand."""

import math

import pytest

from rollhub.bench import theory


@pytest.mark.parametrize(
    "rho, alpha, expected",
    [
        (1, 1, 1.33),
        (1, 2, 1.50),
        (1, 4, 1.67),
        (1, math.inf, 2.00),
        (2, 1, 1.50),
        (2, 2, 1.80),
        (2, 4, 2.14),
        (2, math.inf, 3.00),
    ],
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


# --- agentic extension -------------------------------------------------------------------


def _agentic(**overrides):
    # 128 trajectories on 16 GPUs; 0.5 GPU-s of generation work, 100 s of env latency and
    # 140 s of wall time each; the slowest takes 220 s; W = 2048 GPU-s; 2 s weight push
    values = dict(
        samples_per_step=128,
        workers=16,
        gen_s=0.5,
        gen_tail_s=1.0,
        env_s=100.0,
        tail_s=220.0,
        train_s_per_sample=16.0,
        push_s=2.0,
        wall_s=140.0,
    )
    values.update(overrides)
    return theory.AgenticWorkload(**values)


def _worked_case():
    prop2 = theory.Workload(samples_per_step=256, workers=32, mu_gen_s=30.0, l_gen_s=320.0, train_s_per_sample=10.0)
    return prop2, theory.AgenticWorkload(
        samples_per_step=256, workers=32, gen_s=30.0, gen_tail_s=320.0, env_s=0.0, tail_s=320.0, train_s_per_sample=10.0
    )


@pytest.mark.parametrize("alpha", [0, 1, 2, 4, math.inf])
def test_agentic_reduces_to_prop2_without_env_latency(alpha):
    prop2, w = _worked_case()
    assert theory.agentic_sync_step_s(w) == pytest.approx(theory.sync_step_bound_s(prop2))
    assert theory.agentic_async_best_step_s(w, alpha) == pytest.approx(theory.async_step_bound_s(prop2, alpha))
    assert theory.agentic_speedup_bound(w, alpha) == pytest.approx(theory.speedup_bound(prop2, alpha))
    assert theory.optimal_agentic_share(w, alpha) == pytest.approx(theory.optimal_training_share(prop2, alpha))
    # at the share beta* the trainer and the generation terms meet (Prop. 2's balance)
    terms = theory.agentic_async_terms_s(w, alpha, theory.optimal_agentic_share(w, alpha))
    assert terms["train"] == pytest.approx(terms["gen"]) and terms["latency"] <= terms["gen"]


def test_agentic_worked_example_by_hand():
    w = _agentic()
    # sync: 128 * 0.5 / 16 + 220 + 128 * 16 / 16 + 2 = 4 + 220 + 128 + 2
    assert theory.agentic_sync_step_s(w) == pytest.approx(354.0)
    # alpha = 2, beta = 0.75: trainer 128 / 0.75 + 2 = 172.67; generation (4 + 16 * 1 / 3 / 16) / 0.25 = 17.33;
    # latency 128 * 140 / 384 = 46.67: the trainer binds
    terms = theory.agentic_async_terms_s(w, 2, 0.75)
    assert terms == pytest.approx({"train": 128 / 0.75 + 2, "gen": (4 + 1 / 3) / 0.25, "latency": 140 / 3})
    assert theory.agentic_speedup_bound(w, 2, 0.75) == pytest.approx(354.0 / (128 / 0.75 + 2))  # 2.050
    # best split: 2 beta^2 + (128 + 13/3 - 2) beta - 128 = 0 -> beta* = 0.96773, step 134.27 s
    beta = theory.optimal_agentic_share(w, 2)
    assert 2 * beta**2 + (128 + 13 / 3 - 2) * beta - 128 == pytest.approx(0.0, abs=1e-9)
    assert beta == pytest.approx(0.96773, abs=1e-5)
    assert theory.agentic_async_best_step_s(w, 2) == pytest.approx(134.27, abs=0.01)
    assert theory.agentic_speedup_bound(w, 2) == pytest.approx(354.0 / 134.27, abs=1e-3)  # 2.636
    # Prop. 2 on the same numbers (all 140 s of a trajectory counted as GPU time) is far lower
    prop2 = theory.Workload(samples_per_step=128, workers=16, mu_gen_s=140.0, l_gen_s=220.0, train_s_per_sample=16.0)
    assert theory.speedup_bound(prop2, 2) < 1.2 < theory.agentic_speedup_bound(w, 2)


def test_agentic_latency_term_binds_with_few_in_flight():
    w = _agentic()
    # only 128 trajectories in flight: 128 * 140 / 128 = 140 s > the 134.27 s the best split allows
    assert theory.agentic_async_best_step_s(w, 2, in_flight=128) == pytest.approx(140.0)
    assert theory.agentic_speedup_bound(w, 2, in_flight=128) == pytest.approx(354.0 / 140.0)
    # without a given wall time the latency term uses the unloaded gen_s + env_s
    assert _agentic(wall_s=None).mean_wall_s == pytest.approx(100.5)


def test_agentic_bound_grows_with_alpha_and_shrinks_with_training():
    w = _agentic()
    values = [theory.agentic_speedup_bound(w, a) for a in (0, 1, 2, 4, math.inf)]
    assert values == sorted(values)
    heavier = _agentic(train_s_per_sample=32.0, tail_s=220.0)
    # more training per step: the trainer term grows faster than the sync step
    assert theory.agentic_speedup_bound(heavier, 2) < theory.agentic_speedup_bound(w, 2)
    # no training at all: the bound is set by generation and latency, still finite
    assert math.isfinite(theory.agentic_speedup_bound(_agentic(train_s_per_sample=0.0), 2))


def test_agentic_rejects_bad_input():
    for bad in (
        dict(gen_s=0.0),
        dict(env_s=-1.0),
        dict(gen_tail_s=0.1),
        dict(tail_s=0.5),
        dict(wall_s=50.0),
        dict(push_s=math.inf),
    ):
        with pytest.raises(ValueError):
            _agentic(**bad)
    with pytest.raises(ValueError):
        theory.agentic_async_step_s(_agentic(), 2, 1.0)
    with pytest.raises(ValueError):
        theory.agentic_speedup_bound(_agentic(), -1)
    with pytest.raises(ValueError):
        theory.agentic_speedup_bound(_agentic(), 2, in_flight=0)
