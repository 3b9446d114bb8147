"""EnvShard: a Ray actor that owns one EnvManager (its envs, sandboxes and concurrency limits).

The driver keeps admission central: it takes a GroupBuffer ticket, picks a seed and asks a
shard for exactly one group (`run_group(seed)`); the finished group travels back as the
call's result and goes into the driver's buffer. So the α bound and the staleness drop
work unchanged, whatever the number of shards. The shard's engine is an EngineRouter over
all engine servers; the driver drives its client-side gate during weight pushes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)


class _SeedFeed:
    """Seed iterator for the shard's EnvManager: seeds the driver sent, in order.

    A group the manager restarts after infra failures asks for one more seed than was
    sent; it gets the last seed again (the same task is retried).
    """

    def __init__(self) -> None:
        self._queue: collections.deque[int] = collections.deque()
        self._last = 0

    def push(self, seed: int) -> None:
        self._queue.append(seed)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        if self._queue:
            self._last = self._queue.popleft()
        return self._last


class EnvShard:
    """Construct through `ray.remote(...)(EnvShard)`; `start()` once, then `run_group(seed)`."""

    def __init__(
        self,
        shard_id: str,
        model_path: str,
        env: Any,
        rollout: Any,
        agent: Any,
        engine_urls: dict[str, str],
        weight_version: int = 0,
        *,
        reap_orphan_sandboxes: bool = False,
    ) -> None:
        self.shard_id = shard_id
        self.model_path = model_path
        # one group per call: the driver's buffer owns batching (and the driver writes the JSONL log)
        self.env, self.rollout, self.agent = env, dataclasses.replace(rollout, redundant_groups=0), agent
        self.engine_urls = dict(engine_urls)
        self.weight_version = weight_version
        self.reap_orphan_sandboxes = reap_orphan_sandboxes
        self.router: Any = None
        self.manager: Any = None
        self._seeds = _SeedFeed()
        self._info: dict[str, Any] = {}
        self._summary_sent_at = float("-inf")

    async def start(self) -> dict[str, Any]:
        if self.manager is not None:
            return self._info
        import ray
        from transformers import AutoTokenizer

        from rollhub.inference.engines.router import EngineRouter
        from rollhub.rollout.manager import EnvManager

        if self.reap_orphan_sandboxes:
            await asyncio.to_thread(_reap_orphan_sandboxes)
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.router = EngineRouter(self.engine_urls)
        self.router.set_weight_version(self.weight_version)
        self.manager = EnvManager(
            self.router, tokenizer, env=self.env, rollout=self.rollout, agent=self.agent, seeds=self._seeds
        )
        context = ray.get_runtime_context()
        self._info = {
            "shard_id": self.shard_id,
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": __import__("os").getpid(),
        }
        return self._info

    async def run_group(self, seed: int) -> tuple[Any, dict[str, Any] | None]:
        """One group of the shard's env, its trajectories tagged with shard and node.

        The shard's counters ride along at most once a second (the summary sorts latency
        lists, too much work to repeat for every group of a busy shard).
        """
        self._seeds.push(seed)
        group = (await self.manager.collect_batch(1))[0]
        for trajectory in group.trajectories:
            trajectory.info["cluster_shard"] = self.shard_id
            trajectory.info["cluster_node"] = self._info.get("node_ip")
        now = time.monotonic()
        if now - self._summary_sent_at < 1.0:
            return group, None
        self._summary_sent_at = now
        return group, self.summary()

    def summary(self) -> dict[str, Any]:
        data = self.manager.summary() if self.manager is not None else {}
        data.pop("weight_updates", None)
        data["open_envs"] = self.manager.open_envs if self.manager is not None else 0
        data["router"] = self.router.stats.as_dict() if self.router is not None else {}
        data.update(self._info)
        return data

    async def hold(self) -> None:
        self.router.hold()

    async def release(self, version: int) -> None:
        self.weight_version = version
        self.router.release(version)

    async def set_engines(self, engine_urls: dict[str, str]) -> None:
        self.engine_urls = dict(engine_urls)
        self.router.set_engines(self.engine_urls)

    async def ping(self) -> bool:
        return True

    async def stop(self) -> dict[str, Any]:
        """Cancel what runs, close envs and HTTP sessions; return the final counters."""
        if self.manager is not None:
            await self.manager.close()
        if self.router is not None:
            await self.router.close()
        return self.summary()


def _reap_orphan_sandboxes() -> None:
    """Remove this Docker host's rollhub containers whose owner process is gone.

    A shard killed by a node or process failure never runs its exit cleanup; its
    containers carry its pid and start time (rollhub/sandbox/ownership.py), so its replacement,
    or any later shard on the host, removes them.
    """
    from rollhub.sandbox.base import SandboxError
    from rollhub.sandbox.docker_backend import connect
    from rollhub.sandbox.reaper import collect_garbage

    try:
        removed = collect_garbage(connect().api)
    except SandboxError as exc:
        logger.warning("orphan sandbox sweep skipped: %s", exc)
        return
    if removed:
        logger.warning("removed %d orphaned sandbox container(s) on this host", len(removed))
