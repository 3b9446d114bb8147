"""`rollhub bench async-real` (real tiny-model training on real envs) and `redundancy-bias`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rollhub.bench import async_real, redundancy_bias


def bench_args(out: Path, *overrides: str, quick: bool = True) -> argparse.Namespace:
    return argparse.Namespace(out=str(out), quick=quick, overrides=list(overrides))


def test_lockstep_barrier_bound_from_a_trajectory_log(tmp_path: Path):
    """Two trajectories, two turns: env steps (1, 3) and (3, 1). Lockstep waits 3 + 3 = 6 s in
    envs, independent envs need max(4, 4) = 4 s: 2 s of barrier per step; a 10 s lockstep
    step could at best become 8 s (bound 1.25)."""
    lines = [
        {"turns": [{"timings_s": {"env_step": 1.0}}, {"timings_s": {"env_step": 3.0}}]},
        {"turns": [{"timings_s": {"env_step": 3.0}}, {"timings_s": {"env_step": 1.0}}]},
    ]
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    bound = async_real.lockstep_env_bound(tmp_path, 2, 10.0)
    assert bound == pytest.approx({"barrier_s_per_step": 2.0, "bound": 1.25})
    assert async_real.lockstep_env_bound(tmp_path / "missing", 2, 10.0) is None


def test_config_refuses_unknown_envs_and_schedules():
    with pytest.raises(ValueError, match="envs"):
        async_real.AsyncRealConfig(envs=["sokoban"]).validate()
    with pytest.raises(ValueError, match="schedules"):
        async_real.AsyncRealConfig(schedules=["fast"]).validate()
    assert async_real.schedule_overrides(async_real.AsyncRealConfig(), "lockstep") == [
        "rollout.lockstep=true",
        "rollout.async_ratio=0",
    ]
    red = async_real.schedule_overrides(async_real.AsyncRealConfig(redundant_groups=2), "async+red")
    assert "rollout.redundant_groups=2" in red
    with pytest.raises(ValueError, match="alfworld_action_format"):
        async_real.AsyncRealConfig(alfworld_action_format="numbers").validate()
    alfworld = async_real.env_overrides(async_real.AsyncRealConfig(), "alfworld")
    assert any("action_format: index" in o for o in alfworld)


def test_config_refuses_a_starting_model_that_is_not_a_model_folder_and_bad_overrides(tmp_path: Path):
    with pytest.raises(ValueError, match="not a model folder"):
        async_real.AsyncRealConfig(model=str(tmp_path)).validate()
    (tmp_path / "config.json").write_text("{}")
    async_real.AsyncRealConfig(model=str(tmp_path), run_overrides=["agent.history_window=1"]).validate()
    with pytest.raises(ValueError, match="KEY=VALUE"):
        async_real.AsyncRealConfig(run_overrides=["agent.history_window"]).validate()


@pytest.fixture(scope="module")
def bias_rows(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("redundancy-bias")
    report = redundancy_bias.run(bench_args(out))
    assert (out / "result.json").exists()
    return {row["mode"]: row for row in report["rows"]}


def test_redundancy_bias_quick_shows_cancel_biased_and_newest_rule_not(bias_rows):
    rows = bias_rows
    assert rows["sync"]["tv_distance"] == 0
    assert rows["sync +2 cancel"]["tv_distance"] > 0 and rows["sync +2 cancel"]["groups_cancelled"] > 0
    # async: judging staleness by the newest token drops fewer slow groups than the token mean
    # (none without redundancy); the full-size run's table is in benchmarks/README.md
    assert rows["async a=1 newest"]["dropped_stale"] == 0 < rows["async a=1 token"]["dropped_stale"]
    assert rows["async a=1 newest"]["tv_distance"] < rows["async a=1 token"]["tv_distance"]
    assert rows["async a=1 +2 newest"]["dropped_stale"] <= rows["async a=1 +2 token"]["dropped_stale"]


def test_redundant_groups_with_sync_training_carry_late_groups(bias_rows):
    """α = 0 with redundant groups: a group that finishes while the trainer steps is carried into
    the next batch (one version old), not dropped as stale, so the mix stays the task distribution."""
    carry = bias_rows["sync +2 carry"]
    assert carry["dropped_stale"] == 0 and carry["tv_distance"] == 0 and carry["speedup"] > 1.0


@pytest.mark.slow
def test_async_real_quick_runs_real_alfworld_training(tmp_path: Path):
    pytest.importorskip("alfworld")
    report = async_real.run(bench_args(tmp_path / "out"))
    rows = {row["schedule"]: row for row in report["rows"]}
    assert set(rows) == {"lockstep", "async+red"}
    assert all(row["step_s"] > 0 for row in rows.values())
    assert rows["lockstep"]["speedup"] == 1.0
