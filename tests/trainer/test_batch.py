"""Groups -> token batch: advantages land on the right response tokens; infra failures are excluded."""

import pytest

from rollhub.rollout.types import Group, Trajectory, TrajectoryStatus, Turn
from rollhub.trainer.batch import AlgorithmConfig, build_training_batch


def _batch(groups, **algorithm):
    return build_training_batch(groups, 0, AlgorithmConfig(**algorithm))


def _turn(prompt, response, reward, anchor, valid=True):
    return Turn(
        prompt_ids=prompt,
        response_ids=response,
        behaviour_logprobs=[-1.0] * len(response),
        token_versions=[0] * len(response),
        reward=reward,
        anchor=anchor,
        action_valid=valid,
    )


def _trajectory(rewards, anchors, status=TrajectoryStatus.COMPLETED):
    turns, prompt = [], [1, 2]
    for k, (r, a) in enumerate(zip(rewards, anchors)):
        response = [10 + k, 20 + k]
        turns.append(_turn(list(prompt), response, r, a))
        prompt = prompt + response + [3]  # full history: the next prompt extends this one
    return Trajectory(env_id="e", seed=0, turns=turns, status=status)


def test_gigpo_batch_broadcasts_turn_advantages():
    group = Group("g", "e", 0, [_trajectory([0.0, 1.0], ["s", "t"]), _trajectory([0.0, 0.0], ["s", "u"])])
    batch, stats = _batch(
        [group],
        estimator="gigpo",
        omega=1.0,
        gamma=1.0,
        normalize_std=False,
        episode_baseline="trajectory",
        invalid_action_penalty=0.0,
    )
    assert stats.sequences == 2 and stats.trajectories == 2
    # trajectory 0: episode +0.5; at anchor "s" returns 1 vs 0 -> +0.5; so turn 0 gets 1.0, turn 1 gets 0.5
    row = batch.advantages[0][batch.response_mask[0] > 0].tolist()
    assert row == pytest.approx([1.0, 1.0, 0.5, 0.5])
    assert batch.advantages[1][batch.response_mask[1] > 0].tolist() == pytest.approx([-1.0, -1.0, -0.5, -0.5])
    assert float(batch.advantages[batch.response_mask == 0].abs().sum()) == 0.0
    assert stats.singleton_anchor_fraction == pytest.approx(2 / 4)


def test_infra_failures_are_not_scored_and_equal_groups_can_be_dropped():
    failed = _trajectory([0.0], ["s"], status=TrajectoryStatus.INFRA_FAILED)
    group = Group("g", "e", 0, [_trajectory([1.0], ["s"]), _trajectory([0.0], ["s"]), failed])
    batch, stats = _batch(
        [group],
        estimator="grpo",
        omega=1.0,
        gamma=1.0,
        normalize_std=False,
        episode_baseline="trajectory",
        invalid_action_penalty=0.0,
    )
    assert stats.excluded_trajectories == 1 and len(batch) == 2
    assert batch.advantages[0][batch.response_mask[0] > 0].tolist() == pytest.approx([0.5, 0.5])
    flat = Group("f", "e", 1, [_trajectory([1.0], ["s"]), _trajectory([1.0], ["s"])])
    batch, stats = _batch(
        [flat],
        drop_zero_advantage_groups=True,
        estimator="grpo",
        omega=1.0,
        gamma=1.0,
        normalize_std=False,
        episode_baseline="trajectory",
        invalid_action_penalty=0.0,
    )
    assert batch is None and stats.zero_advantage_groups == 1


def test_invalid_action_penalty_lowers_that_trajectory():
    group = Group("g", "e", 0, [_trajectory([0.0], ["s"]), _trajectory([0.0], ["t"])])
    group.trajectories[0].turns[0].action_valid = False
    batch, _ = _batch(
        [group],
        estimator="grpo",
        omega=1.0,
        gamma=1.0,
        normalize_std=False,
        episode_baseline="trajectory",
        invalid_action_penalty=-0.2,
        cap_invalid_advantage=False,
    )
    assert batch.advantages[0][batch.response_mask[0] > 0].tolist() == pytest.approx([-0.1, -0.1])


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_rejected_turn_of_a_winning_episode_is_never_reinforced(estimator):
    # trajectory 0 wins after a rejected first turn: its episode advantage is positive
    winner, loser = _trajectory([0.0, 1.0], ["s", "s"]), _trajectory([0.0, 0.0], ["s", "u"])
    winner.turns[0].action_valid = False
    kwargs = dict(
        estimator=estimator,
        omega=1.0,
        gamma=1.0,
        normalize_std=False,
        episode_baseline="trajectory",
        invalid_action_penalty=-0.1,
    )
    uncapped, _ = _batch([Group("g", "e", 0, [winner, loser])], cap_invalid_advantage=False, **kwargs)
    capped, _ = _batch([Group("g", "e", 0, [winner, loser])], **kwargs)
    first_turn = lambda b: b.advantages[0][b.response_mask[0] > 0].tolist()[:2]  # noqa: E731 - two tokens of turn 0
    second_turn = lambda b: b.advantages[0][b.response_mask[0] > 0].tolist()[2:]  # noqa: E731
    assert min(first_turn(uncapped)) > 0  # the rejected turn inherits the win
    assert first_turn(capped) == pytest.approx([-0.1, -0.1])  # min(A, penalty)
    assert second_turn(capped) == pytest.approx(second_turn(uncapped))  # valid turns untouched


def test_zero_advantage_sequences_can_be_dropped():
    # anchor "s" shared: returns 1 vs 0 -> +-0.5; "v" is a singleton anchor -> 0 with episode_weight 0
    group = Group(
        "g",
        "e",
        0,
        [_trajectory([1.0, 0.0], ["s", "t"]), _trajectory([0.0, 0.0], ["s", "u"]), _trajectory([0.0], ["v"])],
    )
    kwargs = dict(
        estimator="gigpo",
        omega=1.0,
        gamma=1.0,
        normalize_std=False,
        episode_baseline="trajectory",
        invalid_action_penalty=0.0,
        episode_weight=0.0,
    )
    full, stats = _batch([group], **kwargs)
    assert stats.dropped_sequences == 0 and len(full) == 3
    kept, stats = _batch([group], drop_zero_advantage_sequences=True, **kwargs)
    assert stats.dropped_sequences == 1 and len(kept) == 2  # the third trajectory carries no gradient
    assert kept.advantages[0][kept.response_mask[0] > 0].tolist()[:2] == pytest.approx([0.5, 0.5])
    assert kept.advantages[1][kept.response_mask[1] > 0].tolist()[:2] == pytest.approx([-0.5, -0.5])


def test_turn_bar_marks_a_wrong_move_that_every_sample_of_the_group_made():
    # both samples walk away from the goal (-0.3) and then step back (+0.3) along the same anchors:
    # GiGPO compares equal returns only, so without the bar the group carries no signal at all
    def walker():
        return _trajectory([-0.3, 0.3], ["s", "t"])

    common = dict(estimator="gigpo", omega=1.0, gamma=0.9, episode_weight=0.0, drop_zero_advantage_groups=True)
    batch, stats = _batch([Group("g", "e", 0, [walker(), walker()])], **common)
    assert batch is None and stats.zero_advantage_groups == 1
    batch, _ = _batch([Group("g", "e", 0, [walker(), walker()])], turn_bar_weight=1.0, turn_bar=0.3, **common)
    for row in range(2):
        advantages = batch.advantages[row][batch.response_mask[row] > 0].tolist()
        # the step away falls 0.6 short of the bar; the step back meets it and stays at 0
        assert advantages == pytest.approx([-0.6, -0.6, 0.0, 0.0])


def test_turn_bar_leaves_turns_at_or_above_it_and_adds_to_group_advantages():
    winner, loser = _trajectory([0.3, 1.3], ["s", "t"]), _trajectory([-0.3, 0.0], ["s", "u"])
    kwargs = dict(estimator="gigpo", omega=1.0, gamma=1.0, episode_weight=0.0)
    plain = _batch([Group("g", "e", 0, [winner, loser])], **kwargs)[0]
    barred = _batch([Group("g", "e", 0, [winner, loser])], turn_bar_weight=0.5, turn_bar=0.3, **kwargs)[0]
    shift = (barred.advantages - plain.advantages)[barred.response_mask > 0].tolist()
    # winner: both turns reach the bar; loser: -0.3 and 0.0 fall 0.6 and 0.3 short, weighted 0.5
    assert shift == pytest.approx([0.0, 0.0, 0.0, 0.0, -0.3, -0.3, -0.15, -0.15])


@pytest.mark.parametrize("weight", [-0.1, float("nan"), float("inf")])
def test_turn_bar_weight_must_be_finite_and_non_negative(weight):
    with pytest.raises(ValueError, match="turn_bar_weight"):
        AlgorithmConfig(turn_bar_weight=weight).validate()
