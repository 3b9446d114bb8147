"""Finding ALFWorld game files: data root, splits and task-type filters.

Games live in the layout `alfworld-download` produces under `$ALFWORLD_DATA`:
`json_2.1.1/<split>/<task_type>-<Obj>-<MRecep>-<Recep>-<scene>/<trial>/game.tw-pddl`. When
`ALFWORLD_DATA` is unset we use the copy of the 134 valid_unseen games shipped in this
folder (`data/`), so a fresh clone can play and test without any download.

This module imports nothing from the engine: the client process only needs paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rollhub.core.errors import UserError

#: the copy of valid_unseen that ships with the repo
BUNDLED_DATA = Path(__file__).resolve().parent / "data"
DATA_VERSION_DIR = "json_2.1.1"
GAME_FILE = "game.tw-pddl"

#: ALFWorld's split names, with the names `AlfredTWEnv` uses for them
SPLITS = {
    "train": "train",
    "valid_seen": "eval_in_distribution",
    "valid_unseen": "eval_out_of_distribution",
    "valid_train": "valid_train",
}

#: ALFWorld's numbering of the six task types (config `env.task_types`)
TASK_TYPES = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}


@dataclass(frozen=True)
class GameRecord:
    """One playable game: the file, its task type, and a stable short name."""

    path: Path
    task_type: str
    #: `<task folder>/<trial>`, unique within a split and stable across machines
    name: str


def data_root() -> Path:
    """`$ALFWORLD_DATA` if set, else the bundled copy."""
    configured = os.environ.get("ALFWORLD_DATA")
    return Path(configured).expanduser() if configured else BUNDLED_DATA


def normalise_task_types(task_types: list[int | str] | tuple[int | str, ...] | None) -> tuple[str, ...]:
    """Accept ALFWorld's ids (1-6) or names; return names. None means all six."""
    if not task_types:
        return tuple(TASK_TYPES.values())
    names = []
    for item in task_types:
        if isinstance(item, int) or (isinstance(item, str) and item.isdigit()):
            key = int(item)
            if key not in TASK_TYPES:
                raise UserError(
                    f"unknown ALFWorld task type id {key}; use 1-6 or a name from {sorted(TASK_TYPES.values())}"
                )
            names.append(TASK_TYPES[key])
        elif item in TASK_TYPES.values():
            names.append(item)
        else:
            raise UserError(f"unknown ALFWorld task type '{item}'; use 1-6 or one of {sorted(TASK_TYPES.values())}")
    return tuple(dict.fromkeys(names))


def task_type_of(task_folder_name: str) -> str:
    """`pick_two_obj_and_place-CD-None-Safe-309` -> `pick_two_obj_and_place`."""
    return task_folder_name.split("-", 1)[0]


def split_dir(split: str, root: Path | None = None) -> Path:
    """Folder of one split; a clear error when it is missing."""
    if split not in SPLITS:
        raise UserError(f"unknown ALFWorld split '{split}'; choose one of {sorted(SPLITS)}")
    root = root if root is not None else data_root()
    folder = root / DATA_VERSION_DIR / split
    if not folder.is_dir():
        if split == "train":
            hint = "make it with 'rollhub alfworld make-games' (500 planner-checked games, resumable)"
            if root != BUNDLED_DATA:
                hint += " or point ALFWORLD_DATA at a full alfworld-download folder"
        elif root == BUNDLED_DATA:
            hint = "this repo ships only valid_unseen; point ALFWORLD_DATA at a full alfworld-download folder"
        else:
            hint = "check ALFWORLD_DATA (it should hold json_2.1.1/<split>/...)"
        raise UserError(f"ALFWorld split '{split}' not found at {folder}: {hint}")
    return folder


def list_games(
    split: str = "valid_unseen",
    task_types: list[int | str] | tuple[int | str, ...] | None = None,
    root: Path | None = None,
) -> list[GameRecord]:
    """All games of a split (sorted by name, so indices are stable), filtered by task type."""
    wanted = set(normalise_task_types(task_types))
    folder = split_dir(split, root)
    games = []
    for path in sorted(folder.glob(f"*/*/{GAME_FILE}")):
        task_type = task_type_of(path.parent.parent.name)
        if task_type in wanted:
            games.append(
                GameRecord(path=path, task_type=task_type, name=f"{path.parent.parent.name}/{path.parent.name}")
            )
    if not games:
        raise UserError(f"no ALFWorld games of types {sorted(wanted)} under {folder}")
    return games


def list_game_dir(directory: str | Path) -> list[GameRecord]:
    """Games in any folder (e.g. the output of `rollhub alfworld make-games`), searched recursively."""
    folder = Path(directory).expanduser()
    if not folder.is_dir():
        raise UserError(f"ALFWorld game folder {folder} does not exist")
    games = []
    for path in sorted(folder.rglob(f"*{GAME_FILE}")):
        parent = path.parent.parent.name if path.name == GAME_FILE else path.stem
        task_type = task_type_of(parent)
        name = str(path.relative_to(folder).parent if path.name == GAME_FILE else path.relative_to(folder))
        games.append(GameRecord(path=path, task_type=task_type, name=name))
    if not games:
        raise UserError(f"no '{GAME_FILE}' files under {folder}")
    return games
