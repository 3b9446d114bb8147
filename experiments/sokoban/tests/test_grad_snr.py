"""`python -m experiments.sokoban.grad_snr` on the groups a real two-step tiny-model run logged:
cosines between the gradients of disjoint batches, and a clear error when the run holds too few."""

import json

from experiments.sokoban.grad_snr import main
from rollhub.cli import main as rollhub_main
from tests.trainer.trainer_testing import tiny_recipe


def test_grad_snr_reads_a_runs_groups(tiny_model_dir, tmp_path):
    assert rollhub_main(["train", str(tiny_recipe(tmp_path, tiny_model_dir)), "--no-progress"]) == 0
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
