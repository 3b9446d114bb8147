"""Group-relative advantages: GRPO and GiGPO, as pure functions over plain numbers.

Both estimators need no critic: a trajectory is judged against the other members of its
group (same task, same seed). GiGPO adds a second, finer comparison: steps taken from the
same environment state (the env's history-free `anchor`) are judged against each other by
their discounted return, which gives credit to individual turns of a long episode.

Formulas and defaults: GRPO (arXiv 2402.03300, sec. 4.1) and GiGPO (arXiv 2505.10978,
sec. 3). Everything here is computed before any batch padding, so padded
or duplicated rows can never leak into the group statistics.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

EpisodeBaseline = Literal["trajectory", "step_weighted"]


def _mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and unbiased (Bessel) standard deviation; std of a single value is 1.

    A one-member group has no spread to normalise by; using 1 (as torch.std's reference
    implementations effectively do after their NaN guard) leaves its advantage unscaled.
    """
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 1.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance)


def _normalise(values: Sequence[float], *, normalize_std: bool, eps: float, singleton_mean_zero: bool) -> list[float]:
    if not values:
        return []
    if len(values) == 1 and singleton_mean_zero:
        mean, std = 0.0, 1.0
    else:
        mean, std = _mean_and_std(values)
    scale = (std + eps) if normalize_std else 1.0
    return [(v - mean) / scale for v in values]


def grpo_advantages(rewards: Sequence[float], *, normalize_std: bool = False, eps: float = 1e-6) -> list[float]:
    """A_i = (R_i - mean_j R_j) / F, with F = std_j R_j + eps when `normalize_std`, else 1.

    `rewards` are the total rewards of one group's trajectories. A one-member group gets
    mean 0 (so A = R), matching the reference implementation; equal rewards give A = 0.
    """
    return _normalise(list(rewards), normalize_std=normalize_std, eps=eps, singleton_mean_zero=True)


def discounted_step_returns(step_rewards: Sequence[float], gamma: float) -> list[float]:
    """R_t = sum_{k>=t} gamma^(k-t) r_k, computed backwards. No bootstrap: a truncated
    episode simply has no reward after its last step."""
    returns = [0.0] * len(step_rewards)
    running = 0.0
    for t in range(len(step_rewards) - 1, -1, -1):
        running = step_rewards[t] + gamma * running
        returns[t] = running
    return returns


def gigpo_advantages(
    step_rewards: Sequence[Sequence[float]],
    anchors: Sequence[Sequence[Hashable]],
    *,
    omega: float = 1.0,
    gamma: float = 0.95,
    normalize_std: bool = False,
    episode_baseline: EpisodeBaseline = "trajectory",
    episode_weight: float = 1.0,
    step_penalties: Sequence[Sequence[float]] | None = None,
    eps: float = 1e-6,
) -> list[list[float]]:
    """GiGPO advantages for one group: A(a_t^i) = w_E * A^E(tau_i) + omega * A^S(a_t^i).

    Args:
        step_rewards: per trajectory, the env reward of each step (turn).
        anchors: per trajectory, the history-free state key each step was taken from.
        omega: weight of the step-level advantage (paper: 1).
        gamma: discount of the step returns that anchor groups compare (paper: 0.95).
        normalize_std: divide by group std (+eps) at both levels ("GiGPO w/ std").
        episode_baseline: "trajectory" = mean/std over the N trajectories (paper Eq. 3);
            "step_weighted" = one value per step row (verl-agent parity), which weights
            the statistics by episode length.
        episode_weight: w_E, the weight of the episode-level term (paper: 1; ROLL's
            `episode_reward_weight`). A^E gives every turn of a trajectory the same credit,
            so in long episodes with a dense per-step reward it is mostly noise for the
            individual turns; 0 keeps only the anchor-state comparison.
        step_penalties: optional per-step penalties (e.g. -0.1 for an invalid action)
            added to the episode return and to that step's own return only, never
            discounted back into earlier steps.

    Returns, per trajectory, one advantage per step. Steps whose anchor occurs once in
    the group get A^S = 0; with no repeated states GiGPO reduces to GRPO.
    """
    if len(step_rewards) != len(anchors):
        raise ValueError(f"{len(step_rewards)} reward lists but {len(anchors)} anchor lists")
    for i, (rewards, keys) in enumerate(zip(step_rewards, anchors)):
        if len(rewards) != len(keys):
            raise ValueError(f"trajectory {i}: {len(rewards)} rewards but {len(keys)} anchors")
    if episode_baseline not in ("trajectory", "step_weighted"):
        raise ValueError(f"episode_baseline must be 'trajectory' or 'step_weighted', got {episode_baseline!r}")
    penalties = step_penalties or [[0.0] * len(r) for r in step_rewards]

    episode_returns = [sum(r) + sum(p) for r, p in zip(step_rewards, penalties)]
    if episode_baseline == "trajectory":
        episode_adv = _normalise(episode_returns, normalize_std=normalize_std, eps=eps, singleton_mean_zero=True)
        per_step_episode_adv = [[a] * len(r) for a, r in zip(episode_adv, step_rewards)]
    else:
        rows = [ret for ret, r in zip(episode_returns, step_rewards) for _ in r]
        flat = _normalise(rows, normalize_std=normalize_std, eps=eps, singleton_mean_zero=True)
        per_step_episode_adv, offset = [], 0
        for r in step_rewards:
            per_step_episode_adv.append(flat[offset : offset + len(r)])
            offset += len(r)

    step_returns = [
        [ret + pen for ret, pen in zip(discounted_step_returns(r, gamma), p)] for r, p in zip(step_rewards, penalties)
    ]
    buckets: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, keys in enumerate(anchors):
        for t, key in enumerate(keys):
            buckets[key].append((i, t))
    step_adv = [[0.0] * len(r) for r in step_rewards]
    for members in buckets.values():
        if len(members) < 2:
            continue  # singleton anchor group: nothing to compare against
        values = [step_returns[i][t] for i, t in members]
        for (i, t), adv in zip(
            members, _normalise(values, normalize_std=normalize_std, eps=eps, singleton_mean_zero=False)
        ):
            step_adv[i][t] = adv

    return [
        [episode_weight * e + omega * s for e, s in zip(ep_row, st_row)]
        for ep_row, st_row in zip(per_step_episode_adv, step_adv)
    ]


def anchor_group_stats(anchors: Sequence[Sequence[Hashable]]) -> dict[str, float]:
    """Singleton-anchor fraction and mean step-group size of one group (for logging)."""
    counts: dict[Hashable, int] = defaultdict(int)
    for keys in anchors:
        for key in keys:
            counts[key] += 1
    total_steps = sum(counts.values())
    if not total_steps:
        return {"singleton_anchor_fraction": 0.0, "mean_step_group_size": 0.0}
    singletons = sum(1 for c in counts.values() if c == 1)
    return {
        "singleton_anchor_fraction": singletons / total_steps,
        "mean_step_group_size": total_steps / len(counts),
    }
