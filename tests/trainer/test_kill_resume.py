"""SIGKILL a real `rollhub train` at random moments, most of them inside a save, and resume it each time.

Each attempt is a new process running `rollhub.cli.main(["train", ...])`, forked from a
multiprocessing forkserver that has already imported torch and transformers: a plain
`python -m rollhub.cli` spends ~15 s of its life importing on 2 cores, which would leave
no room for 20 kills. The kill is a real SIGKILL of that process.

The run is tiny (5m-parameter model, lockstep, a checkpoint every step), so writing the
~60 MB checkpoint (weights and Adam moments) is a large share of each step. A kill aims at
one of three moments, each with a random delay: the SFT model's save (a `.tmp-sft_model-`
folder appears), a checkpoint's save (a `.tmp-step-` folder appears), or anywhere from the
start of the attempt (restore, log truncation) through about two steps. After every kill
the newest checkpoint must load with `weights_only=True` and never be older than before; at
the end the resumed run must hold every RL step once in metrics.jsonl and every training
task once in trajectories.jsonl.

The default suite kills 3 times (20-35 s on 2 shared cores); the 20-kill version (80-110 s,
close to the two-minute budget of one test) is marked slow.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from rollhub.core.config import load_config
from rollhub.trainer.checkpoint import CHECKPOINT_DIR, STATE_FILE, latest_checkpoint, list_checkpoints
from rollhub.trainer.config import RunConfig
from rollhub.trainer.metrics import read_jsonl

SEED_OFFSET = 0  # env.train_seed_offset of the recipe (the first seed adds seed x train_seed_bound)
GROUPS_PER_BATCH = 2
KEEP_CHECKPOINTS = 2
#: where a kill aims -> the longest random delay (s) after the attempt gets there: a checkpoint
#: save lasts 0.1-0.2 s here, so about half of those kills land inside it; "anywhere" counts
#: from the start of the attempt, through restore and about two steps
MAX_DELAY_S = {"sft-save": 0.1, "checkpoint-save": 0.2, "anywhere": 7.0}
PRELOAD = ["rollhub.cli", "rollhub.trainer.job", "transformers.models.qwen3.modeling_qwen3"]


def _recipe(folder: Path, model_dir: Path, steps: int) -> Path:
    """folder/recipe.yaml for a run in folder/run."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "run_dir": str(folder / "run"),
        "seed": 5,
        "model": {"path": str(model_dir), "init_tiny": None},
        "env": {
            "id": "rollhub/Sokoban-v0",
            "kwargs": {"dim": 6, "num_boxes": 1, "max_steps": 3},
            "train_seed_offset": SEED_OFFSET,
        },
        "agent": {"system_prompt": "Sokoban.", "history_window": 1, "max_new_tokens": 6},
        "rollout": {"group_size": 2, "groups_per_batch": GROUPS_PER_BATCH, "async_ratio": 0.0, "lockstep": True},
        "optim": {"lr": 1e-3, "micro_batch_size": 32},
        "train": {"steps": steps, "checkpoint_every": 1, "keep_checkpoints": KEEP_CHECKPOINTS},
        "sft": {"enabled": True, "episodes": 2, "batch_size": 4},
        "eval": {"episodes": 1},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --- one attempt: a fresh process running `rollhub train` ---------------------------------


def _train_args(recipe: Path, run: Path) -> list[str]:
    """Resume once the run exists; a run killed before it wrote config.json is simply started again."""
    args = ["--resume", str(run)] if (run / "config.json").is_file() else [str(recipe)]
    return ["train", *args, "--no-progress"]


def _rollhub_train(argv: list[str], log: str) -> None:
    """The child: `rollhub <argv>` with stdout and stderr in `log`, its exit status the CLI's."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    from rollhub.cli import main

    sys.exit(main(argv))


def _start(argv: list[str], log: Path) -> multiprocessing.Process:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # no effect once the server runs: then it already has them
    proc = context.Process(target=_rollhub_train, args=(argv, str(log)), daemon=True)
    proc.start()
    return proc


def _assert_ok(proc: multiprocessing.Process, log: Path) -> None:
    assert proc.exitcode == 0, f"an attempt failed (exit {proc.exitcode}):\n{log.read_text()[-3000:]}"


def _wait_for(proc: multiprocessing.Process, condition, log: Path, timeout_s: float = 300) -> bool:
    """Poll `condition` every few ms; False when `proc` finished cleanly first (a failure raises)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if not proc.is_alive():
            proc.join()
            _assert_ok(proc, log)
            return False
        assert time.monotonic() < deadline, f"nothing happened in {timeout_s}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.003)
    return True


# --- where a kill lands -------------------------------------------------------------------


def _temp_entries(folder: Path, prefix: str) -> set[str]:
    """Temporary names of saves in progress (they carry the writer's pid, so each attempt's are new)."""
    return {p.name for p in folder.iterdir() if p.name.startswith(prefix)} if folder.is_dir() else set()


def _reached(target: str, run: Path):
    """A condition that turns true when this attempt reaches `target`."""
    if target == "sft-save":
        before = _temp_entries(run, ".tmp-sft_")
        return lambda: bool(_temp_entries(run, ".tmp-sft_") - before)
    if target == "checkpoint-save":
        before = _temp_entries(run / CHECKPOINT_DIR, ".tmp-step-")
        return lambda: bool(_temp_entries(run / CHECKPOINT_DIR, ".tmp-step-") - before)
    return lambda: True  # "anywhere": from the start of the attempt


def _attempt_and_kill(recipe: Path, run: Path, target: str, delay: float, log: Path) -> bool:
    """Start (or resume) the run and SIGKILL it `delay` s after it reaches `target`; False if it finished first."""
    reached = _reached(target, run)
    proc = _start(_train_args(recipe, run), log)
    try:
        if not _wait_for(proc, reached, log):
            return False
        time.sleep(delay)
        if not proc.is_alive():
            proc.join()
            _assert_ok(proc, log)
            return False
        os.kill(proc.pid, signal.SIGKILL)
        return True
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join()


# --- what must hold -----------------------------------------------------------------------


def _checkpoint_step(run: Path) -> int:
    """The newest complete checkpoint's step (0 when none); it must load with the safe loader."""
    latest = latest_checkpoint(run)
    if latest is None:
        return 0
    payload = torch.load(latest / STATE_FILE, map_location="cpu", weights_only=True)
    return int(payload["step"])


def _assert_run_complete(run: Path, steps: int) -> None:
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records if "train/loss" in r] == list(range(1, steps + 1))  # each step once
    assert sum(1 for r in records if r["step"] == 0) == 1  # one warm-start evaluation
    assert json.loads((run / "summary.json").read_text())["steps"] == steps

    lines = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    seeds_by_group: dict[str, set[int]] = {}
    for line in lines:
        seeds_by_group.setdefault(line["group_id"], set()).add(line["seed"])
    seeds = sorted(seed for group in seeds_by_group.values() for seed in group)
    assert all(len(group) == 1 for group in seeds_by_group.values())
    first = load_config(RunConfig, run.parent / "recipe.yaml").train_seed_start  # the run's seed moves it
    assert seeds == list(range(first, first + steps * GROUPS_PER_BATCH))  # none lost, none twice
    versions = [v for line in lines for turn in line["turns"] for v in turn["token_versions"]]
    assert versions and max(versions) < steps  # lockstep: step k trains on samples of version k - 1

    assert (run / "sft_done.json").is_file()
    sft_steps = [r["step"] for r in read_jsonl(run / "sft_metrics.jsonl")]
    assert sft_steps and len(sft_steps) == len(set(sft_steps))
    folders = sorted((run / CHECKPOINT_DIR).iterdir())
    assert folders == list_checkpoints(run) and len(folders) == KEEP_CHECKPOINTS  # complete, rotated, no leftovers


def _saves_in_progress(run: Path) -> set[str]:
    return _temp_entries(run, ".tmp-") | _temp_entries(run / CHECKPOINT_DIR, ".tmp-")


def _kill_once(recipe: Path, target: str, delay: float, log: Path) -> str | None:
    """One kill and the checks after it: what it hit, or None when the run finished first."""
    run = recipe.parent / "run"
    before, newest = _saves_in_progress(run), _checkpoint_step(run)
    if target == "sft-save" and (run / "sft_done.json").exists():
        target = "checkpoint-save"
    if not _attempt_and_kill(recipe, run, target, delay, log):
        return None
    step = _checkpoint_step(run)  # loads with weights_only=True, or fails
    hit = f"{target}+{delay:.2f}s -> step {step}{' (mid-save)' if _saves_in_progress(run) - before else ''}"
    assert step >= newest, f"{hit}: the newest checkpoint went back from step {newest}"
    return hit


def _finish(recipe: Path, steps: int, log: Path) -> None:
    """Resume the run to its end; it must start from its newest checkpoint and hold every step once."""
    run = recipe.parent / "run"
    newest = _checkpoint_step(run)
    proc = _start(_train_args(recipe, run), log)
    proc.join(600)
    _assert_ok(proc, log)
    if newest:
        assert f"at step {newest}\n" in log.read_text()
    _assert_run_complete(run, steps)


def _kill_resume(model_dir: Path, tmp_path: Path, targets: list[str], *, steps: int, seed: int) -> list[str]:
    """One kill per target, each followed by a resume; returns what each kill hit.

    A run that finishes before the next kill is checked and replaced by a new one, so every
    target gets its kill however fast this machine is.
    """
    rng = random.Random(seed)
    hits: list[str] = []
    runs = 0
    recipe = _recipe(tmp_path / f"run-{runs}", model_dir, steps)
    for index, target in enumerate(targets):
        delay = rng.uniform(0.0, MAX_DELAY_S[target])
        while (hit := _kill_once(recipe, target, delay, tmp_path / f"attempt-{index}-{runs}.log")) is None:
            _assert_run_complete(recipe.parent / "run", steps)  # it finished before the kill
            runs += 1
            assert runs <= 4 * len(targets), f"runs keep finishing before a kill lands: {hits}"
            recipe = _recipe(tmp_path / f"run-{runs}", model_dir, steps)
            delay /= 2  # a fresh run on a fast (or lightly loaded) machine: aim earlier
        hits.append(hit)
    _finish(recipe, steps, tmp_path / "final.log")
    return hits


def test_three_kills_in_saves_and_between_lose_and_duplicate_nothing(tiny_model_dir, tmp_path):
    hits = _kill_resume(tiny_model_dir, tmp_path, ["sft-save", "checkpoint-save", "anywhere"], steps=4, seed=7)
    assert len(hits) == 3, hits


@pytest.mark.slow
def test_twenty_random_kills_lose_and_duplicate_nothing(tiny_model_dir, tmp_path):
    rng = random.Random(11)
    targets = ["sft-save"] + [rng.choice(["checkpoint-save", "checkpoint-save", "anywhere"]) for _ in range(19)]
    hits = _kill_resume(tiny_model_dir, tmp_path, targets, steps=8, seed=11)
    assert len(hits) == 20, hits
