"""Zero-advantage sequences: their policy-gradient term is zero, their KL and entropy terms are not.

`algorithm.drop_zero_advantage_sequences` and `drop_zero_advantage_groups` may leave such a sequence
out only while the loss has no other term: the KL anchor of a recipe that drops them must still act
on every sequence it sampled.
"""

from rollhub.rollout.types import Group, Trajectory, Turn
from rollhub.trainer.batch import AlgorithmConfig, build_training_batch
from rollhub.trainer.losses import LossConfig, policy_loss


def _trajectory(reward, seed):
    turn = Turn(
        prompt_ids=[1, 2, 3],
        response_ids=[10 + seed, 20],
        behaviour_logprobs=[-1.0, -1.5],
        token_versions=[0, 0],
        reward=reward,
        anchor=f"s{seed}",
    )
    return Trajectory(env_id="e", seed=seed, turns=[turn])


def _groups():
    signal = Group("g0", "e", 0, [_trajectory(1.0, 0), _trajectory(0.0, 1)])
    flat = Group("g1", "e", 1, [_trajectory(0.5, 2), _trajectory(0.5, 3)])  # equal rewards: A = 0
    return [signal, flat]


ALGORITHM = AlgorithmConfig(estimator="grpo", drop_zero_advantage_sequences=True)


def test_the_drop_only_applies_where_the_loss_has_no_other_term():
    batch, stats = build_training_batch(_groups(), 0, ALGORITHM, loss=LossConfig())
    assert (stats.sequences, stats.dropped_sequences) == (2, 2)
    for loss in (LossConfig(kl_coef=0.02, kl_estimator="full"), LossConfig(entropy_coef=0.01)):
        batch, stats = build_training_batch(_groups(), 0, ALGORITHM, loss=loss)
        assert (stats.sequences, stats.dropped_sequences) == (4, 0)
        assert batch is not None and len(batch) == 4


def test_the_group_drop_keeps_equal_reward_groups_for_the_kl_and_entropy_terms():
    groups_drop = AlgorithmConfig(estimator="grpo", drop_zero_advantage_groups=True)
    batch, stats = build_training_batch(_groups(), 0, groups_drop, loss=LossConfig())
    assert stats.zero_advantage_groups == 1 and len(batch) == 2  # no other term: the flat group is left out
    for loss in (LossConfig(kl_coef=0.02), LossConfig(entropy_coef=-0.01)):
        batch, stats = build_training_batch(_groups(), 0, groups_drop, loss=loss)
        assert stats.zero_advantage_groups == 1 and stats.sequences == 4
        assert len(batch) == 4 and int((batch.advantages.abs().sum(-1) == 0).sum()) == 2


def test_kept_zero_advantage_sequences_get_the_kl_gradient_but_no_policy_gradient():
    cfg = LossConfig(kl_coef=0.5, kl_estimator="k3", correction="none")
    batch, _ = build_training_batch(_groups(), 0, ALGORITHM, loss=cfg)
    flat_rows = (batch.advantages.abs().sum(-1) == 0).nonzero().flatten().tolist()
    assert len(flat_rows) == 2
    logp = batch.behaviour_logprobs.clone().double().requires_grad_(True)
    reference = logp.detach() - 0.4  # the policy drifted from the reference on every sequence
    mask = batch.response_mask.double()
    loss, _ = policy_loss(
        logp, logp.detach(), logp.detach(), batch.advantages.double(), mask, cfg, reference_logp=reference
    )
    loss.backward()
    for row in flat_rows:
        assert float(logp.grad[row][mask[row] > 0].abs().min()) > 0.0  # the KL pulls them back
    # without the KL only the signal rows have a gradient
    logp.grad = None
    loss, _ = policy_loss(
        logp, logp.detach(), logp.detach(), batch.advantages.double(), mask, LossConfig(correction="none")
    )
    loss.backward()
    assert all(float(logp.grad[row].abs().sum()) == 0.0 for row in flat_rows)
    assert float(logp.grad.abs().sum()) > 0


def test_the_learner_passes_its_loss_config():
    """The training job's learner builds its batch with the run's loss section (so a KL recipe keeps them)."""
    import inspect

    from rollhub.trainer import learner

    source = inspect.getsource(learner.PolicyLearner.step)
    assert "loss=config.loss" in source
