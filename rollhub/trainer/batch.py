"""From finished groups to a training batch: advantages per turn, then per token.

Trajectories that failed for infrastructure reasons (or were cancelled) are removed from
their group before any statistics are computed: a dead container is not a model failure,
so it is never scored as 0 and never moves the baseline of the others (the rule that tells
the two apart is in rollhub.rollout.types). A group left with a single scored member has
no baseline at all and is skipped. Model failures are ordinary scored members.
Each turn's advantage is broadcast to that turn's response tokens in the packed sequences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rollhub.rollout.types import Group, Trajectory
from rollhub.trainer.advantages import anchor_group_stats, gigpo_advantages, grpo_advantages
from rollhub.trainer.losses import LossConfig
from rollhub.trainer.policy import TokenBatch, collate


@dataclass
class BatchStats:
    groups: int = 0
    trajectories: int = 0
    excluded_trajectories: int = 0
    # groups that lost all but one member to infra failures: no baseline, so not trained on
    groups_without_baseline: int = 0
    zero_advantage_groups: int = 0
    sequences: int = 0
    dropped_sequences: int = 0  # zero-advantage sequences left out (drop_zero_advantage_sequences)
    singleton_anchor_fraction: float = 0.0
    mean_step_group_size: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class AlgorithmConfig:
    """`algorithm:` section: how rewards become per-token advantages."""

    estimator: Literal["gigpo", "grpo"] = "gigpo"  # grpo: returns within a group; gigpo adds anchor-state groups
    omega: float = 1.0  # GiGPO step-advantage weight
    episode_weight: float = 1.0  # GiGPO episode-advantage weight (ROLL's episode_reward_weight)
    gamma: float = 0.95  # GiGPO step-return discount
    normalize_std: bool = False  # divide advantages by their group's std (+eps) at every level
    # GiGPO episode statistics per trajectory, or per step row (which weights long episodes more)
    episode_baseline: Literal["trajectory", "step_weighted"] = "trajectory"
    invalid_action_penalty: float = 0.0  # extra penalty (<= 0) on turns the env rejected
    # DAPO-style filter of groups with equal rewards (all advantages 0); like the sequence drop below,
    # only while the loss has no KL or entropy term, which those sequences still carry
    drop_zero_advantage_groups: bool = False
    # skip sequences whose tokens all have A = 0 (no policy gradient, full cost); only while the loss has
    # no KL or entropy term, which such a sequence still carries (see build_training_batch)
    drop_zero_advantage_sequences: bool = False
    # a turn the env rejected gets min(A, invalid_action_penalty): never reinforced (see turn_advantages)
    cap_invalid_advantage: bool = True
    # a turn whose own env reward falls short of turn_bar gets turn_bar_weight * (reward - turn_bar)
    # added to its advantage, whatever the rest of its group did (see turn_advantages); 0 = off
    turn_bar_weight: float = 0.0
    turn_bar: float = 0.0  # the bar b of turn_bar_weight: a turn's own reward below it is marked

    def validate(self) -> None:
        # written `not (in range)` so that nan fails too (the loader refuses it; direct construction does not)
        if not self.invalid_action_penalty <= 0:
            raise ValueError(
                f"invalid_action_penalty is a penalty: use a value <= 0, got {self.invalid_action_penalty}"
            )
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not (self.episode_weight >= 0 and self.omega >= 0):
            raise ValueError("algorithm.episode_weight and algorithm.omega must be >= 0")
        if not (self.turn_bar_weight >= 0 and math.isfinite(self.turn_bar_weight)):
            raise ValueError(
                f"algorithm.turn_bar_weight must be a finite value >= 0 (0 = off), got {self.turn_bar_weight}"
            )
        if not math.isfinite(self.turn_bar):
            raise ValueError(f"algorithm.turn_bar must be finite, got {self.turn_bar}")


def trainable_trajectories(group: Group) -> list[Trajectory]:
    """The members that enter the group statistics: scored (not infra-failed, not cancelled), with turns."""
    return [t for t in group.trajectories if t.scored and t.turns]


def baseline_members(group: Group) -> list[Trajectory]:
    """`trainable_trajectories`, or [] when exclusions left one member of a larger group.

    A lone survivor would be compared with nothing (GRPO then gives A = R, as for a
    configured group of one), which rewards whatever it did; it carries no relative signal.
    """
    members = trainable_trajectories(group)
    if len(members) == 1 and len(group.trajectories) > 1:
        return []
    return members


def batch_failed(groups: Sequence[Group], stats: BatchStats) -> bool:
    """Every trajectory of the batch failed: none succeeded, and no group gave an advantage signal
    (each was all infra failures, lost its baseline, or scored all its members alike)."""
    if any(t.success for group in groups for t in trainable_trajectories(group)):
        return False
    unscored = sum(1 for group in groups if not trainable_trajectories(group))
    return unscored + stats.groups_without_baseline + stats.zero_advantage_groups >= len(groups)


def turn_advantages(trajectories: Sequence[Trajectory], algorithm: AlgorithmConfig) -> list[list[float]]:
    """One advantage per turn of each trajectory of ONE group.

    With `algorithm.cap_invalid_advantage`, a turn the env rejected (malformed or illegal move, state
    unchanged) gets min(A, invalid_action_penalty): it cannot have helped, yet a rejected
    turn inside an episode that later succeeds inherits a positive episode advantage. Such
    turns are usually rare, low-probability samples, whose log-prob gradient is the largest
    in the batch, so reinforcing them drives a small policy into bursts of format errors.

    With `algorithm.turn_bar_weight` (w > 0), every turn whose own reward r is below
    `algorithm.turn_bar` (b) also gets w * (r - b): REINFORCE on the turn's immediate reward
    with the constant baseline b, counting only shortfalls. The group-relative estimators
    see nothing where every sample of a group made the same move, and a confident policy's
    remaining mistakes are exactly those (all samples take the same wrong turn); a dense
    per-turn reward (e.g. Sokoban's `progress_reward`, b = its per-move value) still marks
    them. Turns at or above the bar get nothing, so their sequences keep advantage 0 and
    `drop_zero_advantage_sequences` still skips them.
    """
    rewards = [[turn.reward for turn in t.turns] for t in trajectories]
    penalties = [
        [(algorithm.invalid_action_penalty if not turn.action_valid else 0.0) for turn in t.turns] for t in trajectories
    ]
    if algorithm.estimator == "grpo":
        totals = [sum(r) + sum(p) for r, p in zip(rewards, penalties)]
        advantages = [
            [a] * len(t.turns)
            for a, t in zip(grpo_advantages(totals, normalize_std=algorithm.normalize_std), trajectories)
        ]
    elif algorithm.estimator == "gigpo":
        # a turn without an anchor can only be compared with itself
        anchors = [
            [turn.anchor if turn.anchor is not None else ("__no_anchor__", i, k) for k, turn in enumerate(t.turns)]
            for i, t in enumerate(trajectories)
        ]
        advantages = gigpo_advantages(
            rewards,
            anchors,
            omega=algorithm.omega,
            gamma=algorithm.gamma,
            normalize_std=algorithm.normalize_std,
            episode_baseline=algorithm.episode_baseline,  # type: ignore[arg-type]
            episode_weight=algorithm.episode_weight,
            step_penalties=penalties,
        )
    else:
        raise ValueError(f"unknown advantage estimator {algorithm.estimator!r}")
    if algorithm.turn_bar_weight > 0:
        weight, bar = algorithm.turn_bar_weight, algorithm.turn_bar
        advantages = [
            [a + weight * min(0.0, reward - bar) for a, reward in zip(row, row_rewards)]
            for row, row_rewards in zip(advantages, rewards)
        ]
    if algorithm.cap_invalid_advantage:
        advantages = [
            [a if turn.action_valid else min(a, algorithm.invalid_action_penalty) for a, turn in zip(row, t.turns)]
            for row, t in zip(advantages, trajectories)
        ]
    return advantages


def build_training_batch(
    groups: Sequence[Group], pad_token_id: int, algorithm: AlgorithmConfig, *, loss: LossConfig | None = None
) -> tuple[TokenBatch | None, BatchStats]:
    """Token batch of all trainable trajectories in `groups` (None if nothing is left).

    `algorithm.drop_zero_advantage_sequences` leaves out packed sequences whose every response token
    has advantage 0: their policy-gradient term is exactly zero, yet each costs a forward
    and backward pass (with a Markov agent every turn is its own sequence, and GiGPO with
    episode_weight 0 gives 0 to every turn whose anchor-state members all returned alike).
    The aggregation then averages over the sequences that carry signal. Only the policy-gradient
    term is zero, though: where `loss` has a KL or entropy term they are kept, so that the KL
    anchor holds every sequence the policy sampled, not only the ones with signal (and the
    aggregation is over all of them, as without the drop). `algorithm.drop_zero_advantage_groups`
    follows the same rule: a group whose members all scored alike is left out only while the loss
    has no other term (it is still counted in `zero_advantage_groups`). `loss` None: a
    policy-gradient-only loss.
    """
    other_terms = loss is not None and loss.has_other_terms
    drop_zero = algorithm.drop_zero_advantage_sequences and not other_terms
    stats = BatchStats(groups=len(groups))
    sequences, token_advantages = [], []
    singleton_sum, size_sum, counted = 0.0, 0.0, 0
    for group in groups:
        trajectories = baseline_members(group)
        stats.excluded_trajectories += len(group.trajectories) - len(trajectories)
        if not trajectories:
            stats.groups_without_baseline += int(bool(trainable_trajectories(group)))
            continue
        per_turn = turn_advantages(trajectories, algorithm)
        if all(abs(a) < 1e-12 for row in per_turn for a in row):
            stats.zero_advantage_groups += 1
            if algorithm.drop_zero_advantage_groups and not other_terms:
                continue
        anchor_stats = anchor_group_stats([[turn.anchor for turn in t.turns] for t in trajectories])
        singleton_sum += anchor_stats["singleton_anchor_fraction"]
        size_sum += anchor_stats["mean_step_group_size"]
        counted += 1
        for trajectory, advantages in zip(trajectories, per_turn):
            stats.trajectories += 1
            for seq in trajectory.packed_sequences():
                row = [advantages[k] if k >= 0 else 0.0 for k in seq.turn_index]
                if drop_zero and all(abs(a) < 1e-12 for a in row):
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
