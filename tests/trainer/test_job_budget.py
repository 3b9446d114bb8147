"""train.max_job_wall_s: the whole job, not RL alone, fits the budget; RL gets what SFT left."""

import json
from types import SimpleNamespace

import pytest
from trainer_testing import tiny_recipe as _recipe

from rollhub.cli import main
from rollhub.trainer.job import RESERVE_MARGIN, final_reserve_s, job_deadline
from rollhub.trainer.metrics import read_jsonl
from rollhub.trainer.run import JobState


def test_the_reserve_is_the_final_readings_measured_on_the_warm_start():
    phases = {"sft_s": 300.0, "eval_warmstart_s": 7.0, "eval_warmstart_greedy_s": 2.0, "select_s": 8.0}
    # held-out twice (last step, picked step), greedy once, one validation reading; SFT is not in it
    # with a margin for a trained policy's longer episodes
    assert final_reserve_s(phases) == pytest.approx(24.0 * RESERVE_MARGIN) and RESERVE_MARGIN > 1
    assert final_reserve_s({}) == 0.0
    # without eval.select the held-out reading is taken once; eval.baselines readings again each
    assert final_reserve_s({"eval_warmstart_s": 7.0}, select=False) == pytest.approx(7.0 * RESERVE_MARGIN)
    baseline = {"eval_warmstart_s": 7.0, "eval_baseline_no_tool_warmstart_s": 3.0}
    assert final_reserve_s(baseline) == pytest.approx(17.0 * RESERVE_MARGIN)


def test_the_deadline_counts_earlier_processes_and_keeps_the_reserve_free():
    run = SimpleNamespace(
        config=SimpleNamespace(train=SimpleNamespace(max_job_wall_s=600.0)),
        started=1000.0,
        prior_wall_s=200.0,  # a resumed run: an earlier process already spent 200 s of the budget
        state=JobState(final_reserve_s=30.0),
    )
    assert job_deadline(run) == pytest.approx(1000.0 + 600.0 - 200.0 - 30.0)
    run.config.train.max_job_wall_s = None
    assert job_deadline(run) is None
    # the reserve travels in the checkpointed loop state, so a resumed process keeps it free too
    assert JobState(**JobState(final_reserve_s=30.0).as_dict()).final_reserve_s == 30.0


def test_rl_stops_so_that_the_whole_job_ends_within_its_budget(tiny_model_dir, tmp_path, capsys):
    budget = 30.0
    # train.max_wall_s is only a backstop at 3x the budget: if the job budget were ignored, RL
    # alone would run 90 s and the job would end far past 30 s
    recipe = _recipe(
        tmp_path,
        tiny_model_dir,
        sft={"enabled": True, "episodes": 2, "batch_size": 4},
        train={"steps": 100_000, "checkpoint_every": 0, "max_wall_s": 3 * budget, "max_job_wall_s": budget},
    )
    assert main(["train", str(recipe), "--no-progress"]) == 0
    assert "final success" in capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 < summary["steps"] < 100_000
    steps = [r["time/step_s"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "time/step_s" in r]
    # RL stops when a step as long as the last would pass the deadline: only a step much slower
    # than the one before it, or final readings slower than the warm-start's, can overrun
    assert summary["wall_s"] <= budget + 2.0 + max([0.0] + [b - a for a, b in zip(steps, steps[1:])]), summary
    assert summary["phases_s"]["sft_s"] > 0


def test_a_budget_the_warm_start_used_up_skips_rl_and_still_reads_the_final(tiny_model_dir, tmp_path, capsys):
    recipe = _recipe(tmp_path, tiny_model_dir, train={"steps": 50, "checkpoint_every": 0, "max_job_wall_s": 0.01})
    assert main(["train", str(recipe), "--no-progress"]) == 0
    assert "final success" in capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 0
    assert (tmp_path / "run" / "final_model" / "config.json").is_file()
