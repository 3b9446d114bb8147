"""The ROLL Flash bounds (arXiv 2510.11345, Propositions 1-2) as plain functions.

The benchmarks print these next to what they measure, so a reader can see how close the
scheduler gets to the best any scheduler could do with the same workload. Symbols follow
the paper's Propositions 1-2:

* K  inference workers (GPUs), N samples per training step,
* mu_gen / L_gen  mean and longest (tail) generation time of one sample,
* mu_train  training time per sample, E passes over each sample,
* alpha  async ratio (how many steps generation may run ahead), beta  share of GPUs training.

The second half extends Prop. 2 to agentic workloads (AgenticWorkload, agentic_*): each
trajectory's time is split into GPU work and off-GPU env latency, which async training can
overlap; with no env latency it is Prop. 2 again.

Everything here is closed-form; the tests (tests/bench/test_theory.py) check it against
worked numbers and against hand-computed agentic examples.
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


# ---------------------------------------------------------------------------------------
# Agentic extension of Prop. 2: trajectories that spend most of their time off the GPU.
#
# Prop. 2 counts a sample's whole time as GPU generation. In agentic RL a trajectory
# alternates model turns (GPU) with env steps, resets and tool calls (off the GPU: env
# latency), and async training overlaps that latency with training, so Prop. 2 is not a cap
# there (`rollhub bench async-agentic` exceeds it). The functions below split a trajectory
# into GPU work and env latency and redo the derivation; with zero env latency they are
# Prop. 2 exactly (tests/bench/test_theory.py checks it).
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgenticWorkload:
    """What the agentic bound needs, in seconds (GPU quantities in GPU-seconds).

    gen_s / gen_tail_s are GPU *work*: the GPU-seconds one trajectory's generation occupies
    at the engine's best throughput (a batching engine serves many requests at once, so this
    is far below the trajectory's time on the GPU). With one sample per GPU at a time, the
    model of Prop. 2, work equals generation time, and these are Prop. 2's mu_gen and L_gen.
    """

    samples_per_step: int  # N trajectories consumed per training step
    workers: int  # K GPUs, the equal budget of sync and async
    gen_s: float  # mu_gen: mean GPU work of one trajectory (all its turns)
    gen_tail_s: float  # L_gen: GPU work of the trajectory with the most generation
    env_s: float  # mu_env: mean off-GPU latency of one trajectory (env steps, resets, tools)
    tail_s: float  # L: wall time of a sync batch's slowest trajectory (GPU + env)
    train_s_per_sample: float  # E * mu_train (GPU-seconds); W = N * this per step
    push_s: float = 0.0  # weight push after each training step (the trainer waits for it)
    wall_s: float | None = None  # mean wall time of one trajectory; None: gen_s + env_s

    def __post_init__(self) -> None:
        _check_positive(samples_per_step=self.samples_per_step, workers=self.workers, gen_s=self.gen_s)
        for name in ("gen_tail_s", "env_s", "tail_s", "train_s_per_sample", "push_s"):
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.gen_tail_s < self.gen_s:
            raise ValueError("gen_tail_s (the largest trajectory's GPU work) must be >= gen_s (the mean)")
        if self.tail_s < self.gen_tail_s:
            raise ValueError(
                "tail_s (slowest trajectory's wall time) must be >= gen_tail_s (its GPU work is part of it)"
            )
        if self.wall_s is not None and (not self.wall_s >= self.env_s or math.isinf(self.wall_s)):
            raise ValueError("wall_s (mean trajectory wall time) must be finite and >= env_s")

    @property
    def mean_wall_s(self) -> float:
        """Mean wall time of a trajectory; unloaded default gen_s + env_s (a lower bound:
        a request cannot finish faster than its GPU work)."""
        return self.gen_s + self.env_s if self.wall_s is None else self.wall_s

    @property
    def gen_load_s(self) -> float:
        """N mu_gen / K: the step's GPU work spread over all K GPUs."""
        return self.samples_per_step * self.gen_s / self.workers

    @property
    def train_load_s(self) -> float:
        """C = N E mu_train / K = W / K: the step's training on all K GPUs."""
        return self.samples_per_step * self.train_s_per_sample / self.workers

    def gen_term_load_s(self, alpha: float) -> float:
        """D = (N mu_gen + K L_gen / (alpha + 1)) / K: Prop. 2's generation load."""
        return self.gen_load_s + (0.0 if math.isinf(alpha) else self.gen_tail_s / (alpha + 1))


def _in_flight(w: AgenticWorkload, alpha: float, in_flight: float | None) -> float:
    if alpha < 0:
        raise ValueError("alpha must be >= 0")
    if in_flight is None:
        return math.inf if math.isinf(alpha) else (alpha + 1) * w.samples_per_step
    if not in_flight > 0:
        raise ValueError("in_flight must be > 0")
    return in_flight


def agentic_sync_step_s(w: AgenticWorkload) -> float:
    """T_sync <= N mu_gen / K + L + N E mu_train / K + push (colocated: all K GPUs generate,
    then all K train).

    Graham's argument with off-GPU delays: follow the batch's last trajectory back in time;
    at every instant it is either running (on a GPU or in its env: in all at most its own
    time without queueing, <= L) or waiting for a GPU while all K are busy (at most the
    batch's GPU work / K).
    Env latency is not GPU work, so it enters only through L. With env_s = 0 and
    L = L_gen this is Prop. 2's (N/K)(mu_gen + E mu_train) + L_gen. When L is a measured
    collection time (which already includes any waiting), the first term is slack."""
    return w.gen_load_s + w.tail_s + w.train_load_s + w.push_s


def agentic_async_terms_s(
    w: AgenticWorkload, alpha: float, train_share: float, in_flight: float | None = None
) -> dict[str, float]:
    """The limits of an async step with ratio alpha and beta = train_share of the K GPUs
    training while (1 - beta) K generate (equal budget); the step is at least each of them:

    * train: N E mu_train / (beta K) + push. The trainer computes its step, then pushes the
      weights (in our loop the push is serial with training; Prop. 2 has none).
    * gen: (N mu_gen + K L_gen / (alpha + 1)) / ((1 - beta) K). The (1 - beta) K generation
      GPUs must do the step's N samples of GPU work; the straggler allowance L_gen / (alpha+1)
      is Prop. 2's own (Prop. 1 with (alpha+1) N samples queued), scaled as in its beta*. Env
      latency is off the GPU, so it does not appear here.
    * latency: N mean_wall / Q (Little's law). At most Q trajectories are in flight (default
      (alpha + 1) N: the buffer admits alpha steps ahead of the batch being trained) and each
      lasts mean_wall on average, so they finish at most Q / mean_wall per second.

    Assumptions: steady state, consumed samples cost the GPU work and take the wall time of
    the sync workload (more contention on fewer generation GPUs only makes them slower; with
    redundancy the kept ones are the faster, see agentic_speedup_bound), weights reach the
    generation GPUs only by the push, aborted and resubmitted work only adds.

    Not used, because short runs beat it: the staleness window. A sample in batch s carries
    no token older than version s - alpha, so its time from its first model call is at most
    (alpha + 1) T - t_train, i.e. T >= (that time + t_train) / (alpha + 1) on average; but a
    run measured over a few steps after one warm-up step consumes mostly the fast trajectories
    of the first (alpha + 1) B admitted at once, so `rollhub bench async-agentic --quick` beats
    that floor."""
    if not 0 < train_share < 1:
        raise ValueError("train_share must be in (0, 1)")
    queued = _in_flight(w, alpha, in_flight)
    return {
        "train": w.train_load_s / train_share + w.push_s,
        "gen": w.gen_term_load_s(alpha) / (1 - train_share),
        "latency": w.samples_per_step * w.mean_wall_s / queued,
    }


def agentic_async_step_s(w: AgenticWorkload, alpha: float, train_share: float, in_flight: float | None = None) -> float:
    """T_async(beta) >= max(train, gen, latency) (see agentic_async_terms_s)."""
    return max(agentic_async_terms_s(w, alpha, train_share, in_flight).values())


def optimal_agentic_share(w: AgenticWorkload, alpha: float) -> float:
    """beta* where the train term meets the gen term, C / beta + p = D / (1 - beta), with
    C = N E mu_train / K, D = (N mu_gen + K L_gen / (alpha+1)) / K, p = push:

        beta* = 2C / ((C + D - p) + sqrt((C + D - p)^2 + 4 p C)),

    the root in (0, 1) of p beta^2 + (C + D - p) beta - C = 0, written so that p = 0 needs
    no special case (it is then C / (C + D), Prop. 2's beta*). The train term falls and the
    gen term rises with beta and the latency term does not depend on it, so beta* minimises
    their max. C = 0 (no training) gives 0: every GPU may generate."""
    if alpha < 0:
        raise ValueError("alpha must be >= 0")
    c, p, d = w.train_load_s, w.push_s, w.gen_term_load_s(alpha)
    if c == 0:
        return 0.0
    b = c + d - p
    return 2 * c / (b + math.sqrt(b * b + 4 * p * c))


def agentic_async_best_step_s(w: AgenticWorkload, alpha: float, in_flight: float | None = None) -> float:
    """min over beta of T_async(beta): the fastest step any GPU split (integer or not) allows."""
    beta = optimal_agentic_share(w, alpha)
    if beta > 0:
        return agentic_async_step_s(w, alpha, beta, in_flight)
    latency = w.samples_per_step * w.mean_wall_s / _in_flight(w, alpha, in_flight)
    return max(w.push_s, w.gen_term_load_s(alpha), latency)  # no training: the limits as beta -> 0


def agentic_speedup_bound(
    w: AgenticWorkload, alpha: float, train_share: float | None = None, in_flight: float | None = None
) -> float:
    """S <= T_sync / T_async: agentic_sync_step_s over agentic_async_step_s at beta =
    train_share, or over agentic_async_best_step_s (the best split) when it is None.

    What is a floor and what is not: the numerator is an upper bound on the sync step
    (Graham); the train term is a hard floor; the latency term is one in steady state when
    mean_wall does not overstate the consumed trajectories' mean wall time (the default
    gen_s + env_s never does; with redundancy the kept trajectories are the faster ones);
    the gen term's throughput part is a floor, but its straggler allowance L_gen / (alpha+1)
    is Prop. 2's Graham term, added where a strict floor would take a max. So, as with
    Prop. 2, a scheduler can pass this bound by at most that allowance (as the gen term
    scales it), and only where the gen term binds; in agentic workloads it is small (a
    trajectory's GPU work is seconds, its env latency minutes).

    With env_s = 0 (and L = L_gen, push = 0, mean_wall = mu_gen) this is Prop. 2's
    (1 + rho) / (1 + rho / (alpha + 1)) for every alpha: the latency term, mu_gen / (alpha+1),
    never exceeds the gen term's L_gen / (alpha + 1) then."""
    sync = agentic_sync_step_s(w)
    if train_share is None:
        return sync / agentic_async_best_step_s(w, alpha, in_flight)
    return sync / agentic_async_step_s(w, alpha, train_share, in_flight)
