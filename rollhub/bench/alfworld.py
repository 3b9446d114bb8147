"""`rollhub bench alfworld`: latency and memory of the real ALFWorld engine behind our workers.

`rollhub bench envs` measures every env generically from the client process; for ALFWorld
the engine lives in worker processes, so this benchmark reads the workers themselves:

* reset latency: a game's first reset on a worker (load + translate, cache miss) and a
  repeat reset of the same game (what the other members of a group pay), with the
  translation cache's speed-up measured against the cold resets in the same run;
* step latency of the walkthrough's commands;
* for each, the workers' CPU time per operation, which a busy machine does not inflate;
* memory: worker RSS per live env, for distinct games and for one game shared by a group;
* throughput: `concurrent` envs (groups of `group_size`) on all workers at once, expert and
  random agents mixed, steps/s over the whole run.

Options (`--set key=value`): games, live_envs, workers, concurrent, group_size.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class ALFWorldBenchConfig:
    games: int = 12
    live_envs: int = 32
    workers: int = 2
    concurrent: int = 64
    group_size: int = 8
    seed: int = 0

    def validate(self) -> None:
        if min(self.games, self.live_envs, self.workers, self.concurrent, self.group_size) < 1:
            raise ValueError("games, live_envs, workers, concurrent and group_size must be >= 1")


QUICK = ["games=3", "live_envs=4", "concurrent=8", "group_size=4"]


def _pct(samples_s: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples_s) * 1000.0, q)) if samples_s else float("nan")


async def _worker_rss_mb(pool: Any, index: int) -> float:
    stats = await pool.worker_stats()
    return float(stats[index]["rss_mb"])


async def _worker_cpu_s(pool: Any) -> float:
    """CPU seconds the workers have used: unlike wall time, not inflated by a busy machine."""
    return float(sum(s.get("cpu_s", 0.0) for s in await pool.worker_stats()))


async def measure_latency(cfg: ALFWorldBenchConfig) -> dict[str, Any]:
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.alfworld.pool import WorkerPool

    pool = WorkerPool(1)
    env = ALFWorldEnv(pool=pool)
    cold, warm, steps = [], [], []
    cpu = {"cold": 0.0, "warm": 0.0, "steps": 0.0}

    async def timed(kind: str, samples: list[float], call: Any) -> Any:
        cpu_before, start = await _worker_cpu_s(pool), time.perf_counter()
        result = await call
        samples.append(time.perf_counter() - start)
        cpu[kind] += await _worker_cpu_s(pool) - cpu_before
        return result

    try:
        for i in range(cfg.games):
            seed = cfg.seed + i * 11
            await timed("cold", cold, env.reset(seed=seed))
            for _ in range(2):
                await timed("warm", warm, env.reset(seed=seed))
            while True:
                _, _, terminated, truncated, _ = await timed("steps", steps, env.step(env.expert_action()))
                if terminated or truncated:
                    break
        await env.close()
    finally:
        pool.close()
    return {
        "reset_cold_cpu_ms": 1000.0 * cpu["cold"] / len(cold),
        "reset_cached_cpu_ms": 1000.0 * cpu["warm"] / len(warm),
        "step_cpu_ms": 1000.0 * cpu["steps"] / len(steps),
        "reset_cold_p50_ms": _pct(cold, 50),
        "reset_cold_p90_ms": _pct(cold, 90),
        "reset_cached_p50_ms": _pct(warm, 50),
        "reset_cached_p90_ms": _pct(warm, 90),
        "reset_speedup_from_cache": float(np.median(cold) / np.median(warm)),
        "step_p50_ms": _pct(steps, 50),
        "step_p95_ms": _pct(steps, 95),
        "steps_timed": len(steps),
    }


async def measure_memory(cfg: ALFWorldBenchConfig, distinct: bool) -> dict[str, Any]:
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.alfworld.pool import WorkerPool

    pool = WorkerPool(1)
    try:
        probe = ALFWorldEnv(pool=pool)
        await probe.reset(seed=cfg.seed)  # imports and one engine object are not per-env costs
        base = await _worker_rss_mb(pool, 0)
        envs = [ALFWorldEnv(pool=pool) for _ in range(cfg.live_envs)]
        for i, env in enumerate(envs):
            await env.reset(seed=cfg.seed + (i + 1 if distinct else 0), options={"route_key": "all"})
        after = await _worker_rss_mb(pool, 0)
        for env in envs + [probe]:
            await env.close()
    finally:
        pool.close()
    return {"worker_base_rss_mb": base, "live_envs": cfg.live_envs, "rss_mb_per_env": (after - base) / cfg.live_envs}


async def measure_concurrency(cfg: ALFWorldBenchConfig) -> dict[str, Any]:
    from rollhub.envs.alfworld.env import ALFWorldEnv
    from rollhub.envs.alfworld.pool import WorkerPool

    pool = WorkerPool(cfg.workers)
    counts = {"steps": 0, "episodes": 0, "successes": 0, "infra_failures": 0}

    async def episode(i: int) -> None:
        env = ALFWorldEnv(pool=pool)
        rng = np.random.default_rng(i)
        expert = i % 2 == 0
        try:
            await env.reset(seed=cfg.seed + i // cfg.group_size)
            while True:
                action = env.expert_action() if expert else env.random_action(rng)
                _, _, terminated, truncated, info = await env.step(action)
                counts["steps"] += 1
                if terminated or truncated:
                    counts["episodes"] += 1
                    counts["successes"] += int(info["success"])
                    counts["infra_failures"] += int("infra_failure" in info)
                    return
        finally:
            await env.close()

    start = time.perf_counter()
    try:
        await asyncio.gather(*(episode(i) for i in range(cfg.concurrent)))
        elapsed = time.perf_counter() - start
        stats = await pool.worker_stats()
    finally:
        pool.close()
    worker_cpu_s = sum(s.get("cpu_s", 0.0) for s in stats)
    return {
        "concurrent_envs": cfg.concurrent,
        "workers": cfg.workers,
        "seconds": elapsed,
        "steps_per_s": counts["steps"] / elapsed,
        "worker_cpu_s": worker_cpu_s,
        "steps_per_cpu_s": counts["steps"] / worker_cpu_s if worker_cpu_s else float("nan"),
        "restarts": sum(s["restarts"] for s in stats),
        **counts,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rollhub.bench.report import print_table, save_json
    from rollhub.core.config import load_config

    cfg = load_config(ALFWorldBenchConfig, None, (QUICK if args.quick else []) + list(args.overrides))
    print("ALFWorld: reset/step latency on one worker ...", flush=True)
    latency = asyncio.run(measure_latency(cfg))
    print("ALFWorld: worker memory per live env ...", flush=True)
    memory_distinct = asyncio.run(measure_memory(cfg, distinct=True))
    memory_shared = asyncio.run(measure_memory(cfg, distinct=False))
    print(f"ALFWorld: {cfg.concurrent} concurrent envs on {cfg.workers} workers ...", flush=True)
    concurrency = asyncio.run(measure_concurrency(cfg))
    print_table("ALFWorld latency (one worker)", [latency])
    print_table(
        "ALFWorld worker memory",
        [dict(games="distinct", **memory_distinct), dict(games="one per group", **memory_shared)],
        ["games", "live_envs", "worker_base_rss_mb", "rss_mb_per_env"],
    )
    print_table("ALFWorld concurrent episodes", [concurrency])
    result = {
        "config": asdict(cfg),
        "latency": latency,
        "memory_distinct_games": memory_distinct,
        "memory_one_game": memory_shared,
        "concurrency": concurrency,
    }
    path = save_json(Path(args.out) / "alfworld.json", result)
    print(f"wrote {path}")
    return result
