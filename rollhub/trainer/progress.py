"""The progress a job shows: one `rich` display with a bar per long phase (SFT, readings, RL),
or nothing at all with `--no-progress`.

Why one place: a phase longer than a few seconds that shows nothing looks hung to a newcomer
(a held-out reading of 100 episodes, SFT, a model export), and other libraries' own bars
(transformers' "Loading weights" on every weight load) drown ours, so they are silenced here.
A phase that ends early says why on its bar (`stop`), so the RL bar does not sit at 15/60.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


def silence_library_progress() -> None:
    """No progress bars of transformers or huggingface_hub: loads and saves are phases of ours, shown by
    our bars, and theirs (one per weight load) flood a log."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover - a dependency of transformers
        pass
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


class PhaseBar:
    """One phase's bar; every method does nothing on a disabled display."""

    def __init__(self, progress: Any = None, task: Any = None):
        self._progress, self._task = progress, task

    def advance(self, steps: int = 1, info: str | None = None) -> None:
        if self._progress is not None:
            fields = {} if info is None else {"info": info}
            self._progress.update(self._task, advance=steps, **fields)

    def update(self, *, completed: int | None = None, total: int | None = None, info: str | None = None) -> None:
        if self._progress is not None:
            fields = {} if info is None else {"info": info}
            self._progress.update(self._task, completed=completed, total=total, **fields)

    def stop(self, reason: str) -> None:
        """The phase ended before its total: the bar says why instead of freezing where it stopped."""
        if self._progress is not None:
            self._progress.update(self._task, info=f"stopped: {reason}")
            self._progress.stop_task(self._task)


class JobProgress:
    """The job's display (`with JobProgress(enabled): ...`); `phase` adds one bar per phase."""

    def __init__(self, enabled: bool = True, *, console: Any = None):
        self.enabled = enabled
        self._progress: Any = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
            )

    def __enter__(self) -> JobProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextlib.contextmanager
    def phase(self, description: str, total: int | None = None, *, completed: int = 0) -> Iterator[PhaseBar]:
        """A bar for the `with` block; it stays on screen after, with its last count and info."""
        if self._progress is None:
            yield PhaseBar()
            return
        task = self._progress.add_task(description, total=total, completed=completed, info="")
        try:
            yield PhaseBar(self._progress, task)
        finally:
            self._progress.stop_task(task)


#: the display of code that was given none (library calls, tests): no bars
NO_PROGRESS = JobProgress(enabled=False)
