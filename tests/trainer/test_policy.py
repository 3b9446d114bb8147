"""Policy log-probs agree with the engine's, micro-batching is exact, checkpoints round-trip."""

import asyncio

import pytest
import torch

from rollhub.inference.engines.base import SamplingParams
from rollhub.rollout.types import Trajectory, Turn
from rollhub.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rollhub.trainer.losses import LossConfig
from rollhub.trainer.policy import Policy, collate
from rollhub.trainer.update import policy_update


async def _sample_trajectories(model_dir, temperature, n=3):
    from rollhub.inference.engines.hf import HFEngine

    engine = HFEngine(model_dir, threads=1, max_batch_size=4, seed=1)
    tok = engine.tokenizer
    trajectories = []
    try:
        for i in range(n):
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": f"push the box {i}"}], add_generation_prompt=True, tokenize=True
            )
            prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
            turns = []
            ids = list(prompt)
            for _ in range(2):  # two turns with the full history, so packing merges them
                gen = await engine.generate(ids, SamplingParams(max_new_tokens=6 + i, temperature=temperature))
                turns.append(
                    Turn(
                        prompt_ids=list(ids),
                        response_ids=gen.token_ids,
                        behaviour_logprobs=gen.logprobs,
                        token_versions=gen.token_versions,
                    )
                )
                ids = ids + gen.token_ids + tok.encode("\nok\n")
            trajectories.append(Trajectory(env_id="test", seed=i, turns=turns))
    finally:
        await engine.close()
    return trajectories


def _batch(trajectories, policy):
    seqs = [s for t in trajectories for s in t.packed_sequences()]
    adv = [[(1.0 if k % 2 else -0.5) * m for m in s.response_mask] for k, s in enumerate(seqs)]
    return collate(seqs, adv, policy.tokenizer.pad_token_id)


def test_trainer_logprobs_match_engine(tiny_model_dir):
    trajectories = asyncio.run(_sample_trajectories(tiny_model_dir, temperature=0.7))
    assert all(len(t.packed_sequences()) == 1 for t in trajectories)
    policy = Policy(tiny_model_dir, device="cpu", temperature=0.7, micro_batch_size=2)
    batch = _batch(trajectories, policy)
    prox = policy.compute_logprobs(batch)
    mask = batch.response_mask.bool()
    assert mask.sum() > 10
    gap = (prox - batch.behaviour_logprobs)[mask].abs().max()
    assert gap < 1e-3, f"engine and trainer log-probs differ by {gap}"


def test_micro_batching_gives_the_full_batch_gradient(tiny_model_dir):
    trajectories = asyncio.run(_sample_trajectories(tiny_model_dir, temperature=1.0))
    grads = []
    for micro in (1, 8):
        torch.manual_seed(0)
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=micro)
        batch = _batch(trajectories, policy)
        prox = policy.compute_logprobs(batch)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)
        policy_update(policy, optimizer, batch, prox, LossConfig(aggregation="seq-mean-token-mean"), max_grad_norm=None)
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_checkpoint_roundtrip_is_atomic_and_exact(tiny_model_dir, tmp_path):
    policy = Policy(tiny_model_dir, device="cpu")
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    trajectories = asyncio.run(_sample_trajectories(tiny_model_dir, temperature=1.0, n=2))
    batch = _batch(trajectories, policy)
    policy_update(policy, optimizer, batch, policy.compute_logprobs(batch), LossConfig())
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / ".tmp-step-000002-1").mkdir()  # leftover of a killed write
    save_checkpoint(tmp_path, 1, model=policy.model, optimizer=optimizer, trainer_state={"version": 1})
    assert latest_checkpoint(tmp_path).name == "step-000001"
    expected_next = torch.rand(3)
    # a second update continues from the checkpoint the same way twice
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    policy_update(policy, optimizer, batch, policy.compute_logprobs(batch), LossConfig())
    after_a = {k: v.clone() for k, v in policy.model.state_dict().items()}
    payload = load_checkpoint(latest_checkpoint(tmp_path), model=policy.model, optimizer=optimizer)
    assert payload["trainer"]["version"] == 1
    assert torch.equal(torch.rand(3), expected_next)  # RNG restored to the save point
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())
    policy_update(policy, optimizer, batch, policy.compute_logprobs(batch), LossConfig())
    assert all(torch.equal(after_a[k], v) for k, v in policy.model.state_dict().items())


def test_update_without_prox_pass_gives_the_same_gradient(tiny_model_dir):
    """prox=None (pi_prox = the update's own detached forward) matches a separate recompute."""
    trajectories = asyncio.run(_sample_trajectories(tiny_model_dir, temperature=1.0))
    grads = []
    for reuse in (False, True):
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2)
        batch = _batch(trajectories, policy)
        prox = None if reuse else policy.compute_logprobs(batch)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)
        policy_update(policy, optimizer, batch, prox, LossConfig(), max_grad_norm=None)
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_ppo_minibatches_take_several_steps_against_one_proximal_policy(tiny_model_dir):
    from rollhub.trainer.update import ppo_update

    trajectories = asyncio.run(_sample_trajectories(tiny_model_dir, temperature=1.0, n=4))
    policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2)
    batch = _batch(trajectories, policy)
    before = [p.detach().clone() for p in policy.model.parameters()]
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    out = ppo_update(
        policy, optimizer, batch, LossConfig(clip_low=0.01, clip_high=0.01), minibatches=2, epochs=2, seed=3
    )
    assert out["optimizer_steps"] == 4
    assert out["response_tokens"] == float(batch.response_mask.sum())
    # after the first step pi_theta has left pi_prox: the (tiny) clip must have cut some tokens
    assert out["offpolicy/ratio_clip_fraction"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    with pytest.raises(ValueError):
        ppo_update(policy, optimizer, batch, LossConfig(), minibatches=0)


def test_behaviour_proximal_skips_the_pass_and_matches_recompute_on_policy(tiny_model_dir, monkeypatch):
    """proximal="behaviour" clips against mu; on fresh samples (mu = pi_prox up to float
    noise) it takes the same steps as the recomputed proximal policy, without that pass."""
    from rollhub.trainer.update import ppo_update

    trajectories = asyncio.run(_sample_trajectories(tiny_model_dir, temperature=1.0, n=4))
    results = {}
    for proximal in ("recompute", "behaviour"):
        torch.manual_seed(0)
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2)
        batch = _batch(trajectories, policy)
        if proximal == "behaviour":
            monkeypatch.setattr(policy, "compute_logprobs", lambda *_: pytest.fail("the proximal pass ran"))
        optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
        out = ppo_update(policy, optimizer, batch, LossConfig(proximal=proximal), minibatches=2, seed=3)
        results[proximal] = (out, [p.detach().clone() for p in policy.model.parameters()])
    assert results["behaviour"][0]["offpolicy/w_abs_dev_mean"] == 0.0  # prox is mu: no decoupled weight
    for a, b in zip(results["recompute"][1], results["behaviour"][1]):
        assert torch.allclose(a, b, atol=1e-5), "behaviour and recomputed pi_prox should agree on fresh samples"


def test_frozen_embeddings_stay_put_while_the_rest_trains(tiny_model_dir):
    from rollhub.trainer.build import build_optimizer
    from rollhub.trainer.config import RunConfig

    config = RunConfig()
    config.optim.train_embeddings = False
    config.optim.lr = 1e-2
    policy = Policy(tiny_model_dir)
    optimizer = build_optimizer(policy, config)
    embedding = policy.model.get_input_embeddings().weight
    before_embedding = embedding.detach().clone()
    layer = next(p for n, p in policy.model.named_parameters() if "layers.0" in n and p.requires_grad)
    before_layer = layer.detach().clone()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    policy.model(input_ids=ids).logits.log_softmax(-1)[0, :, 11].sum().backward()
    optimizer.step()
    assert torch.equal(embedding, before_embedding)
    assert not torch.equal(layer, before_layer)
