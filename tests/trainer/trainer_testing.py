"""Helpers shared by the trainer tests (imported by name: pytest puts this folder on sys.path)."""

from pathlib import Path

import yaml


def tiny_recipe(tmp_path: Path, model_dir: Path, **sections) -> Path:
    """A `rollhub train` recipe for the tiny model: 2 steps of 2 groups x 2 on 3-move Sokoban, no SFT;
    each keyword replaces (or, for a mapping, updates) one section."""
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
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
