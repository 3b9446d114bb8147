"""GroupBuffer: bounded-staleness hand-off of groups from the env manager to the trainer.

Rule:
* admission: at most floor((α+1)·B) groups are in flight (admitted, still generating) plus
  buffered (finished, not yet consumed) while the trainer waits for a batch, and B fewer
  while it trains on the batch it took: a group admitted then runs on weights that are
  already one version behind the next batch, so the full (α+1)·B would admit a batch that
  can only arrive α + 1 versions late and be dropped (generation wasted on a trainer-bound
  run). α may be fractional. α = 0 means the manager never runs ahead of the batch the trainer
  is about to take, and generates nothing while it trains.
* consumption: `get_batch(trainer_version)` returns B groups oldest first and drops
  (and counts) any group whose oldest token is more than ⌈α⌉ versions behind.
* every consumed token adds to a staleness histogram (trainer version − token version).

Producers use `async with buffer.admit() as ticket: ... ticket.put(group)`; a ticket that
leaves the block without a group (cancelled, failed) frees its slot.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from rollhub.rollout.serialization import group_from_dict, group_to_dict
from rollhub.rollout.types import Group


@dataclass
class Ticket:
    """One admitted slot; `put` hands the finished group to the buffer."""

    buffer: GroupBuffer
    admitted_version: int
    used: bool = False
    released: bool = False

    def put(self, group: Group) -> None:
        self.buffer.put(group, ticket=self)


class GroupBuffer:
    def __init__(self, batch_size_groups: int, alpha: float = 0.0) -> None:
        if batch_size_groups < 1:
            raise ValueError("batch_size_groups must be >= 1")
        if alpha < 0:
            raise ValueError("alpha must be >= 0 (0 = synchronous)")
        self.batch_size = batch_size_groups
        self.alpha = float(alpha)
        self.capacity = max(batch_size_groups, math.floor((self.alpha + 1.0) * batch_size_groups + 1e-9))
        self.max_lag = math.ceil(self.alpha - 1e-9)
        self.trainer_version = 0
        self._groups: collections.deque[Group] = collections.deque()
        self._in_flight = 0
        self._trainer_holds_batch = False  # between get_batch() and the trainer's next call
        self._changed = asyncio.Event()
        # metrics
        self.dropped_stale = 0
        self.consumed_groups = 0
        self.put_groups = 0
        self.consumer_wait_s = 0.0
        self.peak_occupancy = 0  # max of in_flight + buffered ever observed
        self.staleness_histogram: collections.Counter[int] = collections.Counter()
        self.last_batch_staleness: collections.Counter[int] = collections.Counter()

    # --- producer side ---------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def buffered(self) -> int:
        return len(self._groups)

    @property
    def occupancy(self) -> int:
        return self._in_flight + len(self._groups)

    def admission_limit(self) -> int:
        """The occupancy bound right now (see the module docstring)."""
        return self.capacity - (self.batch_size if self._trainer_holds_batch else 0)

    def has_room(self) -> bool:
        return self.occupancy < self.admission_limit()

    async def acquire(self) -> Ticket:
        """Wait for a free slot and take it."""
        await self._wait_for(self.has_room)
        self._in_flight += 1  # no await between the check and the increment: atomic in asyncio
        self._note_occupancy()
        return Ticket(self, self.trainer_version)

    def release(self, ticket: Ticket) -> None:
        """Give back a slot whose group will never arrive."""
        if ticket.used or ticket.released:
            return
        ticket.released = True
        self._in_flight -= 1
        self._notify()

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[Ticket]:
        ticket = await self.acquire()
        try:
            yield ticket
        finally:
            self.release(ticket)

    def put(self, group: Group, ticket: Ticket | None = None) -> None:
        """Add a finished group (moving its slot from in-flight to buffered)."""
        if ticket is not None:
            if ticket.used or ticket.released:
                raise RuntimeError("ticket already used or released")
            ticket.used = True
            self._in_flight -= 1
            group.created_version = ticket.admitted_version
        self.put_groups += 1
        if self.is_stale(group, self.trainer_version):
            self.dropped_stale += 1  # already too old on arrival
        else:
            self._groups.append(group)
        self._note_occupancy()
        self._notify()

    # --- consumer side ---------------------------------------------------------------

    def is_stale(self, group: Group, trainer_version: int) -> bool:
        oldest = group.oldest_version
        return oldest is not None and trainer_version - oldest > self.max_lag

    async def get_batch(self, trainer_version: int, timeout_s: float | None = None) -> list[Group]:
        """B groups, oldest first, after dropping the too-stale ones; waits until available."""
        self.set_trainer_version(trainer_version)
        if self._trainer_holds_batch:
            self._trainer_holds_batch = False  # the previous batch is done with: room again
            self._notify()
        started = time.perf_counter()
        try:
            await asyncio.wait_for(self._wait_for(self._ready), timeout=timeout_s)
            batch = [self._groups.popleft() for _ in range(self.batch_size)]
            self._trainer_holds_batch = True
            self._notify()
        finally:
            self.consumer_wait_s += time.perf_counter() - started
        self.consumed_groups += len(batch)
        self.last_batch_staleness = collections.Counter()
        versions: collections.Counter[int] = collections.Counter()
        for group in batch:
            for trajectory in group.trajectories:
                for turn in trajectory.turns:
                    versions.update(turn.token_versions)  # C-speed counting; hot path at scale
        for version, count in versions.items():
            self.last_batch_staleness[trainer_version - version] += count
        self.staleness_histogram.update(self.last_batch_staleness)
        return batch

    def set_trainer_version(self, version: int) -> None:
        """Tell the buffer the trainer's version (drops groups that became too stale).

        Staleness can only change here or when a group arrives (checked in `put`), so the
        buffered groups are rescanned once per version, never on every wake-up."""
        changed = version != self.trainer_version
        self.trainer_version = version
        if changed:
            self._drop_stale()

    def _ready(self) -> bool:
        return len(self._groups) >= self.batch_size

    def _drop_stale(self) -> None:
        kept = collections.deque(g for g in self._groups if not self.is_stale(g, self.trainer_version))
        dropped = len(self._groups) - len(kept)
        if dropped:
            self.dropped_stale += dropped
            self._groups = kept
            self._notify()

    # --- misc ------------------------------------------------------------------------

    def _note_occupancy(self) -> None:
        self.peak_occupancy = max(self.peak_occupancy, self.occupancy)

    def _notify(self) -> None:
        self._changed.set()  # wakes every current waiter; each re-checks its own predicate

    async def _wait_for(self, predicate: Any) -> None:
        while not predicate():
            self._changed.clear()
            await self._changed.wait()

    def metrics(self) -> dict[str, Any]:
        total = sum(self.staleness_histogram.values())
        mean = sum(k * v for k, v in self.staleness_histogram.items()) / total if total else 0.0
        return {
            "buffer/capacity": self.capacity,
            "buffer/admission_limit": self.admission_limit(),
            "buffer/in_flight": self.in_flight,
            "buffer/buffered": self.buffered,
            "buffer/peak_occupancy": self.peak_occupancy,
            "buffer/dropped_stale": self.dropped_stale,
            "buffer/consumed_groups": self.consumed_groups,
            "buffer/consumer_wait_s": self.consumer_wait_s,
            "staleness/mean": mean,
            "staleness/max": max(self.staleness_histogram) if total else 0,
            "staleness/histogram": {str(k): v for k, v in sorted(self.staleness_histogram.items())},
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters and buffered groups (in-flight groups are lost on restart by design)."""
        return {
            "batch_size": self.batch_size,
            "alpha": self.alpha,
            "trainer_version": self.trainer_version,
            "groups": [group_to_dict(g) for g in self._groups],
            "dropped_stale": self.dropped_stale,
            "consumed_groups": self.consumed_groups,
            "put_groups": self.put_groups,
            "consumer_wait_s": self.consumer_wait_s,
            "staleness_histogram": {str(k): v for k, v in self.staleness_histogram.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["batch_size"] != self.batch_size or state["alpha"] != self.alpha:
            raise ValueError(
                f"buffer checkpoint has B={state['batch_size']}, alpha={state['alpha']}; "
                f"this buffer has B={self.batch_size}, alpha={self.alpha}"
            )
        self.trainer_version = state["trainer_version"]
        self._groups = collections.deque(group_from_dict(g) for g in state["groups"])
        self.dropped_stale = state["dropped_stale"]
        self.consumed_groups = state["consumed_groups"]
        self.put_groups = state["put_groups"]
        self.consumer_wait_s = state["consumer_wait_s"]
        self.staleness_histogram = collections.Counter({int(k): v for k, v in state["staleness_histogram"].items()})
