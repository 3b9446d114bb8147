"""JSONL trajectory log: one line per kept trajectory, appended as groups finish."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollhub.rollout.serialization import trajectory_from_dict, trajectory_to_dict
from rollhub.rollout.types import Group, Trajectory


class TrajectoryWriter:
    """Appends trajectories to `path` (created with its folder); flushes after each group."""

    def __init__(self, path: str | Path, *, include_text: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self.include_text = include_text
        self.lines = 0

    def write_group(self, group: Group, extra: dict[str, Any] | None = None) -> None:
        for trajectory in group.trajectories:
            self.write(trajectory, extra)
        self._file.flush()

    def write(self, trajectory: Trajectory, extra: dict[str, Any] | None = None) -> None:
        record = trajectory_to_dict(trajectory)
        if not self.include_text:
            for turn in record["turns"]:
                turn.pop("observation", None)
        if extra:
            record.update(extra)
        self._file.write(json.dumps(record) + "\n")
        self.lines += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield trajectory_from_dict(json.loads(line))
