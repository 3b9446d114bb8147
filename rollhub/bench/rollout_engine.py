"""`rollhub bench rollout-engine`: the real in-process engine on this machine's CPU.

Measures (each as a ratio against a baseline run in the same process, so a busy machine
shifts both sides alike):
1. decode throughput at 1 / 8 / 16 / 32 concurrent requests against `model.generate` on
   the same model, prompts and batch size, the two runs interleaved repeat by repeat
   (`speedup_vs_generate` per batch size: median engine tokens/s over median generate
   tokens/s), plus the continuous-batching gain over one request (`speedup_vs_1`);
2. a multi-turn Sokoban rollout with the prefix KV cache on vs off (exactness of the
   cache is a unit test; here only its cost);
3. env-level async vs lockstep collection of the same groups, on Sokoban (instant steps)
   and on the benchmark-simulation env `bench/LatencySokoban-v0` (real engine, step
   latency N(10, 5) x `latency_scale` seconds), plus group redundancy (N+1) there.
Options (`--set`): size=5m|30m, model=PATH (an HF checkpoint dir instead of a tiny model,
e.g. runs/models/smollm2-135m), threads=1, new_tokens=128, prompt_tokens=32, repeats=5,
concurrency=[1, 8, 16, 32], decode_only=false, groups=4, group_size=4, turn_tokens=16,
max_turns=8, latency_scale=0.02.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class EngineBenchConfig:
    size: str = "5m"
    model: str = ""  # an HF checkpoint dir; empty = a fresh tiny model of `size`
    threads: int = 1
    new_tokens: int = 128
    prompt_tokens: int = 32
    repeats: int = 5  # interleaved engine / generate pairs per batch size
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 16, 32])
    decode_only: bool = False  # skip the rollout sections (the engine-vs-generate table alone)
    groups: int = 4
    group_size: int = 4
    turn_tokens: int = 16
    max_turns: int = 8
    latency_scale: float = 0.02  # simulated env step N(10 s, 5 s) -> 200 ms +- 100 ms

    def validate(self) -> None:
        if self.size not in ("5m", "30m"):
            raise ValueError("size must be 5m or 30m")
        if self.model and not (Path(self.model) / "config.json").exists():
            raise ValueError(f"model={self.model} is not an HF checkpoint dir (no config.json)")
        if not self.concurrency or min(self.concurrency) < 1 or self.groups < 1 or self.group_size < 1:
            raise ValueError("concurrency, groups and group_size must be >= 1")
        if self.new_tokens < 1 or self.prompt_tokens < 1 or self.repeats < 1 or self.threads < 1:
            raise ValueError("new_tokens, prompt_tokens, repeats and threads must be >= 1")


QUICK = ["new_tokens=32", "concurrency=[1, 8]", "repeats=1", "groups=2", "group_size=2", "max_turns=3"]


def bench_prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    """`count` distinct prompts of `length` ids (no padding: generate and the engine see the same rows)."""
    return [[1] + [100 + (i * 7 + j) % max(1, vocab - 100) for j in range(length - 1)] for i in range(count)]


def generate_tokens_per_s(model: Any, prompts: list[list[int]], new_tokens: int) -> float:
    """`model.generate` (sampling at T = 1, no top-k/top-p, no early stop) on one batch: tokens/s."""
    import torch
    from transformers import GenerationConfig

    settings = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=None,
        top_p=None,
        max_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=model.config.pad_token_id or 0,
    )
    ids = torch.tensor(prompts, dtype=torch.long, device=model.device)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=settings)
    if out.device.type == "cuda":
        torch.cuda.synchronize()
    # every row is computed until the last one stops, so this counts the work done
    return (out.shape[1] - ids.shape[1]) * len(prompts) / (time.perf_counter() - started)


async def engine_tokens_per_s(engine: Any, prompts: list[list[int]], new_tokens: int) -> float:
    """The engine on the same batch, all requests submitted at once: tokens/s."""
    from rollhub.inference.engines.base import SamplingParams

    sampling = SamplingParams(max_new_tokens=new_tokens, stop_token_ids=(-1,))
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
    elapsed = time.perf_counter() - started
    tokens = sum(len(r.token_ids) for r in results)
    if tokens != new_tokens * len(prompts):
        raise RuntimeError(f"engine returned {tokens} tokens, expected {new_tokens * len(prompts)}")
    return tokens / elapsed


def decode_vs_generate(model_dir: Path, cfg: EngineBenchConfig) -> list[dict[str, Any]]:
    """Engine vs `model.generate` at each batch size, interleaved (order alternating per repeat)."""
    import torch

    from rollhub.inference.engines.hf import HFEngine
    from rollhub.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_dir)
    vocab = model.get_input_embeddings().num_embeddings
    engine = HFEngine(model, tokenizer, threads=cfg.threads, max_batch_size=max(cfg.concurrency))
    rows = []

    async def engine_run(prompts: list[list[int]]) -> float:
        return await engine_tokens_per_s(engine, prompts, cfg.new_tokens)

    try:
        warm = bench_prompts(2, cfg.prompt_tokens, vocab)
        asyncio.run(engine_run(warm))
        generate_tokens_per_s(model, warm, 4)
        for concurrency in cfg.concurrency:
            prompts = bench_prompts(concurrency, cfg.prompt_tokens, vocab)
            engine_runs, generate_runs = [], []
            for repeat in range(cfg.repeats):
                order = ("engine", "generate") if repeat % 2 == 0 else ("generate", "engine")
                for side in order:
                    if side == "engine":
                        engine_runs.append(asyncio.run(engine_run(prompts)))
                    else:
                        generate_runs.append(generate_tokens_per_s(model, prompts, cfg.new_tokens))
            engine_median, generate_median = statistics.median(engine_runs), statistics.median(generate_runs)
            rows.append(
                {
                    "concurrency": concurrency,
                    "engine_tokens_per_s": engine_median,
                    "generate_tokens_per_s": generate_median,
                    "speedup_vs_generate": engine_median / generate_median,
                    "engine_runs": [round(x, 1) for x in engine_runs],
                    "generate_runs": [round(x, 1) for x in generate_runs],
                }
            )
    finally:
        asyncio.run(engine.close())
        del model
        torch.set_num_threads(cfg.threads)
    base = rows[0]["engine_tokens_per_s"]
    for row in rows:
        row["speedup_vs_1"] = row["engine_tokens_per_s"] / base
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
    from rollhub.inference.engines.hf import HFEngine
    from rollhub.rollout.agent import AgentConfig
    from rollhub.rollout.config import EnvConfig, RolloutConfig
    from rollhub.rollout.manager import EnvManager

    agent = AgentConfig(
        max_new_tokens=cfg.turn_tokens, max_turns=cfg.max_turns, max_context_tokens=2048, temperature=1.0
    )
    env = EnvConfig(id=env_id, kwargs=dict(env_kwargs or {}), max_concurrent=256)
    rollout = RolloutConfig(
        group_size=cfg.group_size, lockstep=lockstep, async_ratio=0, redundant_trajectories=group_redundancy
    )
    async with HFEngine(
        model_dir, threads=cfg.threads, max_batch_size=64, prefix_cache_tokens=prefix_cache_tokens, seed=0
    ) as engine:
        manager = EnvManager(engine, engine.tokenizer, env=env, rollout=rollout, agent=agent)
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
    from rollhub.inference.models import init_tiny_model

    cfg = load_config(EngineBenchConfig, None, (QUICK if args.quick else []) + list(args.overrides))
    torch.set_num_threads(cfg.threads)
    with tempfile.TemporaryDirectory(prefix="rollhub-bench-") as folder:
        model_dir = Path(cfg.model) if cfg.model else init_tiny_model(Path(folder) / "model", size=cfg.size)
        model_name = model_dir.name if cfg.model else f"qwen3-{cfg.size}"
        print("decode throughput: HFEngine vs model.generate, interleaved ...", flush=True)
        decode = decode_vs_generate(model_dir, cfg)
        print_table(
            f"HFEngine vs model.generate, {model_name}, {cfg.threads} thread(s), {cfg.prompt_tokens}-token prompts, "
            f"{cfg.new_tokens} new tokens, median of {cfg.repeats}",
            [{k: v for k, v in row.items() if not k.endswith("_runs")} for row in decode],
        )
        result: dict[str, Any] = {
            "config": asdict(cfg),
            "model": model_name,
            "decode": decode,
            "speedup_vs_generate": {str(row["concurrency"]): row["speedup_vs_generate"] for row in decode},
        }
        if not cfg.decode_only:
            result.update(rollout_sections(model_dir, cfg))
    path = save_json(Path(args.out) / "rollout_engine.json", result)
    print(f"wrote {path}")
    return result


def rollout_sections(model_dir: Path, cfg: EngineBenchConfig) -> dict[str, Any]:
    """Prefix cache on/off and lockstep vs async on Sokoban, then with simulated env latencies."""
    from rollhub.bench.report import print_table

    print("multi-turn Sokoban: prefix cache off / on, lockstep ...", flush=True)
    no_cache = asyncio.run(collect(model_dir, cfg, prefix_cache_tokens=0, lockstep=False))
    cached = asyncio.run(collect(model_dir, cfg, prefix_cache_tokens=65536, lockstep=False))
    lockstep = asyncio.run(collect(model_dir, cfg, prefix_cache_tokens=65536, lockstep=True))
    print("simulated env latencies (bench/LatencySokoban-v0): lockstep / async / async + redundancy ...", flush=True)
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
                collect(model_dir, cfg, prefix_cache_tokens=65536, lockstep=False, group_redundancy=1, **latency_env)
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
    return result
