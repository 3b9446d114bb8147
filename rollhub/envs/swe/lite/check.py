"""`rollhub swe lite check FILE`: the gold patch must resolve and the empty patch must not, through
the env's own episodes (reset, the expert's `git apply` by `bash`, submit; or submit at once),
on a seeded sample of tasks. The counts are what the README reports."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from rollhub.envs.swe.agent.tools import ToolCall
from rollhub.envs.swe.env import SWEEnv
from rollhub.envs.swe.tasks import SweTask
from rollhub.sandbox.base import SandboxBackend

SUBMIT = ToolCall("submit", {}).to_text()


async def play(env: SWEEnv, instance_id: str, gold: bool) -> dict[str, Any]:
    """One episode: the expert's plan (gold) or an immediate submit (no-op)."""
    _, info = await env.reset(options={"instance_id": instance_id})
    if info.get("infra_failure"):
        return {"reward": 0.0, "infra_failure": info["infra_failure"]}
    reward, terminated, truncated = 0.0, False, False
    while not (terminated or truncated):
        action = env.expert_action() if gold else SUBMIT
        _, reward, terminated, truncated, info = await env.step(action)
    return {
        "reward": reward,
        "infra_failure": info.get("infra_failure", ""),
        "oracle_agreed": info.get("oracle_agreed"),
        "trust": info.get("trust"),
    }


def sample(tasks: list[SweTask], count: int | None, seed: int) -> list[SweTask]:
    """`count` tasks drawn round-robin over packs, seeded (all of them when count is None)."""
    if count is None or count >= len(tasks):
        return list(tasks)
    by_pack: dict[str, list[SweTask]] = {}
    for task in tasks:
        by_pack.setdefault(task.row["rollhub"]["lite"]["pack"], []).append(task)
    rng = random.Random(seed)
    for group in by_pack.values():
        rng.shuffle(group)
    chosen: list[SweTask] = []
    while len(chosen) < count:
        for pack in sorted(by_pack):
            if by_pack[pack] and len(chosen) < count:
                chosen.append(by_pack[pack].pop())
    return chosen


async def check(
    backend: SandboxBackend,
    tasks: list[SweTask],
    concurrency: int = 2,
    env_cls: type[SWEEnv] = SWEEnv,
    **env_kwargs: Any,
) -> dict[str, Any]:
    """Gold and no-op episodes on every task of `tasks`; counts, failures and wall time. With
    SWEEnv the gold is the patch applied whole; with SWELiteEnv the exploring expert's edit."""
    started = time.monotonic()
    queue: asyncio.Queue = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    results: list[dict[str, Any]] = []

    async def worker() -> None:
        env = env_cls(tasks, backend=backend, **env_kwargs)
        try:
            while not queue.empty():
                task = queue.get_nowait()
                gold = await play(env, task.instance_id, gold=True)
                noop = await play(env, task.instance_id, gold=False)
                results.append({"instance_id": task.instance_id, "gold": gold, "noop": noop})
        finally:
            await env.close()

    await asyncio.gather(*[worker() for _ in range(max(1, min(concurrency, len(tasks))))])
    return {
        "tasks": len(results),
        "gold_resolved": sum(r["gold"]["reward"] == 1.0 for r in results),
        "noop_resolved": sum(r["noop"]["reward"] == 1.0 for r in results),
        "infra_failures": sum(bool(r["gold"]["infra_failure"] or r["noop"]["infra_failure"]) for r in results),
        "gold_oracle_agreed": sum(r["gold"]["oracle_agreed"] is True for r in results),
        "failures": [r for r in results if r["gold"]["reward"] != 1.0 or r["noop"]["reward"] != 0.0],
        "wall_s": round(time.monotonic() - started, 1),
    }
