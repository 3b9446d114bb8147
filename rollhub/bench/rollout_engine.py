"""`rollhub bench rollout-engine`: the real in-process engine on this machine's CPU.

Measures (each as a ratio against a baseline run in the same process, so a busy machine
shifts both sides alike):
1. decode throughput at 1 / 8 / 32 concurrent requests (continuous batching gain);
2. a multi-turn Sokoban rollout with the prefix KV cache on vs off (exactness of the
   cache is a unit test; here only its cost);
3. env-level async vs lockstep collection of the same groups, on Sokoban (instant steps)
   and on the benchmark-simulation env `bench/LatencySokoban-v0` (real engine, step
   latency N(10, 5) x `latency_scale` seconds), plus group redundancy (N+1) there.
Options (`--set`): size=5m|30m, threads=1, new_tokens=128, groups=4, group_size=4,
turn_tokens=16, max_turns=8, latency_scale=0.02.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class EngineBenchConfig:
    size: str = "5m"
    threads: int = 1
    new_tokens: int = 128
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32])
    groups: int = 4
    group_size: int = 4
    turn_tokens: int = 16
    max_turns: int = 8
    latency_scale: float = 0.02  # simulated env step N(10 s, 5 s) -> 200 ms +- 100 ms

    def validate(self) -> None:
        if self.size not in ("5m", "30m"):
            raise ValueError("size must be 5m or 30m")
        if min(self.concurrency) < 1 or self.groups < 1 or self.group_size < 1:
            raise ValueError("concurrency, groups and group_size must be >= 1")


QUICK = ["new_tokens=32", "concurrency=[1, 8]", "groups=2", "group_size=2", "max_turns=3"]


async def decode_throughput(model_dir: Path, cfg: EngineBenchConfig) -> list[dict[str, Any]]:
    from rollhub.rollout.engines.base import SamplingParams
    from rollhub.rollout.engines.hf import HFEngine

    rows = []
    async with HFEngine(model_dir, threads=cfg.threads, max_batch_size=max(cfg.concurrency)) as engine:
        await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4))  # warm-up
        for concurrency in cfg.concurrency:
            prompts = [[1] + [100 + (i * 7 + j) % 900 for j in range(31)] for i in range(concurrency)]
            sampling = SamplingParams(max_new_tokens=cfg.new_tokens, stop_token_ids=(10**9,))
            started = time.perf_counter()
            results = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
            elapsed = time.perf_counter() - started
            tokens = sum(len(r.token_ids) for r in results)
            rows.append(
                {"concurrency": concurrency, "tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}
            )
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_1"] = row["tokens_per_s"] / base
    return rows


async def collect(
    model_dir: Path,
    cfg: EngineBenchConfig,
    *,
    prefix_cache_tokens: int,
    lockstep: bool,
    env_id: str = "rollhub/Sokoban-v0",
    env_kwargs: dict[str, Any] | None = None,
    group_redundancy: int = 0,
) -> dict[str, Any]:
    from rollhub.rollout.agent import AgentConfig
    from rollhub.rollout.engines.hf import HFEngine
    from rollhub.rollout.manager import EnvManager, EnvManagerConfig

    agent = AgentConfig(
        max_new_tokens=cfg.turn_tokens, max_turns=cfg.max_turns, max_context_tokens=2048, temperature=1.0
    )
    config = EnvManagerConfig(
        env_id=env_id,
        env_kwargs=dict(env_kwargs or {}),
        group_size=cfg.group_size,
        lockstep=lockstep,
        agent=agent,
        group_redundancy=group_redundancy,
    )
    async with HFEngine(
        model_dir, threads=cfg.threads, max_batch_size=64, prefix_cache_tokens=prefix_cache_tokens, seed=0
    ) as engine:
        manager = EnvManager(engine, engine.tokenizer, config)
        started = time.perf_counter()
        groups = await manager.collect_batch(cfg.groups)
        elapsed = time.perf_counter() - started
        await manager.close()
        stats = engine.stats
        trajectories = [t for g in groups for t in g.trajectories]
        return {
            "seconds": elapsed,
            "generated_tokens": sum(t.num_response_tokens for t in trajectories),
            "prefill_tokens": stats.prefill_tokens,
            "prefix_hits": engine.prefix_cache.hits,
            "mean_batch_size": stats.mean_batch_size,
            "redundant_cancelled": manager.metrics.redundant_cancelled,
        }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rollhub.bench.report import print_table, save_json
    from rollhub.core.config import load_config
    from rollhub.rollout.models import init_tiny_model

    cfg = load_config(EngineBenchConfig, None, (QUICK if args.quick else []) + list(args.overrides))
    torch.set_num_threads(cfg.threads)
    with tempfile.TemporaryDirectory(prefix="rollhub-bench-") as folder:
        model_dir = init_tiny_model(Path(folder) / "model", size=cfg.size)
        print("decode throughput ...", flush=True)
        decode = asyncio.run(decode_throughput(model_dir, cfg))
        print_table(f"HFEngine decode, qwen3-{cfg.size}, {cfg.threads} thread(s), {cfg.new_tokens} new tokens", decode)
        print("multi-turn Sokoban: prefix cache off / on, lockstep ...", flush=True)
        no_cache = asyncio.run(collect(model_dir, cfg, prefix_cache_tokens=0, lockstep=False))
        cached = asyncio.run(collect(model_dir, cfg, prefix_cache_tokens=65536, lockstep=False))
        lockstep = asyncio.run(collect(model_dir, cfg, prefix_cache_tokens=65536, lockstep=True))
        print(
            "simulated env latencies (bench/LatencySokoban-v0): lockstep / async / async + redundancy ...", flush=True
        )
        latency_env = {"env_id": "bench/LatencySokoban-v0", "env_kwargs": {"time_scale": cfg.latency_scale}}
        latency_rows = [
            {
                "mode": "lockstep",
                **asyncio.run(collect(model_dir, cfg, prefix_cache_tokens=65536, lockstep=True, **latency_env)),
            },
            {
                "mode": "env-level async",
                **asyncio.run(collect(model_dir, cfg, prefix_cache_tokens=65536, lockstep=False, **latency_env)),
            },
            {
                "mode": "async + 1 redundant/group",
                **asyncio.run(
                    collect(
                        model_dir, cfg, prefix_cache_tokens=65536, lockstep=False, group_redundancy=1, **latency_env
                    )
                ),
            },
        ]
    rollout_rows = [
        {"mode": "async, no prefix cache", **no_cache},
        {"mode": "async, prefix cache", **cached},
        {"mode": "lockstep, prefix cache", **lockstep},
    ]
    print_table(
        f"Sokoban-v0 rollout, {cfg.groups}x{cfg.group_size} trajectories, "
        f"{cfg.turn_tokens} tokens/turn, <= {cfg.max_turns} turns",
        rollout_rows,
    )
    result = {
        "config": asdict(cfg),
        "decode": decode,
        "rollout": rollout_rows,
        "prefix_cache_speedup": no_cache["seconds"] / cached["seconds"],
        "prefix_cache_prefill_reduction": no_cache["prefill_tokens"] / max(1, cached["prefill_tokens"]),
        "async_vs_lockstep_speedup": lockstep["seconds"] / cached["seconds"],
        "latency_env": latency_rows,
        "latency_env_async_vs_lockstep_speedup": latency_rows[0]["seconds"] / latency_rows[1]["seconds"],
        "latency_env_redundancy_vs_lockstep_speedup": latency_rows[0]["seconds"] / latency_rows[2]["seconds"],
    }
    print_table(
        f"bench/LatencySokoban-v0 (SIMULATED env latency, real engine), step N(10, 5) x {cfg.latency_scale} s",
        latency_rows,
    )
    print(
        f"prefix cache: {result['prefix_cache_speedup']:.2f}x faster, "
        f"{result['prefix_cache_prefill_reduction']:.1f}x fewer prefill tokens; "
        f"env-level async vs lockstep: {result['async_vs_lockstep_speedup']:.2f}x on Sokoban, "
        f"{result['latency_env_async_vs_lockstep_speedup']:.2f}x with simulated env latencies "
        f"({result['latency_env_redundancy_vs_lockstep_speedup']:.2f}x with redundancy)"
    )
    path = save_json(Path(args.out) / "rollout_engine.json", result)
    print(f"wrote {path}")
    return result
