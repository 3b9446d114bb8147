"""What the training loop needs from rollout, as a `typing.Protocol`.

`EnvManager` (every env in one asyncio process) and `RayRollout` (env shards and engine
servers as Ray actors) both satisfy it, so the loop is the same code for one machine and
many, and a type checker holds both to the same surface.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, runtime_checkable

from rollhub.rollout.types import Group


@runtime_checkable
class RolloutSource(Protocol):
    #: the error that stopped the producer (e.g. its infra-failure budget is spent), once there
    #: is one; the trainer raises it instead of waiting on a buffer nobody fills any more
    failure: BaseException | None

    async def run(self, stop_event: asyncio.Event) -> None:
        """Keep the `GroupBuffer` full (async mode) until `stop_event` is set."""

    async def collect_batch(self, num_groups: int) -> list[Group]:
        """Generate `num_groups` whole groups now (lockstep mode)."""

    async def update_weights(self, source: Any, version: int) -> None:
        """Load new policy weights (a state dict or a checkpoint dir) as `version`."""

    def summary(self) -> dict[str, Any]:
        """Counters for the step's metrics (tokens/s, cancelled work, infra failures)."""

    async def close(self) -> None:
        """Stop every trajectory and release envs, sandboxes and actors."""
