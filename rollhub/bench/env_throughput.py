"""`rollhub bench envs`: how fast and how heavy is each registered env?

For every registered env that can run here (others are skipped with the reason printed):
reset latency p50/p95, steps/s under the random agent (step time only), and memory per
live env (RSS growth while N envs are reset and held, divided by N, next to the
Python/numpy allocations tracemalloc sees). Also Sokoban room generation on one core
(6x6, 1 box, search depth 30, as `rollhub/Sokoban-v0` builds them); the target is >= 200 rooms/s.
Envs added later (plugins, ALFWorld, SWE) are picked up from the registry without edits here.

Options (`--set key=value`): envs=[ids] (default all), resets, steps, live_envs,
live_envs_sandboxed (for envs that need Docker), rooms, phase_budget_s (a cap on each
measuring loop, so one slow env cannot stall the run), memory_budget_mb (stop adding live
envs once RSS grew this much; the per-env figure uses the envs actually held).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rollhub.bench.report import print_table, save_json
from rollhub.core.config import load_config

logger = logging.getLogger(__name__)


@dataclass
class EnvBenchConfig:
    envs: list[str] = field(default_factory=list)
    resets: int = 50
    steps: int = 1000
    live_envs: int = 64
    live_envs_sandboxed: int = 4
    rooms: int = 2000
    phase_budget_s: float = 30.0
    memory_budget_mb: float = 2048.0
    seed: int = 0

    def validate(self) -> None:
        if min(self.resets, self.steps, self.live_envs, self.live_envs_sandboxed, self.rooms) < 1:
            raise ValueError("resets, steps, live_envs, live_envs_sandboxed and rooms must be >= 1")
        if self.phase_budget_s <= 0 or self.memory_budget_mb <= 0:
            raise ValueError("phase_budget_s and memory_budget_mb must be > 0")


QUICK = ["resets=8", "steps=100", "live_envs=8", "live_envs_sandboxed=2", "rooms=200", "phase_budget_s=10"]


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def percentile_ms(samples_s: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples_s) * 1000.0, q)) if samples_s else float("nan")


async def measure_resets(env_id: str, cfg: EnvBenchConfig) -> list[float]:
    from rollhub.envs import make

    env = make(env_id)
    latencies: list[float] = []
    deadline = time.perf_counter() + cfg.phase_budget_s
    try:
        for i in range(cfg.resets):
            start = time.perf_counter()
            await env.reset(seed=cfg.seed + i)
            latencies.append(time.perf_counter() - start)
            if time.perf_counter() > deadline:
                break
    finally:
        await env.close()
    return latencies


async def measure_steps(env_id: str, cfg: EnvBenchConfig) -> tuple[int, float]:
    """(steps taken, seconds spent inside step()) with random actions; resets not timed."""
    from rollhub.envs import make

    env = make(env_id)
    rng = np.random.default_rng(cfg.seed)
    steps, step_time = 0, 0.0
    deadline = time.perf_counter() + cfg.phase_budget_s
    episode = 0
    try:
        await env.reset(seed=cfg.seed)
        while steps < cfg.steps and time.perf_counter() < deadline:
            try:
                action = env.random_action(rng)
            except NotImplementedError:
                action = "no action"
            start = time.perf_counter()
            _, _, terminated, truncated, _ = await env.step(action)
            step_time += time.perf_counter() - start
            steps += 1
            if terminated or truncated:
                episode += 1
                await env.reset(seed=cfg.seed + episode)
    finally:
        await env.close()
    return steps, step_time


async def measure_memory(env_id: str, count: int, cfg: EnvBenchConfig) -> tuple[float, float, int]:
    """(RSS growth per live env in KiB, traced Python/numpy allocations per live env in
    KiB, envs held). Envs are built and reset one by one until `count`, the phase budget
    or the memory budget is reached. RSS misses memory the allocator already held, so the
    traced figure is reported next to it."""
    import tracemalloc

    from rollhub.envs import make

    await _warm_up(env_id)
    gc.collect()
    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    before = rss_bytes()
    deadline = time.perf_counter() + cfg.phase_budget_s
    envs = []
    try:
        while len(envs) < count:
            env = make(env_id)
            envs.append(env)
            await env.reset(seed=len(envs))
            if time.perf_counter() > deadline or rss_bytes() - before > cfg.memory_budget_mb * 2**20:
                break
        gc.collect()
        after = rss_bytes()
        traced_after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        for env in envs:
            await env.close()
    count = len(envs)
    return max(after - before, 0) / count / 1024.0, max(traced_after - traced_before, 0) / count / 1024.0, count


async def _warm_up(env_id: str) -> None:
    """Build and reset one env first so module imports are not charged to the live envs."""
    from rollhub.envs import make

    env = make(env_id)
    try:
        await env.reset(seed=0)
    finally:
        await env.close()


def sokoban_rooms_per_s(cfg: EnvBenchConfig) -> dict[str, Any]:
    from rollhub.envs.sokoban.generator import generate_room

    rng = np.random.default_rng(cfg.seed)
    start = time.perf_counter()
    made = 0
    deadline = start + cfg.phase_budget_s
    while made < cfg.rooms and time.perf_counter() < deadline:
        generate_room(rng, dim=(6, 6), num_boxes=1, search_depth=30, max_solution_steps=15)
        made += 1
    elapsed = time.perf_counter() - start
    return {"rooms": made, "seconds": elapsed, "rooms_per_s": made / elapsed, "target_rooms_per_s": 200}


async def bench_env(spec: Any, cfg: EnvBenchConfig) -> dict[str, Any]:
    resets = await measure_resets(spec.id, cfg)
    steps, step_time = await measure_steps(spec.id, cfg)
    live = cfg.live_envs_sandboxed if "docker" in spec.requires else cfg.live_envs
    rss_kib, traced_kib, live = await measure_memory(spec.id, live, cfg)
    return {
        "env": spec.id,
        "reset_p50_ms": percentile_ms(resets, 50),
        "reset_p95_ms": percentile_ms(resets, 95),
        "resets": len(resets),
        "steps_per_s": steps / step_time if step_time > 0 else float("nan"),
        "steps": steps,
        "rss_kib_per_env": rss_kib,
        "traced_kib_per_env": traced_kib,
        "live_envs": live,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rollhub.envs import all_specs
    from rollhub.envs.checker import missing_requirements

    cfg = load_config(EnvBenchConfig, None, (QUICK if args.quick else []) + list(args.overrides))
    specs = all_specs()
    known = {s.id for s in specs}
    unknown = [e for e in cfg.envs if e not in known]
    if unknown:
        from rollhub.core.errors import UserError

        raise UserError(f"unknown env ids in envs=: {', '.join(unknown)}; see 'rollhub envs list'")
    chosen = [s for s in specs if not cfg.envs or s.id in cfg.envs]
    rows, skipped, failed = [], {}, {}
    for spec in chosen:
        missing = missing_requirements(spec)
        if missing:
            skipped[spec.id] = "; ".join(missing)
            print(f"skip {spec.id}: {skipped[spec.id]}")
            continue
        print(f"measuring {spec.id} ...", flush=True)
        try:
            rows.append(asyncio.run(bench_env(spec, cfg)))
        except Exception as exc:  # one broken env must not hide the others' numbers
            logger.exception("benchmark of %s failed", spec.id)
            failed[spec.id] = f"{type(exc).__name__}: {exc}"
            print(f"fail {spec.id}: {failed[spec.id]}")
    rooms = sokoban_rooms_per_s(cfg)
    headers = {
        "env": "env",
        "reset_p50_ms": "reset p50 ms",
        "reset_p95_ms": "reset p95 ms",
        "steps_per_s": "steps/s",
        "rss_kib_per_env": "RSS KiB/env",
        "traced_kib_per_env": "py KiB/env",
        "live_envs": "live",
    }
    shown = [{headers[k]: row[k] for k in headers} for row in rows]
    print_table("env throughput (one process, one core)", shown, list(headers.values()))
    print(
        f"Sokoban room generation (6x6, 1 box, depth 30): {rooms['rooms_per_s']:.0f} rooms/s "
        f"over {rooms['rooms']} rooms (aim >= 200)"
    )
    result = {"config": asdict(cfg), "envs": rows, "skipped": skipped, "failed": failed, "sokoban_generation": rooms}
    path = save_json(Path(args.out) / "env_throughput.json", result)
    print(f"wrote {path}")
    return result
