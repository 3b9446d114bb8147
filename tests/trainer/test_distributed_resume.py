"""SIGKILL a 2-rank `rollhub train` (trainer.world_size: 2) and resume it, on 2 ranks or on 1.

The single-rank kill-and-resume test (test_kill_resume.py) is the model: the same tiny recipe
(SFT warm-start, lockstep, a checkpoint every step), the same forkserver-started attempts and
the same final checks (every RL step once in metrics.jsonl, every training task once in
trajectories.jsonl, complete rotated checkpoints). What is new with ranks: rank 0 is the killed
process and must take its follower with it (no rank may outlive a kill), the checkpoints are the
gathered full state written by rank 0, and a run killed on 2 ranks finishes on 1 (and one
checkpointed by 1 rank continues on 2), since the checkpoint format does not depend on the
world size.

Default: one kill of a 2-rank run just after its first checkpoint, then the resume from it on 2
ranks (each 2-rank attempt starts a second interpreter, so this is slower than the single-rank
test). The 6-kill version (inside saves, after checkpoints, anywhere; resumes switching between
1 and 2 ranks) is marked slow.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
import test_kill_resume as single
import yaml

from rollhub.trainer.checkpoint import latest_checkpoint

STEPS = 6  # the slow test's run; the default one runs 2 steps (2 checkpoints kept: the fewest that rotate)
#: a kill aimed just after a new checkpoint is complete (inside the next step or the next save), so the
#: resume starts from that checkpoint rather than from the start
AFTER_CHECKPOINT_MAX_DELAY_S = 0.3


def _reached(target: str, run: Path):
    if target != "after-checkpoint":
        return single._reached(target, run)
    before = latest_checkpoint(run)
    return lambda: latest_checkpoint(run) != before


def _recipe(folder: Path, model_dir: Path, steps: int) -> Path:
    path = single._recipe(folder, model_dir, steps)
    data = yaml.safe_load(path.read_text())
    data["trainer"] = {"world_size": 2}
    path.write_text(yaml.safe_dump(data))
    return path


def _args(recipe: Path, run: Path, world_size: int) -> list[str]:
    return [*single._train_args(recipe, run), "--set", f"trainer.world_size={world_size}"]


def _ranks_of(run: Path) -> list[int]:
    """Follower ranks of this run still alive (their command line names the run folder)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(run).encode() in cmdline and any(b"local_follower_main" in part for part in cmdline):
            alive.append(int(entry.name))
    return alive


def _assert_no_rank_left(run: Path) -> None:
    deadline = time.monotonic() + 10
    while _ranks_of(run):
        assert time.monotonic() < deadline, f"ranks {_ranks_of(run)} outlived rank 0"
        time.sleep(0.05)


def _kill(recipe: Path, world_size: int, target: str, delay: float, log: Path) -> str | None:
    """Start or resume on `world_size` ranks, SIGKILL rank 0 `delay` s after `target`; None if it finished first."""
    run = recipe.parent / "run"
    newest = single._checkpoint_step(run)
    reached = _reached(target, run)
    proc = single._start(_args(recipe, run, world_size), log)
    try:
        if not single._wait_for(proc, reached, log):
            return None
        time.sleep(delay)
        if not proc.is_alive():
            proc.join()
            single._assert_ok(proc, log)
            return None
        os.kill(proc.pid, 9)
    finally:
        if proc.is_alive():
            os.kill(proc.pid, 9)
        proc.join()
    _assert_no_rank_left(run)
    step = single._checkpoint_step(run)  # loads with weights_only=True
    assert step >= newest, f"the newest checkpoint went back from step {newest} to {step}"
    return f"{world_size} ranks, {target}+{delay:.2f}s -> step {step}"


def _finish(recipe: Path, world_size: int, log: Path, steps: int) -> None:
    run = recipe.parent / "run"
    newest = single._checkpoint_step(run)
    proc = single._start(_args(recipe, run, world_size), log)
    proc.join(600)
    single._assert_ok(proc, log)
    if newest:
        assert f"at step {newest}\n" in log.read_text()
    _assert_no_rank_left(run)
    single._assert_run_complete(run, steps)


def _kills_then_finish(
    model_dir: Path, tmp_path: Path, plan: list[tuple[int, str]], finish_on: int, seed: int, steps: int = STEPS
):
    rng = random.Random(seed)
    hits = []
    for attempt in range(3):  # a run that finishes before a kill lands is replaced by a new one
        recipe = _recipe(tmp_path / f"run-{attempt}", model_dir, steps)
        hits = []
        for index, (world_size, target) in enumerate(plan):
            longest = AFTER_CHECKPOINT_MAX_DELAY_S if target == "after-checkpoint" else single.MAX_DELAY_S[target]
            delay = rng.uniform(0.0, longest) / (attempt + 1)
            hit = _kill(recipe, world_size, target, delay, tmp_path / f"attempt-{attempt}-{index}.log")
            if hit is None:
                single._assert_run_complete(recipe.parent / "run", steps)
                break
            hits.append(hit)
        else:
            _finish(recipe, finish_on, tmp_path / f"final-{attempt}.log", steps)
            return hits
    pytest.fail(f"runs kept finishing before the kills landed: {hits}")


def test_two_rank_run_killed_after_a_checkpoint_resumes_from_it_losing_nothing(tiny_model_dir, tmp_path):
    hits = _kills_then_finish(tiny_model_dir, tmp_path, [(2, "after-checkpoint")], finish_on=2, seed=3, steps=2)
    assert len(hits) == 1 and hits[0].endswith("step 1"), hits  # the resume starts from a 2-rank checkpoint


@pytest.mark.slow
def test_six_kills_resuming_on_one_and_two_ranks_lose_and_duplicate_nothing(tiny_model_dir, tmp_path):
    """Each resume runs on the other world size than the attempt before it: checkpoints written by
    2 ranks continue on 1 and the other way round."""
    plan = [
        (2, "sft-save"),
        (2, "after-checkpoint"),
        (1, "after-checkpoint"),
        (2, "checkpoint-save"),
        (1, "after-checkpoint"),
        (2, "anywhere"),
    ]
    hits = _kills_then_finish(tiny_model_dir, tmp_path, plan, finish_on=2, seed=17)
    assert len(hits) == 6, hits
    # which world sizes wrote a checkpoint that the next attempt (on the other world size) resumed
    steps = [int(hit.rsplit("step ", 1)[1]) for hit in hits]
    writers = {plan[i][0] for i in range(len(hits)) if steps[i] > (steps[i - 1] if i else 0)}
    assert writers == {1, 2}, hits
