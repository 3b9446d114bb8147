"""Where each training group's seed comes from: fresh seeds in order.

`SeedCursor` hands out offset, offset+1, ...: every group is a new task. It is a plain
iterator that the rollout source (`EnvManager`, or `RayRollout`, which draws each group's
seed in the trainer's process and sends it to a shard) pulls one seed per group from, and
its position is checkpointed, so a resumed run starts on the next fresh task. Held-out
evaluation seeds are never involved: the training seeds are the contiguous range that
`RunConfig` keeps apart from evaluation and SFT.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol


class SeedSource(Protocol):
    """What the run builds for its rollout source and checkpoints (`rollhub.trainer.run_dir`)."""

    next_seed: int  # the next fresh seed

    def __iter__(self) -> Iterator[int]: ...

    def __next__(self) -> int: ...

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

    def state_dict(self) -> dict[str, Any]:
        return {"next_seed": self.next_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Only the position: other keys of a checkpoint's seed state (the pool of the hard-seed
        replay older versions had) are ignored."""
        self.next_seed = int(state.get("next_seed", self.next_seed))
