"""Trainer ranks as a Ray actor group: `rollhub train` with cluster.backend=ray and
trainer.world_size=2 on a local Ray cluster started by the run itself (2 CPU bundles of 0.5, one
env shard, one engine server). The ranks are real Ray actors in a placement group with gloo
between them; rank 0 leads the job and its rollout runs on Ray actors too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="cluster.backend=ray needs the 'ray' extra: pip install -e '.[ray]'")

REPO = Path(__file__).resolve().parents[2]
STEPS, GROUP_SIZE, BATCH = 2, 2, 2


@pytest.mark.slow
def test_rollhub_train_runs_two_steps_on_a_ray_actor_group_of_two_ranks(tiny_model_dir, tmp_path):
    from rollhub.cli import main

    assert not ray.is_initialized()
    run_dir = tmp_path / "run"
    settings = {
        "run_dir": run_dir,
        "model.path": tiny_model_dir,
        "model.threads": 1,
        "sft.enabled": "false",
        "train.steps": STEPS,
        "train.checkpoint_every": 1,
        "eval.episodes": 1,
        "eval.samples_per_seed": 1,
        "eval.select.episodes": 0,
        "env.kwargs": "{dim: 6, num_boxes: 1, max_steps: 3}",
        "agent.max_new_tokens": 4,
        "rollout.group_size": GROUP_SIZE,
        "rollout.groups_per_batch": BATCH,
        "cluster.backend": "ray",
        "cluster.local_num_cpus": 4,
        "cluster.num_env_shards": 1,
        "engine.backend": "server",
        "engine.placement": "ray",
        "trainer.world_size": 2,
        "trainer.ray_num_cpus": 0.5,
    }
    args = ["train", str(REPO / "configs" / "sokoban_tiny.yaml"), "--no-progress"]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    assert main(args) == 0
    assert not ray.is_initialized()  # the run shut down the Ray instance it started

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in trained] == list(range(1, STEPS + 1))
    assert all(r["train/optimizer_steps"] >= 1 for r in trained)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS
    assert (run_dir / "final_model" / "config.json").is_file()
    assert (run_dir / "checkpoints" / f"step-{STEPS:06d}").is_dir()
