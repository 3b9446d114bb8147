"""The memory plan against real tensors: parameter counts of real architectures, the 16 bytes per
parameter of AdamW measured on a real optimiser step, activations against what autograd saves,
and `rollhub train` refusing a 7B-shaped run before it touches anything."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rollhub.core.errors import UserError
from rollhub.trainer.lora import DEFAULT_TARGETS
from rollhub.trainer.memory_plan import (
    GIB,
    ModelShape,
    PlanInputs,
    knobs_that_fit,
    plan_memory,
    refuse_unless_fits,
)

REPO = Path(__file__).resolve().parents[2]

QWEN25_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
QWEN25_1_5B = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
TINY_QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 4000,
    "tie_word_embeddings": True,
}


def _meta_model(config: dict):
    import transformers

    kind = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}[config["model_type"]]
    hf_config = getattr(transformers, f"{kind}Config")(**{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        return getattr(transformers, f"{kind}ForCausalLM")(hf_config)


@pytest.mark.parametrize("config", [QWEN25_7B, QWEN25_1_5B, TINY_QWEN3], ids=["qwen2.5-7b", "qwen2.5-1.5b", "qwen3"])
def test_parameter_count_equals_the_real_architecture(config):
    model = _meta_model(config)
    assert ModelShape.from_config(config).parameters() == sum(p.numel() for p in model.parameters())


def test_adamw_costs_sixteen_bytes_per_parameter_on_a_real_step():
    torch.manual_seed(0)
    model = _tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, TINY_QWEN3["vocab_size"], (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    held += sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    held += sum(t.numel() * t.element_size() for s in optimizer.state.values() for k, t in s.items() if k != "step")
    plan = plan_memory(PlanInputs(shape=ModelShape.from_config(TINY_QWEN3), gpu_memory_bytes=GIB))
    planned = sum(plan.items[k] for k in ("weights (fp32)", "gradients (fp32)", "AdamW moments (fp32)"))
    assert planned == held == 16 * ModelShape.from_config(TINY_QWEN3).parameters()
    two_ranks = plan_memory(PlanInputs(shape=ModelShape.from_config(TINY_QWEN3), gpu_memory_bytes=GIB, ranks=2))
    assert two_ranks.items["AdamW moments (fp32)"] * 2 == pytest.approx(plan.items["AdamW moments (fp32)"], abs=2)


def _tiny_model():
    import transformers

    config = transformers.Qwen3Config(**{k: v for k, v in TINY_QWEN3.items() if k != "model_type"})
    return transformers.Qwen3ForCausalLM(config).float()


def test_activation_estimate_matches_what_autograd_saves():
    """fp32 on the CPU: every tensor the forward keeps for backward, counted once per storage."""
    torch.manual_seed(0)
    model = _tiny_model().train()
    rows, tokens = 4, 128
    ids = torch.randint(0, TINY_QWEN3["vocab_size"], (rows, tokens))
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits.float(), -1)
        logp.gather(-1, ids[..., None]).mean()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    log_softmax_out = rows * tokens * TINY_QWEN3["vocab_size"] * 4
    measured_layers = sum(n for ptr, n in saved.items() if ptr not in weights) - log_softmax_out
    plan = plan_memory(
        PlanInputs(
            shape=ModelShape.from_config(TINY_QWEN3),
            gpu_memory_bytes=GIB,
            compute_bytes=4,
            micro_batch_rows=rows,
            context_tokens=tokens,
        )
    )
    assert 0.8 <= plan.items["activations (micro-batch)"] / measured_layers <= 1.25


def test_a_run_that_does_not_fit_names_knobs_that_make_it_fit():
    inputs = PlanInputs(
        shape=ModelShape.from_config(QWEN25_1_5B),
        gpu_memory_bytes=40 * GIB,
        micro_batch_rows=8,
        context_tokens=8192,
        response_tokens=1024,
        engine="sglang_shared",
    )
    assert not plan_memory(inputs).fits
    assert knobs_that_fit(inputs) == [
        "model.gradient_checkpointing=true",
        "optim.micro_batch_size=1",
        "optim.train_embeddings=false",
    ]
    two_knobs = replace(inputs, gradient_checkpointing=True, micro_batch_rows=1)
    assert not plan_memory(two_knobs).fits
    shape = inputs.shape
    without_embeddings = 1 - shape.vocab * shape.hidden / shape.parameters()  # tied: one matrix
    assert plan_memory(replace(two_knobs, trainable_fraction=without_embeddings)).fits
    with pytest.raises(UserError, match="it fits with --set model.gradient_checkpointing=true --set optim.micro"):
        refuse_unless_fits(plan_memory(inputs))


def test_seven_billion_parameters_train_on_one_card_only_with_lora():
    """16 B/param alone is 113 GiB for Qwen2.5-7B: full fine-tuning needs ranks; LoRA keeps gradients and
    moments for its 40M adapter parameters alone, so one card holds it (with one-row micro-batches)."""
    inputs = PlanInputs(shape=ModelShape.from_config(QWEN25_7B), gpu_memory_bytes=int(79.6 * GIB))
    assert knobs_that_fit(inputs) == ["optim.micro_batch_size=1", "model.lora.rank=16"]
    assert not any(k.startswith("model.lora") for k in knobs_that_fit(replace(inputs, ranks=2)))  # one process
    tiny_card = replace(inputs, gpu_memory_bytes=4 * GIB)
    with pytest.raises(UserError, match="use a smaller model"):
        refuse_unless_fits(plan_memory(tiny_card))


def test_lora_counts_gradients_and_moments_of_the_adapters_alone():
    shape = ModelShape.from_config(QWEN25_7B)
    adapters = shape.lora_parameters(16, tuple(DEFAULT_TARGETS))
    # rank x (in + out) per layer: q (3584+3584), k and v (3584+512 each), o (3584+3584), MLP 3 x (3584+18944)
    assert adapters == 28 * 16 * (2 * 7168 + 2 * 4096 + 3 * 22528)
    full = PlanInputs(shape=shape, gpu_memory_bytes=int(79.6 * GIB), kl_reference=True)
    lora = replace(full, lora_rank=16, lora_targets=tuple(DEFAULT_TARGETS))
    a, b = plan_memory(full).items, plan_memory(lora).items
    assert b["gradients (fp32)"] == 4 * adapters and b["AdamW moments (fp32)"] == 8 * adapters
    assert b["weights (fp32)"] == a["weights (fp32)"]
    assert "KL reference (fp32)" in a and "KL reference (fp32)" not in b  # the base with adapters off
    assert plan_memory(full).total_bytes - plan_memory(lora).total_bytes > 100 * GIB


def test_rollhub_train_prints_the_plan_and_refuses_before_touching_the_run(tmp_path):
    model = tmp_path / "qwen7b-shape"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_7B))
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollhub.cli",
            "train",
            str(REPO / "configs" / "sokoban_tiny.yaml"),
            "--set",
            f"model.path={model}",
            "--set",
            "model.device=cuda",
            "--set",
            "model.init_tiny=null",
            "--set",
            f"run_dir={run_dir}",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "memory plan per GPU (7.62B parameters" in result.stderr
    assert "--set model.lora.rank=16" in result.stderr  # LoRA fits 7B on one card
    assert "Traceback" not in result.stderr
    assert not run_dir.exists()
