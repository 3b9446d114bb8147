"""`policy_update(normaliser=...)`: a data-parallel rank's loss is divided by the counts of the whole step."""

import pytest
import torch

from rollhub.trainer.losses import BatchNormaliser, LossConfig
from rollhub.trainer.policy import Policy, TokenBatch
from rollhub.trainer.update import policy_update, ppo_update


def _batch(rows: int = 4, width: int = 12) -> TokenBatch:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 200, (rows, width), generator=generator)
    attention = torch.ones(rows, width, dtype=torch.long)
    response = torch.zeros(rows, width)
    response[:, width // 2 :] = 1.0
    advantages = torch.linspace(-1.0, 1.0, rows).unsqueeze(1) * response
    return TokenBatch(
        input_ids, attention, response, torch.full((rows, width), -3.0), advantages, torch.zeros_like(input_ids)
    )


def _grad(policy: Policy) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])


def test_a_given_normaliser_replaces_the_local_counts(tiny_model_dir):
    """Twice the tokens in the denominator (a second rank with as many) halves the local gradient."""
    batch = _batch()
    grads = []
    for normaliser in (None, BatchNormaliser(float(batch.response_mask.sum()) * 2, len(batch) * 2.0)):
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)
        policy_update(policy, optimizer, batch, None, LossConfig(), max_grad_norm=None, normaliser=normaliser)
        grads.append(_grad(policy))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], 2 * grads[1], atol=1e-7, rtol=1e-5)


def test_ppo_update_takes_a_normaliser_function_per_minibatch(tiny_model_dir):
    batch = _batch()
    seen = []

    def per_part(part: TokenBatch) -> BatchNormaliser:
        seen.append(len(part))
        return BatchNormaliser.from_mask(part.response_mask)

    policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)
    ppo_update(policy, optimizer, batch, LossConfig(), minibatches=2, normaliser=per_part)
    assert seen == [2, 2]
    with pytest.raises(ValueError, match="covers one part"):
        ppo_update(policy, optimizer, batch, LossConfig(), minibatches=2, normaliser=BatchNormaliser(1.0, 1.0))


@pytest.mark.parametrize(
    ("proximal", "minibatches", "pack_tokens", "ranks", "source"),
    [
        ("behaviour", 2, 64, False, "behaviour"),
        ("behaviour", 1, None, True, "behaviour"),
        ("recompute", 1, 64, False, "update"),
        ("recompute", 1, None, True, "update"),
        ("recompute", 2, None, False, "recompute"),
        ("recompute", 2, 64, False, "first_minibatch"),
        ("recompute", 2, 64, True, "recompute"),  # a rank's first forward holds only its shard
    ],
)
def test_the_step_plan_decides_the_proximal_source_once(proximal, minibatches, pack_tokens, ranks, source):
    from rollhub.trainer.update import plan_step, proximal_logprobs

    batch = _batch(rows=6)
    plan = plan_step(
        batch, LossConfig(proximal=proximal), minibatches=minibatches, seed=1, pack_tokens=pack_tokens, ranks=ranks
    )
    assert plan.proximal == source
    assert sorted(torch.cat(plan.parts).tolist()) == list(range(6))  # one epoch: every row once
    assert len(plan.micro_batches) == len(plan.parts)
    calls = []

    def recompute(rows: TokenBatch) -> torch.Tensor:
        calls.append(len(rows))
        return torch.full(rows.input_ids.shape, -1.0)

    prox = proximal_logprobs(plan, batch, recompute)
    if source == "behaviour":
        assert calls == [] and torch.equal(prox, batch.behaviour_logprobs * batch.response_mask)
    elif source == "update":
        assert calls == [] and prox is None
    elif source == "recompute":
        assert calls == [6] and bool((prox == -1.0).all())
    else:  # the first mini-batch's rows come from its own update's forward
        first = plan.parts[0]
        assert calls == [6 - len(first)] and bool((prox[first] == 0).all())


def test_the_plan_micro_batches_are_those_the_update_would_plan():
    from rollhub.trainer.packing import sequence_lengths
    from rollhub.trainer.update import micro_batch_rows, plan_step

    batch = _batch(rows=7)
    for pack_tokens in (None, 30):
        plan = plan_step(batch, LossConfig(), minibatches=3, seed=2, pack_tokens=pack_tokens, micro_batch_size=2)
        for rows, micro in zip(plan.parts, plan.micro_batches):
            part = batch.select(rows)
            assert micro == micro_batch_rows(sequence_lengths(part.attention_mask), pack_tokens, 2)
    with pytest.raises(ValueError, match="minibatches"):
        plan_step(batch, LossConfig(), minibatches=0)
