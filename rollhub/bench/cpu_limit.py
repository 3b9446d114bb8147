"""`rollhub bench cpu-limit`: how close each phase of a CPU job runs to what the machine can do.

A speed claim in seconds says little on its own: the same job is twice as fast on a quiet machine
as on a loaded one, and a 2x gain may still leave it at 5% of the silicon. This benchmark measures
the ceiling first, sustained dense matmul throughput (fp32 and bf16, 1 and 2 threads, a square
product large enough to stream from cache), then runs each phase of the main job on its model
(a prefill of an episode-length prompt batch, batched decoding through the in-process engine,
and one training forward/backward) and states each as the FLOPs it needs per token, the FLOP/s it
reached and the share of the ceiling at the same threads and dtype (utilisation).

FLOPs per token are the dense ones (2 per weight in a matmul, the output head included, plus the
attention scores and values at the phase's context); forward and backward are 3x a forward.

Options (`--set key=value`): the fields of CpuLimitConfig. `--quick` runs a tiny model briefly.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rollhub.bench.report import bench_setup, print_table, save_json
from rollhub.core.errors import UserError

#: the main job's model, where `rollhub model smollm2` (or the recipe's first run) exports it
MAIN_JOB_MODEL = "runs/models/smollm2-135m-instruct"


@dataclass
class CpuLimitConfig:
    model: str = MAIN_JOB_MODEL  # a model folder, or "tiny" (a random-init tiny Qwen3 built in --out)
    matmul_size: int = 1024  # square fp32/bf16 products of this size for the ceiling
    seconds: float = 2.0  # per ceiling measurement
    batch: int = 16  # rows of the prefill, decode and training phases
    prompt_tokens: int = 470  # an episode's length in the main job (its shared opening is ~270)
    new_tokens: int = 32  # decoded per row
    threads: int = 1  # threads of the phase measurements

    def validate(self) -> None:
        for name in ("matmul_size", "batch", "prompt_tokens", "new_tokens", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not self.seconds > 0:
            raise ValueError("seconds must be > 0")


QUICK = ["model=tiny", "matmul_size=256", "seconds=0.3", "batch=4", "prompt_tokens=64", "new_tokens=8"]


def matmul_gflops(size: int, dtype: torch.dtype, threads: int, seconds: float) -> float:
    """Sustained GFLOP/s of size x size products (2 n^3 FLOPs each), after one warm-up product."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        torch.mm(a, b)
        count, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            torch.mm(a, b)
            count += 1
        return 2 * size**3 * count / elapsed / 1e9
    finally:
        torch.set_num_threads(previous)


def forward_flops_per_token(config: Any, context: int) -> float:
    """Dense FLOPs of one token's forward: 2 per matmul weight (head included) + attention at `context`."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    q = heads * head_dim
    per_layer = hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * config.intermediate_size
    attention = 2 * q * context * 2  # scores and the weighted sum of values
    return 2 * layers * per_layer + layers * attention + 2 * hidden * config.vocab_size


def _load(model: str, out: Path) -> tuple[Any, Any, str]:
    from rollhub.inference.models import init_tiny_model, load_model_and_tokenizer

    if model == "tiny":
        path = out / "model-tiny"
        if not (path / "config.json").is_file():
            init_tiny_model(path, "5m")
        model = str(path)
    elif not (Path(model) / "config.json").is_file():
        raise UserError(
            f"no model at {model}: export the main job's with `rollhub model smollm2`, "
            "name a model folder with --set model=PATH, or measure a tiny one with --set model=tiny"
        )
    loaded, tokenizer = load_model_and_tokenizer(model, dtype=torch.float32, device="cpu")
    return loaded, tokenizer, model


def measure_phases(cfg: CpuLimitConfig, out: Path) -> tuple[list[dict[str, Any]], str]:
    model, _, path = _load(cfg.model, out)
    model.eval()
    torch.set_num_threads(cfg.threads)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (cfg.batch, cfg.prompt_tokens), generator=generator)
    rows: list[dict[str, Any]] = []

    with torch.no_grad():
        model(input_ids=ids[:1, :8], use_cache=False)  # warm-up
        started = time.perf_counter()
        model(input_ids=ids, use_cache=False)
        elapsed = time.perf_counter() - started
    tokens = cfg.batch * cfg.prompt_tokens
    rows.append(_row("prefill", tokens, elapsed, forward_flops_per_token(model.config, cfg.prompt_tokens // 2)))

    generated, elapsed = asyncio.run(_decode(path, ids, cfg))
    decode_flops = forward_flops_per_token(model.config, cfg.prompt_tokens + cfg.new_tokens // 2)
    rows.append(_row(f"decode (batch {cfg.batch}, engine)", generated, elapsed, decode_flops))

    model.train()
    started = time.perf_counter()
    logits = model(input_ids=ids, use_cache=False).logits
    loss = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    loss.backward()
    elapsed = time.perf_counter() - started
    rows.append(
        _row("forward + backward", tokens, elapsed, 3 * forward_flops_per_token(model.config, cfg.prompt_tokens // 2))
    )
    return rows, path


async def _decode(path: str, ids: torch.Tensor, cfg: CpuLimitConfig) -> tuple[int, float]:
    from rollhub.inference.engines.base import SamplingParams
    from rollhub.inference.engines.hf import HFEngine

    engine = HFEngine(path, threads=cfg.threads, max_batch_size=cfg.batch, share_prompts=False)
    sampling = SamplingParams(max_new_tokens=cfg.new_tokens, temperature=1.0, seed=0)
    try:
        await engine.generate(ids[0, :8].tolist(), SamplingParams(max_new_tokens=2))  # warm-up
        started = time.perf_counter()
        generations = await asyncio.gather(*(engine.generate(row.tolist(), sampling) for row in ids))
        elapsed = time.perf_counter() - started
    finally:
        await engine.close()
    return sum(len(g.token_ids) for g in generations), elapsed


def _row(phase: str, tokens: int, seconds: float, flops_per_token: float) -> dict[str, Any]:
    return {
        "phase": phase,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "gflop_per_token": flops_per_token / 1e9,
        "gflops": tokens * flops_per_token / seconds / 1e9,
    }


def run(args: argparse.Namespace) -> None:
    cfg, out = bench_setup(CpuLimitConfig, args, QUICK)
    ceiling = []
    for dtype in (torch.float32, torch.bfloat16):
        for threads in (1, 2):
            gflops = matmul_gflops(cfg.matmul_size, dtype, threads, cfg.seconds)
            ceiling.append({"dtype": str(dtype).removeprefix("torch."), "threads": threads, "gflops": gflops})
    print_table(f"ceiling: matmul {cfg.matmul_size}^3", ceiling)
    peak = next(r["gflops"] for r in ceiling if r["dtype"] == "float32" and r["threads"] == cfg.threads)
    phases, model = measure_phases(cfg, out)
    for row in phases:
        row["utilisation"] = row["gflops"] / peak
    print(f"phases of the main job on {model}, fp32, {cfg.threads} thread(s); utilisation = GFLOP/s / fp32 ceiling")
    print_table("phases", phases)
    path = save_json(out / "cpu_limit.json", {"config": asdict(cfg), "ceiling": ceiling, "phases": phases})
    print(f"wrote {path}")
