"""Where each training group's seed comes from: fresh seeds in order, or a replayed hard one.

`SeedCursor` hands out offset, offset+1, ...: every group is a new task. From a strong
warm-start most groups of new tasks are all successes, which give GRPO / GiGPO no advantage
signal at all, so RL stalls near the imitation ceiling. `ReplaySeedSource` (`rollout.replay`)
keeps the seeds of recently consumed groups that did not all succeed and re-issues them as a
share of new groups, so more of each batch lands on tasks the policy still gets wrong.

Both are plain iterators that the rollout source (`EnvManager`, or `RayRollout`, which draws
each group's seed in the trainer's process and sends it to a shard) pulls one seed per group
from; the training loop hands every consumed batch to `observe`. Held-out evaluation seeds are
never involved: replay only re-issues training seeds it has already issued, so the fresh seeds
stay the contiguous range that `RunConfig` keeps apart from evaluation and SFT, and replays
take no new seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rollhub.rollout.types import Group

#: which consumed groups put their seed into the replay pool
QualifyRule = Literal["not_all_succeeded", "mixed"]


@dataclass
class ReplayConfig:
    """Hard-seed replay (`rollout.replay`); off while `fraction` is 0.

    fraction: share of new groups whose seed is a replayed one, while the pool holds any (at
        1 every new group replays until the pool drains; max_replays makes sure it does).
    pool_size: seeds kept; the oldest is dropped when a new one arrives at a full pool.
    max_replays: times one seed may be re-issued after its first group.
    qualify: which consumed groups enter the pool, judged on their scored trajectories
        (infra failures say nothing about the task): `not_all_succeeded` (default) = at
        least one failed, so all-failed groups too; `mixed` = some succeeded and some
        failed, the groups that carried an outcome signal.
    """

    fraction: float = 0.0
    pool_size: int = 256
    max_replays: int = 2
    qualify: QualifyRule = "not_all_succeeded"

    def validate(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"rollout.replay.fraction must be in [0, 1] (0 = off), got {self.fraction}")
        if self.pool_size < 1:
            raise ValueError(f"rollout.replay.pool_size must be >= 1, got {self.pool_size}")
        if self.max_replays < 1:
            raise ValueError(f"rollout.replay.max_replays must be >= 1, got {self.max_replays}")
        if self.qualify not in ("not_all_succeeded", "mixed"):
            raise ValueError(f"rollout.replay.qualify must be not_all_succeeded or mixed, got {self.qualify!r}")

    @property
    def enabled(self) -> bool:
        return self.fraction > 0


def group_qualifies(group: Group, rule: QualifyRule) -> bool:
    """Whether `group` is a hard task under `rule` (see `ReplayConfig.qualify`)."""
    scored = [t for t in group.trajectories if t.scored]
    if not scored:
        return False
    successes = sum(bool(t.success) for t in scored)
    if rule == "mixed":
        return 0 < successes < len(scored)
    return successes < len(scored)


class SeedSource(Protocol):
    """What the run builds for its rollout source and checkpoints (`rollhub.trainer.loop`)."""

    next_seed: int  # the next fresh seed

    def __iter__(self) -> Iterator[int]: ...

    def __next__(self) -> int: ...

    def observe(self, groups: list[Group]) -> dict[str, float]:
        """Learn from a consumed batch; returns the step's metrics."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SeedCursor:
    """Training task seeds offset, offset+1, ...; its position is checkpointed."""

    def __init__(self, start: int):
        self.next_seed = start

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        seed = self.next_seed
        self.next_seed += 1
        return seed

    def observe(self, groups: list[Group]) -> dict[str, float]:
        """Fresh seeds only: nothing to learn from a batch."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"next_seed": self.next_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Only the position: a pool saved while replay was on is dropped when it is now off."""
        self.next_seed = int(state.get("next_seed", self.next_seed))


class ReplaySeedSource:
    """Fresh seeds from a `SeedCursor`, and with probability `fraction` a replayed hard one.

    Pool semantics: a consumed group whose seed was never pooled enters the pool when it
    qualifies (`ReplayConfig.qualify`); a seed leaves it when it has been re-issued
    `max_replays` times, when a replayed group of it no longer qualifies (the policy now
    solves it, so replaying it teaches nothing), or when it is the oldest of a full pool. A
    seed is pooled at most once: its replays, even those still running when it left the pool,
    never bring it back, so no seed is issued more than 1 + max_replays times. A replayed seed
    is drawn uniformly from the pool.

    Deterministic: the draws come from a `random.Random` seeded from the run seed, and its
    state is checkpointed with the cursor, the pool and the replay counts (`state_dict`), so a
    resumed run issues the same seeds for the same observed batches. Memory: one count per
    seed ever pooled (kept so that a seed's replays are recognised as replays).
    """

    def __init__(self, start: int, config: ReplayConfig, *, seed: int = 0):
        config.validate()
        self.config = config
        self._cursor = SeedCursor(start)
        self._pool: list[int] = []  # pooled seeds, oldest first
        self._replays: dict[int, int] = {}  # every seed ever pooled -> times re-issued
        self._rng = random.Random(f"rollhub.replay:{seed}")

    @property
    def next_seed(self) -> int:
        """The next fresh seed (what the checkpoint's `next_seed` has always recorded)."""
        return self._cursor.next_seed

    @property
    def pool(self) -> list[int]:
        """The seeds that may be replayed, oldest first (a copy)."""
        return list(self._pool)

    def replays(self, seed: int) -> int:
        """How many times `seed` was re-issued so far."""
        return self._replays.get(seed, 0)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        if self._pool and self._rng.random() < self.config.fraction:
            seed = self._pool[self._rng.randrange(len(self._pool))]
            self._replays[seed] += 1
            if self._replays[seed] >= self.config.max_replays:
                self._pool.remove(seed)
            return seed
        return next(self._cursor)

    def observe(self, groups: list[Group]) -> dict[str, float]:
        """Pool the hard seeds of a consumed batch; returns `batch/replayed_groups` (groups of the
        batch that were replays) and `rollout/replay_pool` (seeds pooled after it)."""
        replayed = 0
        for group in groups:
            if group.seed is None:
                continue
            seed = int(group.seed)
            hard = group_qualifies(group, self.config.qualify)
            if seed in self._replays:  # pooled before, so this group is one of its replays
                replayed += 1
                if not hard and seed in self._pool:
                    self._pool.remove(seed)
            elif hard:
                self._replays[seed] = 0
                self._pool.append(seed)
                if len(self._pool) > self.config.pool_size:
                    self._pool.pop(0)
        return {"batch/replayed_groups": float(replayed), "rollout/replay_pool": float(len(self._pool))}

    def state_dict(self) -> dict[str, Any]:
        """JSON types only (the checkpoint's rollout state goes through JSON)."""
        version, internal, gauss = self._rng.getstate()
        return {
            "next_seed": self.next_seed,
            "pool": list(self._pool),
            "replays": [[seed, count] for seed, count in self._replays.items()],
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state of `state_dict`; a checkpoint from before replay has only `next_seed`, and
        then the pool starts empty and the draws start from the run seed."""
        self._cursor.next_seed = int(state.get("next_seed", self.next_seed))
        self._replays = {int(seed): int(count) for seed, count in state.get("replays", [])}
        self._pool = [int(seed) for seed in state.get("pool", [])][-self.config.pool_size :]
        if state.get("rng") is not None:
            version, internal, gauss = state["rng"]
            self._rng.setstate((version, tuple(internal), gauss))
