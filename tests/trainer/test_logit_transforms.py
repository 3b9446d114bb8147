"""Models that transform their logits after the head (Granite's logits scaling, Gemma2's soft-capping,
Cohere's logit scale): the trainer's log-probs are those of the model's own logits path, so at
version 0 they equal the engine's (which runs the whole model) and pi_prox / mu is 1."""

import asyncio

import pytest
import torch

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.models import build_tokenizer
from rollhub.rollout.types import Trajectory, Turn
from rollhub.trainer.policy import Policy, collate

torch.set_num_threads(1)


def _tiny(out, kind: str, **extra):
    import transformers

    tokenizer = build_tokenizer()
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    if kind == "granite":
        config = transformers.GraniteConfig(**common, **extra)
        model = transformers.GraniteForCausalLM(config)
    elif kind == "gemma2":
        config = transformers.Gemma2Config(**common, head_dim=16, **extra)
        model = transformers.Gemma2ForCausalLM(config)
    else:
        config = transformers.CohereConfig(**common, **extra)
        model = transformers.CohereForCausalLM(config)
    torch.manual_seed(0)
    model.apply(model._init_weights)
    with torch.no_grad():  # a sharper head, so that a wrong scale shows in every log-prob
        model.get_output_embeddings().weight.mul_(40.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


async def _generations(model_dir, n=3, temperature=1.0):
    from rollhub.inference.engines.hf import HFEngine

    engine = HFEngine(model_dir, threads=1, max_batch_size=4, seed=1)
    out = []
    try:
        for i in range(n):
            prompt = [5 + i, 17, 23, 42, 8]
            gen = await engine.generate(prompt, SamplingParams(max_new_tokens=6, temperature=temperature, seed=i))
            turn = Turn(prompt, gen.token_ids, gen.logprobs, gen.token_versions)
            out.append(Trajectory(env_id="t", seed=i, turns=[turn]))
    finally:
        await engine.close()
    return out


def _max_gap(model_dir, *, packed=False, temperature=1.0):
    trajectories = asyncio.run(_generations(model_dir, temperature=temperature))
    policy = Policy(model_dir, device="cpu", temperature=temperature, micro_batch_size=2)
    seqs = [s for t in trajectories for s in t.packed_sequences()]
    batch = collate(seqs, [[0.0] * len(s.input_ids) for s in seqs], policy.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = policy.token_logprobs(batch, packed=packed)
    mask = batch.response_mask > 0
    return float((logp[mask] - batch.behaviour_logprobs[mask]).abs().max())


@pytest.mark.parametrize("packed", [False, True])
def test_granite_logits_scaling_agrees_with_the_engine(tmp_path, packed):
    model_dir = _tiny(tmp_path / "granite", "granite", logits_scaling=8.0)
    assert _max_gap(model_dir, packed=packed) < 1e-4


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("gemma2", {"final_logit_softcapping": 3.0}), ("cohere", {"logit_scale": 0.25})],
)
def test_other_post_head_transforms_agree_with_the_engine(tmp_path, kind, extra):
    model_dir = _tiny(tmp_path / kind, kind, **extra)
    assert _max_gap(model_dir, temperature=0.7) < 1e-4


def test_a_transform_the_trainer_does_not_know_runs_the_whole_model(tmp_path, monkeypatch):
    """The load-time check finds that decoder + head do not give the model's logits, and the trainer
    falls back to the model's own forward: still the engine's log-probs."""
    from rollhub.trainer import policy as policy_module

    model_dir = _tiny(tmp_path / "granite", "granite", logits_scaling=8.0)
    monkeypatch.setattr(policy_module, "logit_transform", lambda model: None)
    assert Policy(model_dir, device="cpu")._split_head is False
    assert _max_gap(model_dir) < 1e-4
    assert _max_gap(model_dir, packed=True) < 1e-4
