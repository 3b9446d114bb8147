"""`rollhub bench cpu-limit`: the FLOPs it counts are the model's matmuls, and a quick run prints the
ceiling and every phase with a utilisation in range."""

from __future__ import annotations

import argparse
import json

import torch

from rollhub.bench.cpu_limit import forward_flops_per_token, matmul_gflops, run


def test_flops_per_token_are_two_per_matmul_weight_head_included(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    if model.config.tie_word_embeddings:  # the head is the embedding matrix, counted once as a module
        assert model.lm_head.weight is model.get_input_embeddings().weight
    assert forward_flops_per_token(model.config, context=0) == 2 * linear
    attention = forward_flops_per_token(model.config, context=100) - forward_flops_per_token(model.config, context=0)
    q = model.config.num_attention_heads * model.config.head_dim
    assert attention == model.config.num_hidden_layers * 4 * q * 100


def test_the_ceiling_is_a_positive_rate():
    assert matmul_gflops(64, torch.float32, 1, 0.05) > 0


def test_quick_run_prints_the_ceiling_and_each_phase(tmp_path, capsys):
    args = argparse.Namespace(quick=True, overrides=[], out=str(tmp_path))
    run(args)
    printed = capsys.readouterr().out
    assert "ceiling: matmul" in printed and "utilisation = GFLOP/s / fp32 ceiling" in printed
    record = json.loads((tmp_path / "cpu_limit.json").read_text())
    assert {row["dtype"] for row in record["ceiling"]} == {"float32", "bfloat16"}
    phases = {row["phase"].split(" ")[0]: row for row in record["phases"]}
    assert set(phases) == {"prefill", "decode", "forward"}
    for row in phases.values():
        assert row["tokens"] > 0 and 0 < row["utilisation"] < 5, row
