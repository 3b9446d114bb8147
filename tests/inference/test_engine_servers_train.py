"""`rollhub train` end to end on the server backend: two launched `rollhub serve` replicas,
evaluation and rollouts through them, weights pushed each step (disk and collective)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _serve_processes() -> set[int]:
    """Pids of `rollhub.cli serve` processes on this machine."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"rollhub.cli" in command and b"serve" in command:
                found.add(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("weight_sync", ["disk", "distributed"])
def test_train_runs_against_launched_replicas_and_pushes_weights(tiny_model_dir, tmp_path, weight_sync):
    before = _serve_processes()
    run_dir = tmp_path / "run"
    overrides = {
        "run_dir": run_dir,
        "model.path": tiny_model_dir,
        "engine.backend": "server",
        "engine.replicas": 2,
        "engine.weight_sync": weight_sync,
        "train.steps": 3,
        "sft.episodes": 16,
        "sft.epochs": 1,
        "eval.episodes": 8,
        "eval.samples_per_seed": 1,
        "eval.select.episodes": 0,
    }
    command = [sys.executable, "-m", "rollhub.cli", "train", str(ROOT / "configs/sokoban_tiny.yaml"), "--no-progress"]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "final success" in done.stdout
    logs = sorted((run_dir / "servers").glob("replica-*.log"))
    assert [p.name for p in logs] == ["replica-0.log", "replica-1.log"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "weights/update_s" in r]
    assert [r["policy/version"] for r in steps] == [1, 2, 3]  # one push per step
    if weight_sync == "disk":
        assert sorted(p.name for p in (run_dir / "weights").iterdir()) == ["v3"]  # older versions removed
    assert not (_serve_processes() - before)  # the replicas ended with the run
