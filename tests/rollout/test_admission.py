"""The producers' shared schedule (rollhub.rollout.admission.fill_buffer) without envs or engines:
slots bound the groups in flight, a stop cancels them and frees their slots, a failure stops
admission and is raised, and a failure future passed in (as RayRollout does) is left alone."""

from __future__ import annotations

import asyncio

import pytest

from rollhub.rollout.admission import fill_buffer
from rollhub.rollout.buffer import GroupBuffer, Ticket
from rollhub.rollout.tasks import TaskOwner
from rollhub.rollout.types import Group


class FakeProducer(TaskOwner):
    def __init__(self, buffer: GroupBuffer, group_s: float = 0.01) -> None:
        self._tasks: set[asyncio.Task] = set()
        self.buffer = buffer
        self.group_s = group_s
        self.failure: BaseException | None = None
        self.started = 0
        self.cancelled = 0

    @property
    def live_tasks(self) -> int:
        return sum(1 for t in self._tasks if not t.done())

    async def produce(self, ticket: Ticket) -> None:
        self.started += 1
        try:
            await asyncio.sleep(self.group_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            self.buffer.release(ticket)
            raise
        ticket.put(Group(group_id=f"g{self.started}", env_id="e", seed=self.started, trajectories=[]))


async def test_fills_to_the_admission_bound_and_a_stop_frees_every_slot():
    buffer = GroupBuffer(2, alpha=1.0)  # (alpha + 1) * B = 4 slots
    producer = FakeProducer(buffer, group_s=60.0)  # groups that never finish on their own
    stop, never = asyncio.Event(), asyncio.get_running_loop().create_future()
    running = asyncio.ensure_future(fill_buffer(producer, buffer, stop, never, producer.produce))
    await asyncio.sleep(0.05)
    assert producer.started == 4 and buffer.in_flight == 4
    stop.set()
    await asyncio.wait_for(running, 5)
    assert producer.cancelled == 4 and buffer.in_flight == 0 and producer.live_tasks == 0
    assert not never.done()  # the producer's own failure future is not cancelled


async def test_a_failure_stops_admission_and_is_raised():
    buffer = GroupBuffer(2, alpha=0.0)
    producer = FakeProducer(buffer)
    failed = asyncio.Event()
    running = asyncio.ensure_future(fill_buffer(producer, buffer, asyncio.Event(), failed.wait(), producer.produce))
    batch = await asyncio.wait_for(buffer.get_batch(0), 5)
    assert len(batch) == 2
    producer.failure = RuntimeError("replacements used up")
    failed.set()
    with pytest.raises(RuntimeError, match="replacements used up"):
        await asyncio.wait_for(running, 5)
    assert buffer.in_flight == 0 and producer.live_tasks == 0
