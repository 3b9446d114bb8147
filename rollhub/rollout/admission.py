"""The producer's schedule, written once: take a buffer slot, start a group on it, repeat.

`EnvManager.run` (groups as coroutines of this process) and `RayRollout.run` (groups on
env-shard actors) differ only in how one group is produced, so both hand that coroutine to
`fill_buffer`, and the admission bound (rollhub.rollout.buffer), the stop and the failure
handling are the same code for one machine and many.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from rollhub.rollout.buffer import GroupBuffer, Ticket


class Producer(Protocol):
    """A rollout source that owns its tasks (rollhub.rollout.tasks.TaskOwner) and may fail."""

    @property
    def failure(self) -> BaseException | None: ...

    def _spawn(self, coroutine: Any) -> asyncio.Task: ...

    async def _cancel(self, tasks: set[asyncio.Task]) -> None: ...


async def fill_buffer(
    producer: Producer,
    buffer: GroupBuffer,
    stop_event: asyncio.Event,
    failed: Awaitable[Any],
    produce_group: Callable[[Ticket], Awaitable[Any]],
) -> None:
    """Keep `buffer` full until `stop_event` is set or the producer fails, then cancel every group
    it started (their tickets free their slots) and raise `producer.failure`, if any.

    `failed` completes when `producer.failure` is set, so a producer waiting for a slot stops at
    once; `produce_group(ticket)` runs one group and puts it with the ticket (or releases it).
    """
    groups: set[asyncio.Task] = set()
    stopper = asyncio.ensure_future(stop_event.wait())
    waker = asyncio.ensure_future(failed)
    try:
        while not stop_event.is_set() and producer.failure is None:
            acquire = asyncio.ensure_future(buffer.acquire())
            await asyncio.wait({acquire, stopper, waker}, return_when=asyncio.FIRST_COMPLETED)
            if not acquire.done():
                acquire.cancel()
                await asyncio.gather(acquire, return_exceptions=True)
                break
            ticket = acquire.result()
            if producer.failure is not None:
                buffer.release(ticket)
                break
            task = producer._spawn(produce_group(ticket))
            groups.add(task)
            task.add_done_callback(groups.discard)
    finally:
        stopper.cancel()
        if waker is not failed:  # a wrapper of ours; a future the producer passed in is its own
            waker.cancel()
        await producer._cancel(set(groups))
    if producer.failure is not None:
        raise producer.failure
