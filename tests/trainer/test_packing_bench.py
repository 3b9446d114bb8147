"""`rollhub bench trainer` end to end on its smallest setting: a recorded batch, padded and packed steps,
1 vs 2 trainer ranks, JSON."""

import argparse
import json

import pytest

from rollhub.bench.trainer import TrainerBenchConfig, forward_tokens, parse_rank_mode, record_batch


@pytest.mark.slow
def test_bench_trainer_quick_writes_its_table(tmp_path, tiny_model_dir):
    from rollhub.bench.trainer import run

    args = argparse.Namespace(
        out=str(tmp_path), quick=True, overrides=["memory=false", "sections=[packing]", f"model={tiny_model_dir}"]
    )
    results = run(args)
    rows = results["layouts"]["history"]["rows"]
    assert [row["micro_batches"] for row in rows] == ["padded", "packed 1024"]
    assert all(row["tokens_per_s"] > 0 and row["step_s"] > 0 for row in rows)
    assert rows[1]["forward_tokens"] <= rows[0]["forward_tokens"]
    saved = json.loads((tmp_path / "trainer.json").read_text())
    assert "not measured" in saved["ranks"]["status"]


def test_recorded_batch_comes_from_the_rollout_code(tiny_model_dir):
    from transformers import AutoTokenizer

    from rollhub.core.config import load_config
    from rollhub.trainer.config import RunConfig

    config = load_config(RunConfig, "configs/sokoban_tiny.yaml", [f"model.path={tiny_model_dir}"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = record_batch(config, tokenizer, "history", groups=2, group_size=2, seed=0)
    lengths = batch.attention_mask.sum(-1)
    assert len(batch) >= 2 and batch.response_mask.sum() > 0
    markov = record_batch(config, tokenizer, "observation_only", groups=2, group_size=2, seed=0)
    assert len(markov) > len(batch)  # one sequence per turn instead of one per episode
    assert markov.attention_mask.sum(-1).max() < lengths.max()
    optim = config.optim
    assert forward_tokens(batch, optim, 2048, seed=7) <= forward_tokens(batch, optim, None, seed=7)
    TrainerBenchConfig().validate()
    with pytest.raises(ValueError, match="layouts"):
        TrainerBenchConfig(layouts=["nope"]).validate()


@pytest.mark.slow  # ~50 s on the shared 2-core machine: four spawned processes each load torch
def test_bench_trainer_ranks_run_the_same_step_and_report_memory_per_rank(tmp_path, tiny_model_dir):
    """Quick ranks section: 1 rank (single process) and 2 gloo ranks, both packed, on the same recorded batch."""
    from rollhub.bench.trainer import run

    overrides = [
        "sections=[ranks]",
        "rank_modes=[1x1@1024,2x1@1024]",
        "recipe_set=[model.dtype=float32]",
        "groups=4",
        f"model={tiny_model_dir}",
    ]
    results = run(argparse.Namespace(out=str(tmp_path), quick=True, overrides=overrides))
    ranks = results["ranks"]
    assert ranks["status"] == "measured"
    one, two = ranks["rows"]
    assert one["micro_batches"] == two["micro_batches"] == "packed 1024"
    assert (one["ranks"], one["threads_per_rank"], two["ranks"], two["threads_per_rank"]) == (1, 1, 2, 1)
    for row in (one, two):
        assert row["step_s"] > 0 and row["tokens_per_s"] == pytest.approx(ranks["real_tokens"] / row["step_s"])
        assert len(row["memory_per_rank"]) == row["ranks"]
        assert all(r["peak_mb"] >= r["rss_mb"] > 0 and r["growth_mb"] >= 0 for r in row["memory_per_rank"])
    assert two["peak_rss_mb_total"] == pytest.approx(sum(r["peak_mb"] for r in two["memory_per_rank"]))
    # the warm-up step starts from the same weights: the split, packed step computes the same loss
    # (float32: in bf16 a packed row's neighbours differ per rank, and so does the rounding)
    assert two["first_step_loss"] == pytest.approx(one["first_step_loss"], rel=1e-4, abs=1e-6)
    saved = json.loads((tmp_path / "trainer.json").read_text())["ranks"]["rows"]
    assert saved[1]["mode"] == "2 ranks x 1 thread, packed 1024"


def test_rank_modes_are_validated():
    assert parse_rank_mode("2x1") == (2, 1, None) and parse_rank_mode("1X2") == (1, 2, None)
    assert parse_rank_mode("2x1@1024") == (2, 1, 1024)
    for bad in ("2", "ax1", "0x1", "1x0", "1x1x1", "2x1@", "2x1@0", "2x1@big"):
        with pytest.raises(ValueError, match="rank mode"):
            TrainerBenchConfig(rank_modes=[bad]).validate()
    with pytest.raises(ValueError, match="sections"):
        TrainerBenchConfig(sections=["gpu"]).validate()
    with pytest.raises(ValueError, match="at least one rank mode"):
        TrainerBenchConfig(rank_modes=[]).validate()
