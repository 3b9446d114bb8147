"""From finished groups to a training batch: advantages per turn, then per token.

Trajectories that failed for infrastructure reasons (or were cancelled) are removed from
their group before any statistics are computed: a dead container is not a model failure.
Each turn's advantage is broadcast to that turn's response tokens in the packed sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from rollhub.rollout.types import Group, Trajectory, TrajectoryStatus
from rollhub.trainer.advantages import anchor_group_stats, gigpo_advantages, grpo_advantages
from rollhub.trainer.policy import TokenBatch, collate

_EXCLUDED = (TrajectoryStatus.INFRA_FAILED, TrajectoryStatus.CANCELLED)


@dataclass
class BatchStats:
    groups: int = 0
    trajectories: int = 0
    excluded_trajectories: int = 0
    zero_advantage_groups: int = 0
    sequences: int = 0
    dropped_sequences: int = 0  # zero-advantage sequences left out (drop_zero_advantage_sequences)
    singleton_anchor_fraction: float = 0.0
    mean_step_group_size: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def trainable_trajectories(group: Group) -> list[Trajectory]:
    return [t for t in group.trajectories if t.status not in _EXCLUDED and t.turns]


def turn_advantages(
    trajectories: Sequence[Trajectory],
    *,
    estimator: str,
    omega: float,
    gamma: float,
    normalize_std: bool,
    episode_baseline: str,
    invalid_action_penalty: float,
    cap_invalid_advantage: bool = True,
    episode_weight: float = 1.0,
) -> list[list[float]]:
    """One advantage per turn of each trajectory of ONE group.

    With `cap_invalid_advantage`, a turn the env rejected (malformed or illegal move, state
    unchanged) gets min(A, invalid_action_penalty): it cannot have helped, yet a rejected
    turn inside an episode that later succeeds inherits a positive episode advantage. Such
    turns are usually rare, low-probability samples, whose log-prob gradient is the largest
    in the batch, so reinforcing them is what drove the tiny Sokoban policy into bursts of
    format errors (36% of turns two steps after a grad-norm spike, docs/sokoban-rl-log.md).
    """
    rewards = [[turn.reward for turn in t.turns] for t in trajectories]
    penalties = [[(invalid_action_penalty if not turn.action_valid else 0.0) for turn in t.turns] for t in trajectories]
    if estimator == "grpo":
        totals = [sum(r) + sum(p) for r, p in zip(rewards, penalties)]
        advantages = [[a] * len(t.turns) for a, t in zip(grpo_advantages(totals, normalize_std=normalize_std), trajectories)]
    elif estimator == "gigpo":
        # a turn without an anchor can only be compared with itself
        anchors = [[turn.anchor if turn.anchor is not None else ("__no_anchor__", i, k) for k, turn in enumerate(t.turns)] for i, t in enumerate(trajectories)]
        advantages = gigpo_advantages(
            rewards, anchors, omega=omega, gamma=gamma, normalize_std=normalize_std,
            episode_baseline=episode_baseline,  # type: ignore[arg-type]
            episode_weight=episode_weight, step_penalties=penalties,
        )
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}")
    if cap_invalid_advantage:
        advantages = [[a if turn.action_valid else min(a, invalid_action_penalty) for a, turn in zip(row, t.turns)]
                      for row, t in zip(advantages, trajectories)]
    return advantages


def build_training_batch(groups: Sequence[Group], pad_token_id: int, *, drop_zero_advantage_groups: bool = False,
                         drop_zero_advantage_sequences: bool = False, **advantage_kwargs: Any) -> tuple[TokenBatch | None, BatchStats]:
    """Token batch of all trainable trajectories in `groups` (None if nothing is left).

    `drop_zero_advantage_sequences` leaves out packed sequences whose every response token
    has advantage 0: their policy-gradient term is exactly zero, yet each costs a forward
    and backward pass (with a Markov agent every turn is its own sequence, and GiGPO with
    episode_weight 0 gives 0 to every turn whose anchor-state members all returned alike).
    The aggregation then averages over the sequences that carry signal.
    """
    stats = BatchStats(groups=len(groups))
    sequences, token_advantages = [], []
    singleton_sum, size_sum, counted = 0.0, 0.0, 0
    for group in groups:
        trajectories = trainable_trajectories(group)
        stats.excluded_trajectories += len(group.trajectories) - len(trajectories)
        if not trajectories:
            continue
        per_turn = turn_advantages(trajectories, **advantage_kwargs)
        if all(abs(a) < 1e-12 for row in per_turn for a in row):
            stats.zero_advantage_groups += 1
            if drop_zero_advantage_groups:
                continue
        anchor_stats = anchor_group_stats([[turn.anchor for turn in t.turns] for t in trajectories])
        singleton_sum += anchor_stats["singleton_anchor_fraction"]
        size_sum += anchor_stats["mean_step_group_size"]
        counted += 1
        for trajectory, advantages in zip(trajectories, per_turn):
            stats.trajectories += 1
            for seq in trajectory.packed_sequences():
                row = [advantages[k] if k >= 0 else 0.0 for k in seq.turn_index]
                if drop_zero_advantage_sequences and all(abs(a) < 1e-12 for a in row):
                    stats.dropped_sequences += 1
                    continue
                sequences.append(seq)
                token_advantages.append(row)
    stats.sequences = len(sequences)
    if counted:
        stats.singleton_anchor_fraction = singleton_sum / counted
        stats.mean_step_group_size = size_sum / counted
    if not sequences:
        return None, stats
    return collate(sequences, token_advantages, pad_token_id), stats
