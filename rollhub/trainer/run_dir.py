"""A run's folder: who may write it, the SFT model's completion marker, checkpoints and resume.

Layout: run.lock (rollhub.trainer.run_lock), config.json (what `--resume` reads back),
metrics.jsonl, trajectories.jsonl, sft_model/ + sft_done.json, warmstart.json, checkpoints/,
final_model/, summary.json.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from rollhub.core.config import config_to_dict
from rollhub.core.errors import UserError
from rollhub.rollout.trajectory_log import RUN_TRAJECTORY_LOG, log_size, truncate_log
from rollhub.trainer.checkpoint import (
    CHECKPOINT_DIR,
    atomic_write_text,
    clear_leftovers,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from rollhub.trainer.config import RunConfig
from rollhub.trainer.resume_config import check_resume_config
from rollhub.trainer.run import JobState, Run

logger = logging.getLogger(__name__)

WARMSTART_FILE = "warmstart.json"
SFT_MODEL_DIR = "sft_model"
SFT_DONE_FILE = "sft_done.json"  # written after sft_model/ is complete: the only proof that it is


#: what a run writes in its folder (`--overwrite` removes these, and nothing else of the folder)
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "trajectories.jsonl",
    "trajectories.html",
    "summary.json",
    "learning_curve.png",
    WARMSTART_FILE,
    SFT_DONE_FILE,
    "sft_metrics.jsonl",
    SFT_MODEL_DIR,
    CHECKPOINT_DIR,
    "final_model",
    "best_model",
    "tensorboard",
)


def earlier_run_files(run_dir: Path) -> list[str]:
    """The files that show an earlier run trained in `run_dir` (its log, checkpoints or results)."""
    found = [name for name in ("metrics.jsonl", "summary.json", "final_model") if (run_dir / name).exists()]
    checkpoints = run_dir / CHECKPOINT_DIR
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        found.append(CHECKPOINT_DIR)
    return found


def remove_run_files(run_dir: Path) -> None:
    """Remove what a run wrote in `run_dir` (RUN_FILES), leaving anything else in the folder."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def open_run_dir(config: RunConfig, *, resume: bool, overwrite: bool = False) -> Path | None:
    """Refuse to overwrite another run or to resume with a changed config, and return the
    checkpoint to resume (if any). The caller holds the folder's lock (rollhub.trainer.run_lock).

    Nothing is written before those checks pass: a refused resume leaves the run as it was.
    config.json is replaced atomically: `rollhub train --resume` reads it back, so a torn one
    would make the run unresumable. A run that starts from step 0 drops any trajectory log of
    an earlier attempt, as `run_training` does with the metrics, so no group is logged twice.
    A resume first clears what a killed checkpoint write or rotation left: a run killed while
    rotating its last checkpoint saves nothing more when resumed, so nothing else would.
    """
    run_dir = Path(config.run_dir)
    if resume and overwrite:
        raise UserError("--resume continues a run and --overwrite replaces it; give one of them")
    if resume:
        check_resume_config(run_dir, config)
    elif earlier := earlier_run_files(run_dir):
        if not overwrite:
            raise UserError(
                f"{run_dir} already holds a run ({', '.join(earlier)}); pass --resume {run_dir} to continue it, "
                "--overwrite to replace it, or choose another run_dir"
            )
        logger.warning("--overwrite: removing the earlier run's files in %s", run_dir)
        remove_run_files(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        clear_leftovers(run_dir / CHECKPOINT_DIR)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None and (run_dir / "metrics.jsonl").exists():
        logger.warning("no complete checkpoint in %s; starting the run over", run_dir)
    atomic_write_text(run_dir / "config.json", json.dumps(config_to_dict(config), indent=2))
    if checkpoint is None:
        truncate_log(run_dir / RUN_TRAJECTORY_LOG, 0)
    return checkpoint


def sft_finished(run_dir: Path) -> bool:
    """Whether `run_dir` holds a finished SFT model: its marker is written only after the folder is whole."""
    return (run_dir / SFT_DONE_FILE).is_file() and (run_dir / SFT_MODEL_DIR / "config.json").is_file()


def sft_model_ready(run_dir: Path) -> bool:
    """`sft_finished`, and when it is not, remove what a killed SFT left, so SFT is redone on a clean slate."""
    if sft_finished(run_dir):
        return True
    sft_dir = run_dir / SFT_MODEL_DIR
    if sft_dir.exists():
        logger.warning("%s has no %s (its save was interrupted): removing it and redoing SFT", sft_dir, SFT_DONE_FILE)
        shutil.rmtree(sft_dir)
    (run_dir / SFT_DONE_FILE).unlink(missing_ok=True)
    return False


def warmstart_record(run_dir: Path) -> dict:
    """The warm-start's readings, also after a resume (warmstart.json; {} before it is written)."""
    warm = run_dir / WARMSTART_FILE
    return json.loads(warm.read_text()) if warm.exists() else {}


def warmstart_greedy(run_dir: Path) -> float | None:
    """The warm-start's greedy reading, also after a resume (it lives in warmstart.json)."""
    return warmstart_record(run_dir).get("greedy_success_rate")


def save(run: Run, state: JobState) -> None:
    """Checkpoint the job; also records how long trajectories.jsonl is now, so that a resume
    cuts the lines of groups it will generate again (`restore`)."""
    state.wall_s = run.wall_s()
    rollout_state = {
        "next_seed": run.seeds.next_seed,
        "seed_source": run.seeds.state_dict(),
        "buffer": run.buffer.state_dict() if run.buffer else None,
        "trajectories_bytes": log_size(run.run_dir / RUN_TRAJECTORY_LOG),
    }
    # with ranks: every rank's shard gathered into the full state, on this rank (rank 0)
    model_state, optimizer_state = run.ranks.checkpoint_state() if run.ranks else (None, None)
    if model_state is None:  # every weight, or with LoRA the adapters alone
        model_state = run.policy.training_state()
    save_checkpoint(
        run.run_dir,
        state.version,
        model=run.policy.model,
        optimizer=run.optimizer,
        trainer_state=state.as_dict(),
        rollout_state=rollout_state,
        keep_last=run.config.train.keep_checkpoints,
        model_state=model_state,
        optimizer_state=optimizer_state,
    )


async def restore(run: Run, checkpoint: Path, *, print_fn: Callable[[str], None]) -> None:
    """Trainer, optimizer, seed cursor, buffer and logs as they were at `checkpoint`.

    Both logs are cut back to the checkpoint: metrics by step, trajectories.jsonl to the length
    the checkpoint recorded (the groups after it are generated again from the restored seed cursor).
    A "reference" entry of older checkpoints (a KL anchor that had moved) is ignored.
    """
    if run.ranks is not None:  # the full state read here, sharded onto every rank (any world size)
        payload = read_checkpoint(checkpoint)
        run.ranks.load_state(payload["model"], payload["optimizer"])
        set_rng_state(payload["rng"])
    else:
        payload = load_checkpoint(checkpoint, model=run.policy, optimizer=run.optimizer)
    run.state = JobState(**payload["trainer"])
    run.prior_wall_s = run.state.wall_s
    # checkpoints from before seed sources hold next_seed alone
    saved = payload["rollout"]
    run.seeds.load_state_dict(
        {"next_seed": saved.get("next_seed", run.seeds.next_seed), **(saved.get("seed_source") or {})}
    )
    if run.buffer is not None and payload["rollout"].get("buffer"):
        run.buffer.load_state_dict(payload["rollout"]["buffer"])
    run.metrics_log.truncate_after(run.state.version)
    if payload["rollout"].get("trajectories_bytes") is not None:
        truncate_log(run.run_dir / RUN_TRAJECTORY_LOG, payload["rollout"]["trajectories_bytes"])
    await run.engine.update_weights(run.policy.engine_state_dict(), run.state.version)
    print_fn(f"resumed {run.run_dir} at step {run.state.version}")
    warm = run.run_dir / WARMSTART_FILE
    if warm.exists():
        run.state.warmstart_success = json.loads(warm.read_text()).get("success_rate", run.state.warmstart_success)
