"""An asyncio event loop whose clock is simulated: sleeping costs no real time.

Scheduling benchmarks run the real EnvManager / GroupBuffer code against simulated envs
and a simulated engine. On a 2-core machine shared with other jobs, a wall-clock run is at
the mercy of CPU contention; on this loop the clock jumps straight to the next timer
whenever nothing is ready to run, so a 900-second simulated training step takes
milliseconds and the result is deterministic. Everything that waits through the loop
(`asyncio.sleep`, `wait_for`, `call_later`, futures) works unchanged.

Limits: code that waits on something outside the loop (a thread, a subprocess) while a
timer is pending lets simulated time run ahead of it, so only purely simulated components
belong on this loop. `time.monotonic()` stays real: measure with `loop.time()`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class _SkippingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls real I/O without blocking; a wait for a timer advances the simulated clock."""

    loop: VirtualClockEventLoop | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:  # nothing scheduled: only real I/O (a thread's wake-up) can help
            return super().select(None)
        events = super().select(0)
        if not events and timeout > 0 and self.loop is not None:
            self.loop.advance(timeout)
        return events


class VirtualClockEventLoop(asyncio.SelectorEventLoop):
    """`loop.time()` is simulated seconds since the loop was created."""

    def __init__(self) -> None:
        selector = _SkippingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def run_virtual(main: Awaitable[T]) -> T:
    """`asyncio.run` on a fresh virtual-clock loop."""
    with asyncio.Runner(loop_factory=VirtualClockEventLoop) as runner:
        return runner.run(main)  # type: ignore[arg-type]
