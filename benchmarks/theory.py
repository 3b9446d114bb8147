"""The ROLL Flash bounds (arXiv 2510.11345, Propositions 1-2) as plain functions.

The benchmarks print these next to what they measure, so a reader can see how close the
scheduler gets to the best any scheduler could do with the same workload. Symbols follow
/work/shared/reference/algorithms.md §4:

* K  inference workers (GPUs), N samples per training step,
* mu_gen / L_gen  mean and longest (tail) generation time of one sample,
* mu_train  training time per sample, E passes over each sample,
* alpha  async ratio (how many steps generation may run ahead), beta  share of GPUs training.

Everything here is closed-form; the tests check it against the worked numbers in the notes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0 or math.isinf(value):
            raise ValueError(f"{name} must be a positive finite number, got {value}")


def mean_completion_bound(mu_gen: float, l_gen: float, workers: int, queued_samples: int) -> float:
    """Prop. 1 (Graham list scheduling): mean per-sample completion time on K workers
    when Q samples are queued is at most mu_gen / K + L_gen / Q."""
    _check_positive(mu_gen=mu_gen, l_gen=l_gen, workers=workers, queued_samples=queued_samples)
    return mu_gen / workers + l_gen / queued_samples


@dataclass(frozen=True)
class Workload:
    """The quantities Prop. 2 needs, in seconds."""

    samples_per_step: int  # N
    workers: int  # K
    mu_gen_s: float
    l_gen_s: float  # tail (longest) generation time of one sample
    train_s_per_sample: float  # E * mu_train: all passes together

    def __post_init__(self) -> None:
        _check_positive(samples_per_step=self.samples_per_step, workers=self.workers, mu_gen_s=self.mu_gen_s)
        if self.l_gen_s < 0 or self.train_s_per_sample < 0:
            raise ValueError("l_gen_s and train_s_per_sample must be >= 0")

    @property
    def balanced_time_s(self) -> float:
        """a = N (mu_gen + E mu_train) / K: the step time with no tail at all."""
        return self.samples_per_step * (self.mu_gen_s + self.train_s_per_sample) / self.workers

    @property
    def tail_ratio(self) -> float:
        """rho = L_gen / a."""
        return self.l_gen_s / self.balanced_time_s


def sync_step_bound_s(w: Workload) -> float:
    """T_sync <= (N/K)(mu_gen + E mu_train) + L_gen."""
    return w.balanced_time_s + w.l_gen_s


def async_step_bound_s(w: Workload, alpha: float) -> float:
    """T_async <= (N/K)(mu_gen + E mu_train) + L_gen / (alpha + 1)."""
    if alpha < 0:
        raise ValueError("alpha must be >= 0")
    if math.isinf(alpha):
        return w.balanced_time_s
    return w.balanced_time_s + w.l_gen_s / (alpha + 1)


def speedup_bound_from_ratio(rho: float, alpha: float) -> float:
    """S(alpha) = (1 + rho) / (1 + rho / (alpha + 1)); S(inf) = 1 + rho."""
    if rho < 0 or alpha < 0:
        raise ValueError("rho and alpha must be >= 0")
    if math.isinf(alpha):
        return 1.0 + rho
    return (1.0 + rho) / (1.0 + rho / (alpha + 1))


def speedup_bound(w: Workload, alpha: float) -> float:
    """Upper bound of T_sync / T_async for this workload (Prop. 2)."""
    return speedup_bound_from_ratio(w.tail_ratio, alpha)


def optimal_training_share(w: Workload, alpha: float) -> float:
    """beta* = E N mu_train / (N mu_gen + K L_gen / (alpha+1) + E N mu_train)."""
    if alpha < 0:
        raise ValueError("alpha must be >= 0")
    n, k = w.samples_per_step, w.workers
    tail = 0.0 if math.isinf(alpha) else k * w.l_gen_s / (alpha + 1)
    train = n * w.train_s_per_sample
    return train / (n * w.mu_gen_s + tail + train)


def tail_fraction_removed(alpha: float) -> float:
    """alpha / (alpha + 1): the share of the tail term async training hides."""
    if alpha < 0:
        raise ValueError("alpha must be >= 0")
    return 1.0 if math.isinf(alpha) else alpha / (alpha + 1)
