"""`python -m experiments.sokoban.grad_snr` on the groups a real two-step tiny-model run logged:
cosines between the gradients of disjoint batches, and a clear error when the run holds too few."""

import json

import yaml

from experiments.sokoban.grad_snr import main
from rollhub.cli import main as rollhub_main


def _recipe(tmp_path, model_dir):
    """A two-step `rollhub train` recipe for the tiny model on 3-move Sokoban rooms, no SFT."""
    data = {
        "run_dir": str(tmp_path / "run"),
        "seed": 3,
        "model": {"path": str(model_dir), "init_tiny": None},
        "env": {"id": "rollhub/Sokoban-v0", "kwargs": {"dim": 6, "num_boxes": 1, "max_steps": 3}},
        "agent": {"system_prompt": "Sokoban.", "history_window": 1, "max_new_tokens": 6},
        "rollout": {"group_size": 2, "groups_per_batch": 2, "async_ratio": 1.0},
        "optim": {"lr": 1e-3, "micro_batch_size": 32},
        "train": {"steps": 2, "checkpoint_every": 1},
        "sft": {"enabled": False},
        "eval": {"episodes": 2},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_grad_snr_reads_a_runs_groups(tiny_model_dir, tmp_path):
    assert rollhub_main(["train", str(_recipe(tmp_path, tiny_model_dir)), "--no-progress"]) == 0
    out = tmp_path / "snr"
    run = ["--set", f"run={tmp_path / 'run'}", "--set", f"model={tiny_model_dir}", "--set", "max_version=5"]
    assert main(["--out", str(out), *run, "--set", "sizes=[1]", "--set", "repeats=2"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["groups_available"] >= 2
    (row,) = result["rows"]
    assert len(row["cosines"]) == 2 and all(-1.0 <= c <= 1.0 for c in row["cosines"])
    assert (out / "grad_snr.png").stat().st_size > 0
    # too few groups for the batch size asked: a clear error, not a stack trace
    assert main(["--out", str(out), *run, "--set", "sizes=[1000]", "--set", "repeats=1"]) != 0
