"""LoRA (`model.lora`) on a tiny real model: an RL step moves the adapters alone, the KL reference is the
base with the adapters off, engines given the merged weights score as the trainer does (in-process and
behind `rollhub serve`'s app through the disk push), checkpoints restore the adapters exactly, a `rollhub
train` run goes end to end, and bad values are refused in one line."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_policy import _batch, _sample_trajectories
from trainer_testing import tiny_recipe

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.trainer.build import build_optimizer, build_reference
from rollhub.trainer.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from rollhub.trainer.config import RunConfig
from rollhub.trainer.logprob_check import WARN_NAT, engine_agreement
from rollhub.trainer.lora import AdapterlessReference, LoraConfig, is_adapter_key
from rollhub.trainer.metrics import read_jsonl
from rollhub.trainer.policy import Policy
from rollhub.trainer.update import ppo_update

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _config(model_dir, **loss) -> RunConfig:
    return load_config(
        RunConfig,
        overrides=[
            f"model.path={model_dir}",
            "model.lora.rank=4",
            "model.lora.alpha=8",
            "model.lora.target_modules=[q_proj, v_proj, down_proj]",
            "optim.lr=0.01",
            "agent.temperature=0.7",
            *(f"loss.{k}={v}" for k, v in loss.items()),
        ],
    )


def _policy(model_dir, config: RunConfig) -> Policy:
    return Policy(model_dir, device="cpu", temperature=0.7, micro_batch_size=2, lora=config.model.lora)


@pytest.fixture(scope="module")
def trajectories(tiny_model_dir):
    return asyncio.run(_sample_trajectories(tiny_model_dir, temperature=0.7))


def _step(policy, config, trajectories, reference=None, steps=1):
    optimizer = build_optimizer(policy, config)
    batch = _batch(trajectories, policy)
    for step in range(steps):
        ppo_update(policy, optimizer, batch, config.loss, seed=step, reference=reference)
    return optimizer


def test_an_rl_step_moves_only_the_adapters_and_the_reference_is_the_base(tiny_model_dir, trajectories):
    config = _config(tiny_model_dir, kl_coef=0.1)
    policy = _policy(tiny_model_dir, config)
    before = {name: t.clone() for name, t in policy.model.state_dict().items()}
    reference = build_reference(config, tiny_model_dir, policy)
    assert isinstance(reference, AdapterlessReference)  # no second copy of the model
    optimizer = _step(policy, config, trajectories, reference=reference, steps=2)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for n, p in policy.model.named_parameters() if is_adapter_key(n)}
    after = policy.model.state_dict()
    moved = [n for n in after if not torch.equal(after[n], before[n])]
    assert moved and all(is_adapter_key(n) for n in moved)
    assert any(".lora_B." in n for n in moved)  # B starts at zero: the step is what moved the policy

    base = Policy(tiny_model_dir, device="cpu", temperature=0.7, micro_batch_size=2)
    batch = _batch(trajectories, policy)
    mask = batch.response_mask.bool()
    reference_logp = reference.compute_logprobs(batch)
    assert torch.allclose(reference_logp[mask], base.compute_logprobs(batch)[mask], atol=1e-5)
    assert (policy.compute_logprobs(batch)[mask] - reference_logp[mask]).abs().max() > 1e-3


async def test_engines_given_the_merged_weights_score_as_the_trainer(
    tiny_model_dir, trajectories, engine_apps, tmp_path
):
    """After a step, the in-process engine and `rollhub serve`'s app (disk push through the router) agree with
    the trainer within the version-0 check's tolerance; the trainer's model stays unmerged."""
    from rollhub.inference.engines.build import make_weight_sync
    from rollhub.inference.engines.hf import HFEngine
    from rollhub.inference.engines.router import EngineRouter

    config = _config(tiny_model_dir)
    policy = _policy(tiny_model_dir, config)
    _step(policy, config, trajectories, steps=2)
    state = policy.engine_state_dict()
    assert not any(is_adapter_key(n) or ".base_layer." in n for n in state)
    assert any(".base_layer." in n for n in policy.model.state_dict())  # nothing merged in the trainer

    engine = HFEngine(tiny_model_dir, threads=1, max_batch_size=4, seed=1)
    engines, _, urls = engine_apps
    router = EngineRouter({"a": urls[0]}, weight_sync=make_weight_sync("disk", tmp_path, str(tiny_model_dir)))
    try:
        before = await engine_agreement(engine, policy, config)
        await engine.update_weights(state, 1)
        inprocess = await engine_agreement(engine, policy, config)
        await router.update_weights(policy.engine_state_dict(), 1)
        served = await engine_agreement(router, policy, config)
    finally:
        await engine.close()
        await router.close()
    assert before["check/logprob_v0_max_abs_diff"] > WARN_NAT  # the base is not the trained policy
    for metrics in (inprocess, served):
        assert metrics["check/logprob_v0_tokens"] > 0
        assert metrics["check/logprob_v0_max_abs_diff"] < WARN_NAT
    assert engines[0].weight_version == 1


def test_a_checkpoint_holds_the_adapters_and_restores_them_exactly(tiny_model_dir, trajectories, tmp_path):
    config = _config(tiny_model_dir)
    policy = _policy(tiny_model_dir, config)
    optimizer = _step(policy, config, trajectories)
    folder = save_checkpoint(
        tmp_path, 1, model=policy.model, optimizer=optimizer, trainer_state={}, model_state=policy.training_state()
    )
    saved = read_checkpoint(folder)["model"]
    assert saved and all(is_adapter_key(n) for n in saved)  # the frozen base is the warm-start folder

    resumed = _policy(tiny_model_dir, config)
    resumed_optimizer = build_optimizer(resumed, config)
    load_checkpoint(folder, model=resumed, optimizer=resumed_optimizer)
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name
    moments = [s["exp_avg"] for s in optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(moments, [s["exp_avg"] for s in resumed_optimizer.state.values()]))
    # the next step is the same on both
    _step(policy, config, trajectories)
    _step(resumed, config, trajectories)
    with pytest.raises(UserError, match="not this run's LoRA adapters"):
        full = Policy(tiny_model_dir, device="cpu")
        resumed.load_training_state(full.model.state_dict())
    other = Policy(tiny_model_dir, device="cpu", lora=LoraConfig(rank=4, target_modules=["q_proj"]))
    with pytest.raises(UserError, match="not this run's LoRA adapters"):
        other.load_training_state(saved)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.lora.rank=0", "model.lora.rank must be an integer >= 1"),
        ("model.lora.alpha=-1", "model.lora.alpha must be > 0"),
        ("model.lora.dropout=1.0", r"model.lora.dropout must be in \[0, 1\)"),
        ("model.lora.target_modules=[]", "model.lora.target_modules must list module names"),
        ("model.lora.target_modules=[q_proj, q_proj]", "names a module twice"),
        ("model.lora.rank=2.5", "expected int"),
        ("trainer.world_size=2", "model.lora runs on one trainer process"),
        ("eval.in_trainer=true", "unset eval.in_trainer with model.lora"),
        ("engine.weight_sync=lora_adapter", "lora_adapter pushes LoRA adapters to SGLang servers"),
    ],
)
def test_bad_lora_values_are_refused_in_one_line(override, message):
    with pytest.raises(UserError, match=message) as caught:
        load_config(RunConfig, overrides=["model.lora.rank=4", override])
    assert "\n" not in str(caught.value)


def test_target_modules_the_model_lacks_are_refused(tiny_model_dir):
    with pytest.raises(UserError, match="qkv not among the model's linear layers"):
        Policy(tiny_model_dir, device="cpu", lora=LoraConfig(target_modules=["q_proj", "qkv"]))
    with pytest.raises(UserError, match="embedding or output head"):
        Policy(tiny_model_dir, device="cpu", lora=LoraConfig(target_modules=["lm_head"]))


def test_rollhub_train_with_lora_end_to_end_and_resumed(tiny_model_dir, tmp_path, capsys):
    from safetensors.torch import load_file

    recipe = tiny_recipe(tmp_path, tiny_model_dir, model={"lora": LORA}, loss={"kl_coef": 0.05})
    assert main(["train", str(recipe), "--no-progress"]) == 0
    run = tmp_path / "run"
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2]
    assert records[0]["check/logprob_v0_max_abs_diff"] < WARN_NAT
    saved = read_checkpoint(run / "checkpoints" / "step-000002")["model"]
    assert saved and all(is_adapter_key(n) for n in saved)
    base, final = (
        load_file(str(tiny_model_dir / "model.safetensors")),
        load_file(str(run / "final_model" / "model.safetensors")),
    )
    assert set(final) == set(base)  # a plain model under the base names: the adapters merged in
    assert torch.equal(final["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # frozen
    assert not torch.equal(
        final["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert (run / "final_model" / "lora_adapter" / "adapter_model.safetensors").is_file()
    capsys.readouterr()

    assert main(["train", "--resume", str(run), "--no-progress", "--set", "train.steps=3"]) == 0
    assert "resumed" in capsys.readouterr().out
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r] == [1, 2, 3]


def test_the_cli_reports_a_bad_lora_value_in_one_line(tiny_model_dir, tmp_path, capsys):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, model={"lora": {"rank": 4, "target_modules": ["lm_head"]}})
    assert main(["train", str(recipe), "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert "embedding or output head" in err[-1]


def test_the_trainers_other_paths_give_the_adapters_the_same_gradient(tiny_model_dir, trajectories):
    """Activation checkpointing and packed micro-batches run through the adapted layers as the plain path does."""
    from rollhub.trainer.lora import lora_layers

    def gradients(packed: bool = False, **options) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)  # A's random init
        policy = Policy(tiny_model_dir, device="cpu", temperature=0.7, lora=LoraConfig(**LORA), **options)
        with torch.no_grad():  # the same nonzero adapters in every policy
            for name, param in policy.model.named_parameters():
                if ".lora_B." in name:
                    param.copy_(torch.linspace(-0.05, 0.05, param.numel()).reshape(param.shape))
        assert lora_layers(policy.model)
        batch = _batch(trajectories, policy)
        logp, _ = policy.token_logprobs(batch, packed=packed)
        (logp * batch.advantages).sum().backward()
        return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}

    plain = gradients()
    checkpointed = gradients(gradient_checkpointing=True)
    packed_grads = gradients(packed=True)
    assert plain.keys() == checkpointed.keys() == packed_grads.keys()
    for name, grad in plain.items():
        assert grad.abs().sum() > 0 or ".lora_A." in name, name
        assert torch.allclose(grad, checkpointed[name], atol=1e-6), name
        assert torch.allclose(grad, packed_grads[name], atol=1e-5), name
