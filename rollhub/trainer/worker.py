"""The trainer's one compute thread, and giving freed heap back to the OS after each step.

The heavy tensor work of a step runs off the event loop (envs keep stepping meanwhile).
`asyncio.to_thread` would hand each call to whichever pool thread is free, and glibc gives
every thread its own malloc arena; each arena keeps the high-water mark of the activations
it once held, so RSS grows step after step while live tensors stay small. One dedicated
thread plus `malloc_trim(0)` after every step keeps RSS at one step's peak.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim  # glibc only; musl and macOS have none
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Return free heap pages to the OS (glibc); False where the call does not exist."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class ComputeThread:
    """A single worker thread for the trainer's tensor work, awaited from the event loop."""

    def __init__(self, name: str = "trainer") -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=True)
