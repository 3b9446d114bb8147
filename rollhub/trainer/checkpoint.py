"""Checkpoints, and durable writes in general, that survive a kill at any moment.

A checkpoint is a folder `RUN/checkpoints/step-NNNNNN/` holding `state.pt`: model and
optimizer state, trainer counters (step, policy version, totals), every RNG the run draws
from (python, numpy, torch, cuda) and the state of the rollout side (buffer, task cursor,
trajectory-log length) as the loop hands it over; and `manifest.json`, written last, which
names the step and the size of every file. The folder is written under a hidden temporary
name, fsynced, and renamed into place; a rename is atomic, so a reader sees either the whole
checkpoint or none of it.

Nothing is deleted before its replacement is visible (rename, then delete): re-saving a step
that already has a checkpoint publishes the new one as the next revision (`step-NNNNNN.1`) and
only then drops the old one, and rotated folders are first renamed out of sight (`.trash-*`)
so a half-deleted folder is never taken for a checkpoint. `list_checkpoints` accepts a folder
only when its manifest matches its files, and `save_checkpoint` clears leftovers of a killed
write or delete.

`state.pt` holds only tensors and plain Python values (numpy RNG state is converted, trainer
and rollout state go through JSON), so `load_checkpoint` uses `torch.load(weights_only=True)`:
opening a checkpoint never runs pickled code. Checkpoints of earlier versions (no manifest;
they too were published by one rename) still count as complete when their state.pt exists,
and load with the same safe loader, which is allowed numpy arrays for their RNG state.

Resume contract: the step after `load_checkpoint` behaves exactly as it would have in the
original run, and metrics logged after the checkpoint are truncated (`MetricsLog.truncate_after`)
so a resumed run neither loses nor double counts a step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
_PREFIX = "step-"
_TMP = ".tmp-"
_TRASH = ".trash-"


# --- durable files and folders ---------------------------------------------------------


def fsync_dir(path: str | Path) -> None:
    """Make renames and new entries in `path` durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under `root`, then every folder: all of it on disk before a rename publishes it."""
    folders = []
    for folder, _, files in os.walk(root):
        folders.append(folder)
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for folder in reversed(folders):
        fsync_dir(folder)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` in one step: a kill leaves the old content or the new, never a torn file."""
    path = Path(path)
    clear_leftovers(path.parent, path.name)
    tmp = path.with_name(f"{_TMP}{path.name}-{os.getpid()}")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def remove_dir(path: Path) -> None:
    """Rename `path` out of sight, then delete it: a kill mid-delete leaves only a `.trash-` leftover."""
    trash = path.with_name(f"{_TRASH}{path.name}-{os.getpid()}")
    if trash.exists():
        shutil.rmtree(trash)
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def clear_leftovers(parent: Path, name: str = "") -> None:
    """Delete `.tmp-`/`.trash-` entries (of `name`, or all) that a killed write or delete left in `parent`."""
    if not parent.is_dir():
        return
    prefixes = (f"{_TMP}{name}-", f"{_TRASH}{name}-") if name else (_TMP, _TRASH)
    for entry in parent.iterdir():
        if entry.name.startswith(prefixes):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


@contextlib.contextmanager
def staged_dir(final: str | Path) -> Iterator[Path]:
    """A temporary sibling of `final` to write into; on success it is fsynced and renamed to `final`.

    An existing `final` is renamed away only after the new folder is complete on disk and deleted
    only after the new one is in place. Between those two renames `final` is briefly absent, so a
    caller that must know the folder is whole (the SFT model) writes a marker after this returns.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    clear_leftovers(final.parent, final.name)
    tmp = final.with_name(f"{_TMP}{final.name}-{os.getpid()}")
    tmp.mkdir()
    try:
        yield tmp
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.with_name(f"{_TRASH}{final.name}-{os.getpid()}")
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


# --- RNG state as plain values -----------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every RNG the run draws from, as tensors and plain values (loadable with weights_only=True)."""
    numpy_state = np.random.get_state(legacy=False)
    inner = numpy_state["state"]
    state = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": str(numpy_state["bit_generator"]),
            "state": {"key": [int(k) for k in inner["key"]], "pos": int(inner["pos"])},
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    if isinstance(numpy_state, dict):  # a tuple with an array in checkpoints of earlier versions
        inner = numpy_state["state"]
        numpy_state = {**numpy_state, "state": {"key": np.asarray(inner["key"], dtype=np.uint32), "pos": inner["pos"]}}
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _plain(value: Any) -> Any:
    """`value` as JSON types (tuples become lists, dict keys strings): fails at save time, not at
    resume, when something in it could not be loaded back safely."""
    return json.loads(json.dumps(value))


# --- checkpoints -----------------------------------------------------------------------


def _parse_name(name: str) -> tuple[int, int] | None:
    """(step, revision) of `step-NNNNNN` or `step-NNNNNN.R`; None for anything else."""
    if not name.startswith(_PREFIX):
        return None
    step, _, revision = name[len(_PREFIX) :].partition(".")
    if not step.isdigit() or not (revision == "" or revision.isdigit()):
        return None
    return int(step), int(revision or 0)


def _is_complete(folder: Path) -> bool:
    """Every file the manifest (written last) names has the size it records; without a manifest
    (earlier versions) state.pt must exist."""
    if not (folder / MANIFEST_FILE).exists():
        return (folder / STATE_FILE).is_file()
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        files = manifest["files"]
        return bool(files) and all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_checkpoint(folder: Path, step: int, payload: dict[str, Any]) -> None:
    """state.pt, fsynced, then the manifest that vouches for it, then the folder itself."""
    with open(folder / STATE_FILE, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    manifest = {"step": step, "files": {STATE_FILE: (folder / STATE_FILE).stat().st_size}}
    with open(folder / MANIFEST_FILE, "w") as handle:
        json.dump(manifest, handle)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(folder)


def _next_name(root: Path, step: int) -> str:
    """`step-NNNNNN`, or the next revision when that step already has a checkpoint."""
    revisions = [parsed[1] for p in root.iterdir() if (parsed := _parse_name(p.name)) and parsed[0] == step]
    base = f"{_PREFIX}{step:06d}"
    return base if not revisions else f"{base}.{max(revisions) + 1}"


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: dict[str, Any],
    rollout_state: dict[str, Any] | None = None,
    keep_last: int = 2,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of `step` atomically, then prune older ones (keeping `keep_last`).

    `model_state` / `optimizer_state`, when given, are written instead of `model.state_dict()` /
    `optimizer.state_dict()`: trainer ranks gather their shards into these full states on rank 0
    (rollhub.trainer.ranks.group.full_training_state), in the same format, so any world size
    can resume the checkpoint.
    """
    root = Path(run_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    clear_leftovers(root)
    if model_state is None:
        model_state = model.state_dict()
    if optimizer_state is None and optimizer is not None:
        optimizer_state = optimizer.state_dict()
    payload = {
        "step": step,
        "model": {k: v.detach().cpu() for k, v in model_state.items()},
        "optimizer": optimizer_state,
        "trainer": _plain(trainer_state),
        "rollout": _plain(rollout_state or {}),
        "rng": rng_state(),
    }
    final = root / _next_name(root, step)
    tmp = root / f"{_TMP}{final.name}-{os.getpid()}"
    tmp.mkdir()
    _write_checkpoint(tmp, step, payload)
    os.rename(tmp, final)
    fsync_dir(root)
    _prune(root, keep_last)
    logger.info("saved checkpoint %s", final)
    return final


def _prune(root: Path, keep_last: int) -> None:
    """Remove superseded revisions and all but the newest `keep_last` steps (after the new one is visible)."""
    newest: dict[int, Path] = {}
    for path in _candidates(root):  # oldest first, so the last complete revision of a step wins
        if _is_complete(path):
            newest[_parse_name(path.name)[0]] = path
    keep = set(list(newest.values())[-keep_last:] if keep_last > 0 else newest.values())
    for path in _candidates(root):
        if path not in keep:
            remove_dir(path)


def _candidates(root: Path) -> list[Path]:
    """Checkpoint-named folders, by (step, revision), complete or not."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _parse_name(p.name) is not None]
    return sorted(found, key=lambda p: _parse_name(p.name))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (leftovers and folders whose manifest does not match are ignored)."""
    return [p for p in _candidates(Path(run_dir) / CHECKPOINT_DIR) if _is_complete(p)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def load_checkpoint(
    path: str | Path, *, model: Any, optimizer: torch.optim.Optimizer | None, restore_rng: bool = True
) -> dict[str, Any]:
    """Load model/optimizer state in place, restore RNGs; returns the whole payload.

    `model`: a module, or a Policy (whose `load_training_state` takes a LoRA run's adapters alone).
    `weights_only=True`: a checkpoint is data; loading one cannot execute code from the file.
    """
    payload = read_checkpoint(path)
    load = getattr(model, "load_training_state", None) or model.load_state_dict
    load(payload["model"])
    if optimizer is not None and payload.get("optimizer") is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if restore_rng:
        set_rng_state(payload["rng"])
    logger.info("resumed from %s (step %d)", path, payload["step"])
    return payload


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The payload of a checkpoint folder (CPU tensors and plain values), loaded with the safe loader."""
    with torch.serialization.safe_globals(_numpy_array_globals()):
        return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)


def _numpy_array_globals() -> list[Any]:
    """What unpickling a numpy array needs (data, not code): the RNG state in checkpoints of earlier versions."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
