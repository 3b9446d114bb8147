"""GroupBuffer: bounded-staleness hand-off of groups from the env manager to the trainer.

Rule:
* admission: at most floor((α+1)·B) groups are in flight (admitted, still generating) plus
  buffered (finished, not yet consumed) while the trainer waits for a batch, and B fewer
  while it trains on the batch it took: a group admitted then runs on weights that are
  already one version behind the next batch, so the full (α+1)·B would admit a batch that
  can only arrive α + 1 versions late and be dropped (generation wasted on a trainer-bound
  run). α may be fractional. α = 0 means the manager never runs ahead of the batch the trainer
  is about to take, and generates nothing while it trains.
* redundant groups (`configure(redundant_groups=g)`): g more slots on top of that bound;
  the first B groups to finish make a batch and the others stay buffered for the next one,
  so no group is thrown away for being slow (slow usually means hard: discarding late
  groups would train on easy tasks more often than they occur). A carried group is a
  version old at the next batch, so with redundant slots the lag bound below is at least 1,
  even at α = 0.
* consumption: `get_batch(trainer_version)` returns the B oldest groups (by the rule below,
  not by arrival) and drops
  (and counts) any group more than ⌈α⌉ versions behind (max(⌈α⌉, 1) with redundant
  groups), judged by `staleness_rule`:
  - `newest` (default): by its newest token. An episode whose turns were generated
    across several updates (each partial rollout resumed on the new weights, its tokens
    stamped with the version that produced them) is kept as long as it is still being
    generated on recent weights, so slow tasks (usually the hard ones) are not dropped more
    often than fast ones: with `token_mean` or `oldest`, async training trains the slowest
    quarter of tasks at half their share or never (`rollhub bench redundancy-bias`). Its
    older tokens are corrected per token like any off-policy token;
  - `token_mean`: trainer version − the token-weighted mean version of the group's
    response tokens;
  - `oldest`: by its oldest token (the strictest; drops every episode that spans more than
    ⌈α⌉ + 1 versions however few of its tokens are old).
  Whatever the rule, each token keeps its own version and behaviour log-prob, and the
  trainer's off-policy correction weights every token by its own ratio.
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
from typing import Any, Literal

from rollhub.rollout.serialization import group_from_dict, group_to_dict
from rollhub.rollout.types import Group

StalenessRule = Literal["token_mean", "newest", "oldest"]
STALENESS_RULES: tuple[str, ...] = ("token_mean", "newest", "oldest")


def group_version(group: Group, rule: str) -> float | None:
    """The policy version a group is judged by under `rule` (module docstring); None without tokens."""
    if rule == "token_mean":
        return group.token_mean_version
    if rule == "newest":
        return group.newest_version
    if rule == "oldest":
        return group.oldest_version
    raise ValueError(f"staleness_rule must be one of {', '.join(STALENESS_RULES)}, got {rule!r}")


def carried_lag_bound(alpha: float, redundant_groups: int) -> int:
    """How many versions a consumed group may lag the trainer: ⌈α⌉, and at least 1 with redundant groups.

    A redundant group exists to be carried into the next batch when it finishes after the first
    B (that is the difference from cancelling it). Carried over one trainer step, its tokens are
    one version old, so with α = 0 a bound of ⌈α⌉ = 0 would drop every group that finishes
    while the trainer steps: the slow (usually hard) tasks, exactly the bias carrying avoids.
    Each token keeps its own version and is corrected like any off-policy token."""
    lag = math.ceil(alpha - 1e-9)
    return max(lag, 1) if redundant_groups > 0 else lag


@dataclass
class Ticket:
    """One admitted slot; `put` hands the finished group to the buffer."""

    buffer: GroupBuffer
    admitted_version: int
    used: bool = False
    admission_index: int = 0
    released: bool = False

    def put(self, group: Group) -> None:
        self.buffer.put(group, ticket=self)


class GroupBuffer:
    def __init__(
        self,
        batch_size_groups: int,
        alpha: float = 0.0,
        *,
        redundant_groups: int = 0,
        staleness_rule: StalenessRule = "newest",
    ) -> None:
        if batch_size_groups < 1:
            raise ValueError("batch_size_groups must be >= 1")
        if alpha < 0:
            raise ValueError("alpha must be >= 0 (0 = synchronous)")
        self.batch_size = batch_size_groups
        self.alpha = float(alpha)
        self.base_capacity = max(batch_size_groups, math.floor((self.alpha + 1.0) * batch_size_groups + 1e-9))
        self.capacity = self.base_capacity
        self.redundant_groups = 0
        self.staleness_rule: str = "newest"
        self.max_lag = carried_lag_bound(self.alpha, 0)
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
        self.kept_by_rule = 0  # consumed groups the oldest-token rule would have dropped
        self.carried_groups = 0  # groups left buffered after a batch was taken (summed over batches)
        self._admissions = 0
        self.configure(redundant_groups=redundant_groups, staleness_rule=staleness_rule)

    def configure(self, *, redundant_groups: int = 0, staleness_rule: str = "newest") -> None:
        """Redundant group slots (on top of the α bound) and the staleness rule; see the module docstring."""
        if redundant_groups < 0:
            raise ValueError(f"redundant_groups must be >= 0, got {redundant_groups}")
        group_version(Group("", "", None, []), staleness_rule)  # refuses an unknown rule
        self.redundant_groups = redundant_groups
        self.capacity = self.base_capacity + redundant_groups
        self.max_lag = carried_lag_bound(self.alpha, redundant_groups)
        self.staleness_rule = staleness_rule
        self._notify()

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
        self._admissions += 1
        return Ticket(self, self.trainer_version, admission_index=self._admissions)

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
            group.admission_index = ticket.admission_index
        self.put_groups += 1
        if self.is_stale(group, self.trainer_version):
            self.dropped_stale += 1  # already too old on arrival
        else:
            self._groups.append(group)
        self._note_occupancy()
        self._notify()

    # --- consumer side ---------------------------------------------------------------

    def is_stale(self, group: Group, trainer_version: int) -> bool:
        """More than ⌈α⌉ versions behind under `staleness_rule` (a group without tokens never is)."""
        version = group_version(group, self.staleness_rule)
        return version is not None and trainer_version - version > self.max_lag + 1e-9

    async def get_batch(self, trainer_version: int, timeout_s: float | None = None) -> list[Group]:
        """B groups, oldest first, after dropping the too-stale ones; waits until available."""
        self.set_trainer_version(trainer_version)
        if self._trainer_holds_batch:
            self._trainer_holds_batch = False  # the previous batch is done with: room again
            self._notify()
        started = time.perf_counter()
        try:
            await asyncio.wait_for(self._wait_for(self._ready), timeout=timeout_s)
            batch = self._take_oldest(self.batch_size)
            self._trainer_holds_batch = True
            self._notify()
        finally:
            self.consumer_wait_s += time.perf_counter() - started
        self.consumed_groups += len(batch)
        self.carried_groups += len(self._groups)
        for group in batch:
            oldest = group.oldest_version
            if oldest is not None and trainer_version - oldest > self.max_lag:
                self.kept_by_rule += 1
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

    def _take_oldest(self, count: int) -> list[Group]:
        """The `count` buffered groups with the oldest version under the rule (ties: admitted first).

        Oldest first, not first come first served: a slow group that arrives behind fresher
        ones would otherwise wait until it is too stale and be dropped, and slow groups are
        usually the hard tasks."""
        order = sorted(
            range(len(self._groups)),
            key=lambda i: (
                v if (v := group_version(self._groups[i], self.staleness_rule)) is not None else 1e18,
                self._groups[i].admission_index,
                i,
            ),
        )
        chosen = set(order[:count])
        batch = [self._groups[i] for i in order[:count]]
        self._groups = collections.deque(g for i, g in enumerate(self._groups) if i not in chosen)
        return batch

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
            "buffer/redundant_slots": self.redundant_groups,
            "buffer/carried_groups": self.carried_groups,
            "staleness/kept_by_token_rule": self.kept_by_rule,
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
            "kept_by_rule": self.kept_by_rule,
            "carried_groups": self.carried_groups,
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
        self.kept_by_rule = state.get("kept_by_rule", 0)  # absent in checkpoints of older versions
        self.carried_groups = state.get("carried_groups", 0)
