"""How much env-level asynchrony can gain for an env, from its step latencies and the model's pace.

Env-level asynchrony only removes waiting on envs: in lockstep every turn of a batch waits for
the batch's slowest env step, while with one coroutine per trajectory each env steps as soon as
its own generation returns and the batch waits only for its slowest trajectory. Generation is
not removed by either schedule, so the gain is bounded by how much of a lockstep batch is env
time at all (Amdahl's law): an env whose steps take 0.04 ms against 100 ms of generation per
turn cannot gain more than 1.0004x, however spread out its latencies are. Counting env time
alone (the old card) divides one tiny number by another and predicts gains that never appear.

For a batch of episodes, each a list `[reset_s, step_1_s, ..., step_T_s]`, and a generation
time `g` per turn (one generation call of one trajectory while the batch decodes together):

    lockstep = max_i reset_i + sum_t (g + max_{i still running at t} step_{i,t})
    env-async = max_i (reset_i + sum_t (g + step_{i,t}))
    predicted gain = lockstep / env-async                    (mean over batches drawn)
    Amdahl bound   = lockstep / (g * longest episode's turns) = 1 + lockstep env time / generation time

When each turn's own generation time g_{i,t} is known (its reply's length, as `bench async`
measures), it replaces g: a lockstep turn then also waits for the batch's longest reply, a
barrier env-level asynchrony removes as well.

The prediction assumes the engine batches concurrent requests, so a request's latency does not
depend on how many others run with it (true to within the batch-size slope on a GPU engine and
on our CPU HFEngine for small batches), and that env steps of different trajectories overlap
(envs that wait on containers, workers or sleeps; a pure-Python step holds the event loop, but
such steps are the negligible ones). `rollhub bench async ENV` measures the real rollout path
and prints this prediction beside the measured ratio.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: the latency-model engine's timing of our CPU HFEngine on the tiny-5m model, 1 thread
#: (`rollhub bench fit-latency`, benchmarks/results/fit-latency.json): decode iteration seconds
#: by batch size, and prefill seconds per prompt token; the default model pace of `bench env`
FIT_TINY_CPU_ITERATION_S = ((1, 0.00683), (2, 0.00820), (4, 0.00960), (8, 0.01131), (16, 0.01554))
FIT_TINY_CPU_PREFILL_PER_TOKEN_S = 0.000118
FIT_TINY_CPU_DECODE_PER_REQUEST_S = 0.000548  # slope past the table's last batch size


def tiny_cpu_latency_params() -> Any:
    """The latency model's `LatencyParams` of our CPU HFEngine on the tiny-5m model, 1 thread."""
    from rollhub.bench.sim.latency_model import LatencyParams

    return LatencyParams(
        prefill_base_s=0.0,
        prefill_per_token_s=FIT_TINY_CPU_PREFILL_PER_TOKEN_S,
        decode_per_request_s=FIT_TINY_CPU_DECODE_PER_REQUEST_S,
        iteration_table=FIT_TINY_CPU_ITERATION_S,
        source="fit: HFEngine tiny-5m, 1 thread",
    )


def tiny_cpu_generation_s(batch: int, new_tokens: int, prompt_tokens: int = 0) -> float:
    """Seconds one turn of generation takes for `batch` concurrent requests of `new_tokens` tokens on
    the tiny CPU model, from the latency model's fit (labelled as such wherever it is used):
    the batch's prefills (they run one at a time) then `new_tokens` decode iterations."""
    params = tiny_cpu_latency_params()
    return batch * params.prefill_s(prompt_tokens) + new_tokens * params.iteration_s(batch)


def batch_times(
    episodes: list[list[float]], generation_s_per_turn: float, generations: list[list[float]] | None = None
) -> tuple[float, float, float]:
    """(lockstep, env-async, longest generation chain) seconds of one batch of episodes (see the
    module docstring). `generations`: each episode's own generation seconds per turn, instead of
    `generation_s_per_turn` for every turn; replies of unequal length then add a barrier of their
    own, since a lockstep turn also waits for the batch's longest reply."""
    steps = [e[1:] for e in episodes]
    gens = generations if generations is not None else [[generation_s_per_turn] * len(s) for s in steps]
    turns = max((len(s) for s in steps), default=0)
    lockstep = max(e[0] for e in episodes) + sum(
        max(g[t] for g, s in zip(gens, steps) if t < len(s)) + max(s[t] for s in steps if t < len(s))
        for t in range(turns)
    )
    env_async = max(e[0] + sum(g[: len(e) - 1]) + sum(e[1:]) for e, g in zip(episodes, gens))
    return lockstep, env_async, max(sum(g[: len(s)]) for g, s in zip(gens, steps))


def predicted_gain(
    episodes: list[list[float]],
    generation_s_per_turn: float,
    batch: int,
    *,
    generations: list[list[float]] | None = None,
    seed: int = 0,
    draws: int = 200,
) -> dict[str, Any]:
    """Predicted env-level async gain for batches of `batch` episodes drawn from the measured ones
    (with their own per-turn `generations` when given, see `batch_times`).

    Returns the mean predicted lockstep / env-async ratio, the Amdahl bound (lockstep / the longest
    generation chain, which no schedule shortens), and the mean share of a lockstep batch that is
    not generation; with no episodes, 1.0 (nothing to overlap)."""
    if generation_s_per_turn < 0:
        raise ValueError(f"generation_s_per_turn must be >= 0, got {generation_s_per_turn}")
    if generations is not None and len(generations) != len(episodes):
        raise ValueError("generations must list one episode's generation seconds per episode")
    pairs = [(e, generations[i] if generations is not None else None) for i, e in enumerate(episodes) if e]
    if not pairs:
        return {"predicted_gain": 1.0, "amdahl_bound": 1.0, "env_share_lockstep": 0.0}
    rng = np.random.default_rng(seed)
    gains, bounds, shares = [], [], []
    for _ in range(draws):
        chosen = [pairs[i] for i in rng.integers(len(pairs), size=batch)]
        gens = [g for _, g in chosen] if generations is not None else None
        lockstep, env_async, generation = batch_times([e for e, _ in chosen], generation_s_per_turn, gens)
        gains.append(lockstep / env_async if env_async > 0 else 1.0)
        bounds.append(lockstep / generation if generation > 0 else float("inf"))
        shares.append((lockstep - generation) / lockstep if lockstep > 0 else 0.0)
    return {
        "predicted_gain": float(np.mean(gains)),
        "amdahl_bound": float(np.mean(bounds)),
        "env_share_lockstep": float(np.mean(shares)),
    }
