"""A run folder belongs to one run: a resume cannot change what the run trains, two processes
cannot share the folder, and a fresh run does not write over a finished one."""

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from trainer_testing import tiny_recipe

from rollhub.cli import main
from rollhub.trainer.metrics import read_jsonl
from rollhub.trainer.run_lock import LOCK_FILE


def _train_steps(run: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r]


def test_resume_with_a_changed_recipe_is_refused_before_the_run_is_touched(tiny_model_dir, tmp_path, capsys):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, train={"steps": 1, "checkpoint_every": 1})
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--no-progress"]) == 0
    saved = (run / "config.json").read_bytes()
    (tmp_path / "other").mkdir()
    other = tiny_recipe(tmp_path / "other", tiny_model_dir, rollout={"group_size": 4}, optim={"lr": 5e-4})

    capsys.readouterr()
    assert main(["train", str(other), "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "rollout.group_size: 2 -> 4" in err and "optim.lr" in err and "Traceback" not in err
    assert (run / "config.json").read_bytes() == saved  # the run is as it was
    assert main(["train", "--resume", str(run), "--no-progress", "--set", "optim.lr=1.0"]) == 2

    # the knobs a resume may change: here the step budget, through the same recipe
    assert main(["train", str(recipe), "--resume", str(run), "--no-progress", "--set", "train.steps=2"]) == 0
    assert _train_steps(run) == [1, 2]
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 2


def test_a_second_run_on_a_locked_run_dir_is_refused(tiny_model_dir, tmp_path, capsys):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, train={"steps": 3, "checkpoint_every": 1})
    run = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "rollhub.cli", "train", str(recipe), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "step-000001").exists():
            assert first.poll() is None, first.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the first run never checkpointed"
            time.sleep(0.1)
        holder = json.loads((run / LOCK_FILE).read_text())
        assert holder["pid"] == first.pid
        for argv in (["train", "--resume", str(run)], ["train", str(recipe), "--overwrite"]):
            assert main([*argv, "--no-progress"]) == 2
            err = capsys.readouterr().err
            assert f"is in use by another run (pid {first.pid} on" in err, err
    finally:
        out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err.decode()[-2000:]
    assert _train_steps(run) == [1, 2, 3]  # one run's steps, once each
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    assert (run / LOCK_FILE).read_text() == ""  # a clean end leaves nothing to take over


def test_a_stale_lock_is_taken_over_and_a_finished_run_needs_overwrite(tiny_model_dir, tmp_path, capsys, caplog):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, train={"steps": 0})
    run = tmp_path / "run"
    # a process that takes the lock and dies without releasing it
    code = (
        f"import os; from rollhub.trainer.run_lock import RunDirLock; RunDirLock({str(run)!r}).acquire(); os._exit(0)"
    )
    dead = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert dead.returncode == 0
    dead_pid = json.loads((run / LOCK_FILE).read_text())["pid"]
    with caplog.at_level(logging.WARNING, logger="rollhub.trainer.run_lock"):
        assert main(["train", str(recipe), "--no-progress"]) == 0
    assert any(f"taking over the lock left by pid {dead_pid} on" in r.getMessage() for r in caplog.records)

    capsys.readouterr()
    assert main(["train", str(recipe), "--no-progress"]) == 2  # a finished run is not written over
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err
    assert main(["train", str(recipe), "--no-progress", "--overwrite"]) == 0
    assert sum(1 for r in read_jsonl(run / "metrics.jsonl") if "eval/success_rate" in r) == 2  # one run's readings


def test_every_resumable_key_is_a_knob_of_the_run():
    """A renamed knob must not linger in RESUMABLE_KEYS (the resume check would never see it change)."""
    from rollhub.core.config import config_to_dict
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.resume_config import RESUMABLE_KEYS, flatten

    knobs = flatten(config_to_dict(RunConfig()))
    assert [key for key in RESUMABLE_KEYS if key not in knobs] == []
