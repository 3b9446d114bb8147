"""What a resumed run may change: the config a `--resume` runs with against the run's config.json.

Why: `rollhub train RECIPE --resume RUN` with a recipe of another model or batch shape used to
overwrite RUN/config.json first and then fail on the checkpoint, leaving a run that no plain
`--resume` could continue either. The check runs before anything in the run folder is
written; a run may change only the knobs below, which decide how long it runs, how it is
logged and checkpointed, how often it is evaluated and how many threads and trainer ranks it
takes, never what it learns from or how.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollhub.core.config import config_to_dict
from rollhub.core.errors import UserError
from rollhub.trainer.config import RunConfig

#: the knobs a resume may change (dotted keys, as in --set); every other key must match the run's
RESUMABLE_KEYS: tuple[str, ...] = (
    "run_dir",  # the run's folder may have been moved or copied
    "train.steps",  # extend (or shorten) a run
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.log_trajectories",
    "train.max_wall_s",
    "train.max_job_wall_s",
    "eval.every",  # evaluation cadence
    "model.threads",
    "engine.threads",
    "sft.threads",
    # a checkpoint holds the full state, so a run resumes on any number of trainer ranks (docs/ray.md)
    "trainer.world_size",
    "trainer.backend",
    "trainer.collective_timeout_s",
    "trainer.ray_num_cpus",
    "trainer.ray_num_gpus",
)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"steps": 5}} -> {"train.steps": 5}; mappings of values (env.kwargs) are flattened too,
    so a changed env argument is named by its own dotted key (an empty one stays a value: {})."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _resumable(key: str) -> bool:
    return key in RESUMABLE_KEYS


def config_changes(saved: dict[str, Any], config: RunConfig) -> list[tuple[str, Any, Any]]:
    """(key, the run's value, the new value) for every key that differs, resumable or not."""
    before, after = flatten(saved), flatten(config_to_dict(config))
    missing = object()
    return [
        (key, before.get(key, missing), after.get(key, missing))
        for key in sorted(set(before) | set(after))
        if before.get(key, missing) != after.get(key, missing)
    ]


def check_resume_config(run_dir: Path, config: RunConfig) -> None:
    """Refuse a resume whose config changes a knob outside RESUMABLE_KEYS (a UserError naming each)."""
    saved_file = run_dir / "config.json"
    if not saved_file.is_file():
        return  # nothing to agree with: a run killed before it wrote its config starts over
    from rollhub.core.config import load_config

    # the run's values with today's defaults filled in, so only a difference in what was set counts
    saved = config_to_dict(load_config(RunConfig, str(saved_file), [f"run_dir={config.run_dir}"]))
    refused = [change for change in config_changes(saved, config) if not _resumable(change[0])]
    if not refused:
        return
    shown = ", ".join(f"{key}: {_show(old)} -> {_show(new)}" for key, old, new in refused[:6])
    more = f" and {len(refused) - 6} more" if len(refused) > 6 else ""
    raise UserError(
        f"--resume {run_dir}: the recipe and --set change what the run trains ({shown}{more}); resume with the run's "
        f"own config (rollhub train --resume {run_dir}), or start a new run_dir. A resume may change only: "
        + ", ".join(key for key in RESUMABLE_KEYS if key != "run_dir")
    )


def _show(value: Any) -> str:
    return "(unset)" if not isinstance(value, (str, int, float, bool, list, dict, type(None))) else json.dumps(value)
