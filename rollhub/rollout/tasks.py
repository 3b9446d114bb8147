"""Owning asyncio tasks: spawn them tracked, cancel them and wait until they are gone.

Shared by the env manager and the Ray driver: both must be able to cancel everything they
started (redundant stragglers, shutdown) and know that no task outlives them.
"""

from __future__ import annotations

import asyncio
from typing import Any


class TaskOwner:
    """Mixin: `self._tasks` holds every live task started with `_spawn`."""

    _tasks: set[asyncio.Task]

    def _spawn(self, coroutine: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _cancel(self, tasks: set[asyncio.Task]) -> None:
        """Cancel `tasks` and wait for all of them to finish (their errors are swallowed)."""
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
