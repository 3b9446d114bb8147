"""GRPO / GiGPO advantages against hand-computed values (algorithms.md §1-2)."""

import math

import pytest

from rollhub.trainer.advantages import anchor_group_stats, discounted_step_returns, gigpo_advantages, grpo_advantages


def test_grpo_mean_only():
    assert grpo_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_grpo_std_uses_bessel():
    adv = grpo_advantages([10.0, 10.0, 0.0, 0.0], normalize_std=True)
    std = math.sqrt(100 / 3)  # unbiased std of (10, 10, 0, 0) = 5.774
    assert adv == pytest.approx([5 / std, 5 / std, -5 / std, -5 / std], rel=1e-5)
    assert adv[0] == pytest.approx(0.866, abs=1e-3)


def test_grpo_all_equal_rewards_give_zero():
    assert grpo_advantages([3.0, 3.0, 3.0], normalize_std=True) == [0.0, 0.0, 0.0]


def test_grpo_singleton_group_keeps_reward():
    assert grpo_advantages([2.5]) == [2.5]


def test_discounted_returns_backwards():
    assert discounted_step_returns([0.0, 0.0, 10.0], 0.95) == pytest.approx([9.025, 9.5, 10.0])


def _worked_example():
    """algorithms.md §2.2: tau1 wins at step 3, tau2 at step 5, tau3/tau4 fail at 50 steps."""
    lengths = [3, 5, 50, 50]
    rewards = []
    anchors = []
    for i, n in enumerate(lengths):
        r = [0.0] * n
        if i < 2:
            r[-1] = 10.0
        rewards.append(r)
        anchors.append(["start"] + [f"t{i}-s{t}" for t in range(1, n)])  # only the first state is shared
    return rewards, anchors


def test_gigpo_worked_example_paper_baseline():
    rewards, anchors = _worked_example()
    adv = gigpo_advantages(rewards, anchors, omega=1.0, gamma=0.95)
    assert [a[0] for a in adv] == pytest.approx([9.7325, 8.8525, -9.2925, -9.2925], abs=1e-4)
    # later steps have singleton anchors: only the episode advantage remains
    assert adv[0][1] == pytest.approx(5.0)
    assert adv[3][10] == pytest.approx(-5.0)


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_gigpo_episode_weight_scales_only_the_episode_term(weight):
    rewards, anchors = _worked_example()
    adv = gigpo_advantages(rewards, anchors, omega=1.0, gamma=0.95, episode_weight=weight)
    # shared first state: weight * A^E (+-5) + A^S (4.7325, 3.8525, -4.2925, -4.2925)
    assert [a[0] for a in adv] == pytest.approx(
        [weight * 5 + 4.7325, weight * 5 + 3.8525, -weight * 5 - 4.2925, -weight * 5 - 4.2925], abs=1e-4
    )
    assert adv[0][1] == pytest.approx(weight * 5.0)  # singleton anchor: the episode term alone


def test_gigpo_worked_example_step_weighted():
    rewards, anchors = _worked_example()
    adv = gigpo_advantages(rewards, anchors, episode_baseline="step_weighted")
    mean = 80 / 108
    assert adv[0][1] == pytest.approx(10 - mean)
    assert adv[2][5] == pytest.approx(-mean)
    with_std = gigpo_advantages(rewards, anchors, episode_baseline="step_weighted", normalize_std=True)
    assert with_std[0][2] == pytest.approx(3.52, abs=0.01)
    assert with_std[2][7] == pytest.approx(-0.28, abs=0.01)


def test_gigpo_without_repeated_states_equals_grpo():
    rewards = [[0.0, 1.0], [0.0, 0.0, 0.0], [1.0]]
    anchors = [["a", "b"], ["c", "d", "e"], ["f"]]
    adv = gigpo_advantages(rewards, anchors, normalize_std=True)
    episode = grpo_advantages([1.0, 0.0, 1.0], normalize_std=True)
    for row, e in zip(adv, episode):
        assert row == pytest.approx([e] * len(row))


def test_gigpo_repeats_inside_one_trajectory_each_count():
    # trajectory 0 visits "x" twice (returns 0.5 and 1.0 with gamma .5), trajectory 1 once (0.0)
    rewards = [[0.0, 1.0], [0.0]]
    anchors = [["x", "x"], ["x"]]
    adv = gigpo_advantages(rewards, anchors, gamma=0.5, omega=1.0)
    step_mean = (0.5 + 1.0 + 0.0) / 3
    assert adv[0] == pytest.approx([0.5 + 0.5 - step_mean, 0.5 + 1.0 - step_mean])
    assert adv[1] == pytest.approx([-0.5 + 0.0 - step_mean])


def test_gigpo_truncated_trajectory_has_no_bootstrap():
    rewards = [[-0.1, -0.1], [-0.1, 1.0]]  # first is cut by the step limit
    anchors = [["s0", "s1"], ["s0", "s2"]]
    adv = gigpo_advantages(rewards, anchors, gamma=1.0, omega=0.5)
    # step returns at s0: -0.2 and 0.9 -> mean 0.35; episode returns -0.2 and 0.9 -> mean 0.35
    assert adv[0][0] == pytest.approx(-0.55 + 0.5 * -0.55)
    assert adv[0][1] == pytest.approx(-0.55)
    assert adv[1][0] == pytest.approx(0.55 + 0.5 * 0.55)


def test_gigpo_penalty_is_not_discounted_backwards():
    rewards = [[0.0, 0.0], [0.0, 0.0]]
    anchors = [["s", "a"], ["s", "b"]]
    penalties = [[0.0, -0.1], [0.0, 0.0]]
    adv = gigpo_advantages(rewards, anchors, step_penalties=penalties)
    # episode: -0.1 vs 0 -> +-0.05; step at "s": returns equal (penalty not propagated) -> 0
    assert adv[0][0] == pytest.approx(-0.05)
    assert adv[1][0] == pytest.approx(0.05)


def test_gigpo_validates_shapes():
    with pytest.raises(ValueError):
        gigpo_advantages([[1.0]], [["a", "b"]])


def test_anchor_stats():
    stats = anchor_group_stats([["a", "b"], ["a", "c"]])
    assert stats["singleton_anchor_fraction"] == pytest.approx(2 / 4)
    assert stats["mean_step_group_size"] == pytest.approx(4 / 3)
