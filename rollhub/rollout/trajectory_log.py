"""JSONL trajectory log: one line per kept trajectory, appended as groups finish.

A training run resumes from a checkpoint, so its log must end where the checkpoint does:
the trainer records `log_size` of the file when it saves and calls `truncate_log` with that
size when it resumes, which drops the lines of groups that the resumed run generates again
(exact, whatever the lines hold). A kill can also tear the last line; `drop_torn_tail`
cuts it before the file is appended to, so the next line is not glued onto the torn one.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollhub.rollout.serialization import trajectory_from_dict, trajectory_to_dict
from rollhub.rollout.types import Group, Trajectory

#: a run folder's trajectory log: written by the env manager, cut back on resume, read by `rollhub view`
RUN_TRAJECTORY_LOG = "trajectories.jsonl"

logger = logging.getLogger(__name__)


class TrajectoryWriter:
    """Appends trajectories to `path` (created with its folder); flushes after each group.

    A group is written whole before `write_group` returns, so the file size between two calls
    (what `log_size` reads) always ends on a group boundary.
    """

    def __init__(self, path: str | Path, *, include_text: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        drop_torn_tail(self.path)
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


def drop_torn_tail(path: str | Path) -> int:
    """Cut a last line that has no newline (a kill mid-write); returns the bytes dropped.

    Appending after a torn line would fuse it with the next record and lose both.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    with path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        end = size
        while end > 0:
            start = max(0, end - 65536)
            handle.seek(start)
            newline = handle.read(end - start).rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        if end < size:
            handle.truncate(end)
            logger.warning("dropped a torn last line (%d bytes) of %s", size - end, path)
    return size - end


def log_size(path: str | Path) -> int:
    """Bytes of `path` made durable now (0 when absent): the length a checkpoint records.

    The fsync makes the recorded length survive a crash, so a later `truncate_log` never finds
    the file shorter than its checkpoint said.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def truncate_log(path: str | Path, size: int) -> int:
    """Cut `path` back to `size` bytes (what a checkpoint recorded); returns the bytes dropped."""
    path = Path(path)
    current = path.stat().st_size if path.is_file() else 0
    if current < size:
        logger.warning("%s has %d bytes, fewer than the %d its checkpoint recorded", path, current, size)
        return 0
    if current > size:
        with path.open("rb+") as handle:
            handle.truncate(size)
            handle.flush()
            os.fsync(handle.fileno())
        logger.info("dropped %d bytes of %s written after the checkpoint", current - size, path)
    return current - size
