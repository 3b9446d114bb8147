"""Checkpoints that survive a kill at any moment.

A checkpoint is a folder `RUN/checkpoints/step-NNNNNN/` holding `state.pt`: model and
optimizer state, trainer counters (step, policy version, totals), every RNG the run draws
from (python, numpy, torch, cuda) and the state of the rollout side (buffer, task cursor)
as the loop hands it over. It is written into a hidden temporary folder, fsynced, and then
renamed into place; a rename is atomic, so a reader sees either the whole checkpoint or
none of it. `latest_checkpoint` ignores leftovers of an interrupted write.

Resume contract: the step after `load_checkpoint` behaves exactly as it would have in the
original run, and metrics logged after the checkpoint are truncated (`MetricsLog.truncate_after`)
so a resumed run neither loses nor double counts a step.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
_PREFIX = "step-"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: dict[str, Any],
    rollout_state: dict[str, Any] | None = None,
    keep_last: int = 2,
) -> Path:
    """Write the checkpoint of `step` atomically and prune older ones (keeping `keep_last`)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:06d}"
    tmp = root / f".tmp-{_PREFIX}{step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    payload = {
        "step": step,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "trainer": trainer_state,
        "rollout": rollout_state or {},
        "rng": rng_state(),
    }
    with open(tmp / "state.pt", "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step after a resume
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("saved checkpoint %s", final)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary leftovers are ignored)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX) and (p / "state.pt").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def load_checkpoint(
    path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, restore_rng: bool = True
) -> dict[str, Any]:
    """Load model/optimizer state in place, restore RNGs; returns the whole payload."""
    payload = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(payload["model"])
    if optimizer is not None and payload.get("optimizer") is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if restore_rng:
        set_rng_state(payload["rng"])
    logger.info("resumed from %s (step %d)", path, payload["step"])
    return payload
