"""Fit the latency-model engine to the real transformers engine, then validate it.

The scheduling benchmarks trust `LatencyModelEngine` only as far as its timing matches a
real engine. This script measures HFEngine on the tiny CPU model:

1. runs c identical-length requests for several concurrencies c and prompt lengths, and
   times every model step on the engine thread (CPU time, so neighbours on a shared
   machine do not leak into the numbers);
2. keeps the median decode iteration per batch size as a table (interpolated between
   points; the curve is concave, so one straight line misses batch 1 by about the whole
   validation tolerance), plus a least-squares line
   `decode_base_s + decode_per_request_s * (b - 1)` for reference, and
   fits `prefill_s(p) = prefill_base_s + prefill_per_token_s * p`
   on the steps that admitted requests;
3. validates on workloads the fit never saw (mixed lengths, staggered arrivals, one long
   straggler): the real engine's makespan (process CPU time; wall time is reported too) vs the
   simulated one, within 15%.

`rollhub bench fit-latency` writes the fitted parameters (`latency_params.json`) and the
validation table; `--set save_to=PATH` also copies the parameters there.
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

import numpy as np

from rollhub.bench.report import print_table, save_json, save_plot
from rollhub.core.config import load_config

logger = logging.getLogger(__name__)


@dataclass
class FitConfig:
    model_size: str = "5m"
    model_path: str = ""  # an existing HF dir; empty = build the tiny model in a temp dir
    threads: int = 1
    concurrencies: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    long_tokens: int = 64
    prompt_tokens: list[int] = field(default_factory=lambda: [16, 128])
    repeats: int = 5
    tolerance: float = 0.15
    save_to: str = ""

    def validate(self) -> None:
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise ValueError("concurrencies must be a non-empty list of positive ints")
        if self.long_tokens < 2 or not self.prompt_tokens:
            raise ValueError("long_tokens must be >= 2 and prompt_tokens non-empty")


@dataclass(frozen=True)
class Request:
    """One request of a workload: when it arrives, its prompt and output lengths."""

    arrive_s: float
    prompt_tokens: int
    output_tokens: int


async def _makespan(engine: Any, requests: list[Request], *, force_length: bool, seed: int = 0) -> float:
    """Time from the first arrival until the last request finishes (the engine's clock).

    Prompts are distinct random ids so a prefix cache cannot skip the prefill."""
    from rollhub.inference.engines.base import SamplingParams

    loop = asyncio.get_running_loop()
    start = loop.time()
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(10, 2000, size=r.prompt_tokens).tolist() for r in requests]

    async def one(index: int, request: Request) -> None:
        await asyncio.sleep(request.arrive_s)
        sampling = SamplingParams(max_new_tokens=request.output_tokens, temperature=1.0, seed=index)
        if force_length:
            gen = await engine.generate(prompts[index], sampling, meta_length=request.output_tokens)
        else:
            gen = await engine.generate(prompts[index], sampling)
        if len(gen.token_ids) != request.output_tokens:
            raise RuntimeError(
                f"expected {request.output_tokens} tokens, got {len(gen.token_ids)} ({gen.finish_reason})"
            )

    await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    return loop.time() - start


@dataclass
class StepRecord:
    batch: int  # requests in the batch during the step (running + admitted)
    prefill_tokens: int  # prompt tokens of the requests admitted in this step
    cpu_s: float  # CPU time of the engine thread in the model call
    overhead_cpu_s: float = 0.0  # the run's CPU outside model calls (scheduler, event loop), per step


class StepRecorder:
    """Times every model step of an HFEngine, in CPU time.

    On a machine shared with other jobs, wall time measures the neighbours as much as the
    engine; CPU time does not. The model thread's CPU time is taken around the engine's
    internal `_step` (the unit of work its scheduler hands to the model thread); the rest
    of the process's CPU time during a run (the engine's scheduler and the event loop) is
    spread evenly over that run's steps, so the fitted iteration is the whole cost of a
    step. With one torch thread and an engine that is never idle, the process CPU time of
    a run is what its makespan would be on an otherwise idle core."""

    def __init__(self, engine: Any):
        self.records: list[StepRecord] = []
        # one model iteration per `_step` call: the engine otherwise chains decode steps inside
        # one call while nothing needs the event loop, and a record would hold several iterations
        engine.max_steps_per_call = 1
        original = engine._step

        def timed_step(newcomers: list[Any]) -> Any:
            batch = len(engine._batch) + len(newcomers)
            tokens = sum(len(r.prompt_ids) for r in newcomers)
            cpu0 = time.thread_time()
            try:
                return original(newcomers)
            finally:
                self.records.append(StepRecord(batch, tokens, time.thread_time() - cpu0))

        engine._step = timed_step

    def measure(
        self, loop: asyncio.AbstractEventLoop, engine: Any, requests: list[Request], repeats: int, seed: int = 0
    ) -> dict[str, float]:
        """Run the workload `repeats` times; the fastest wall makespan and the fastest
        process-CPU makespan."""
        walls, cpus = [], []
        for repeat in range(repeats):
            first = len(self.records)
            cpu0 = time.process_time()
            wall = loop.run_until_complete(_makespan(engine, requests, force_length=False, seed=seed * 1000 + repeat))
            cpu = time.process_time() - cpu0
            steps = self.records[first:]
            overhead = max(0.0, cpu - sum(r.cpu_s for r in steps)) / max(1, len(steps))
            for record in steps:
                record.overhead_cpu_s = overhead
            walls.append(wall)
            cpus.append(cpu)
        return {"wall_s": min(walls), "cpu_s": min(cpus)}


def _simulate(params: Any, requests: list[Request]) -> float:
    from rollhub.bench.sim.latency_model import LatencyModelEngine
    from rollhub.bench.sim.virtual_clock import run_virtual

    return run_virtual(_makespan(LatencyModelEngine(params), requests, force_length=True))


def fit(records: list[StepRecord], max_batch: int, source: str) -> tuple[Any, list[dict[str, float]]]:
    """Least-squares lines: decode-only steps give iteration(batch); steps that admitted
    requests give the prefill cost (their time minus one decode iteration) per token."""
    from rollhub.bench.sim.latency_model import LatencyParams

    decode: dict[int, list[float]] = {}
    for r in records:
        if r.prefill_tokens == 0:
            decode.setdefault(r.batch, []).append(r.cpu_s + r.overhead_cpu_s)
    batches = np.array(sorted(decode), dtype=float)
    iteration = np.array([float(np.median(decode[int(b)])) for b in batches])
    weights = np.sqrt([len(decode[int(b)]) for b in batches])
    if len(batches) > 1:
        slope, intercept = np.polyfit(batches - 1, iteration, 1, w=weights)
    else:
        slope, intercept = 0.0, float(iteration[0])
    if intercept <= 0:  # keep the model physical when noise tilts the line
        intercept, slope = float(iteration.min()), max(0.0, float(slope))

    def iteration_s(batch: int) -> float:
        return float(intercept + slope * (batch - 1))

    prefill = [
        (r.prefill_tokens, r.cpu_s + r.overhead_cpu_s - iteration_s(r.batch)) for r in records if r.prefill_tokens > 0
    ]
    tokens = np.array([p[0] for p in prefill], dtype=float)
    extra = np.array([p[1] for p in prefill])
    if len(set(tokens.tolist())) > 1:
        p_slope, p_intercept = np.polyfit(tokens, extra, 1)
    else:
        p_slope, p_intercept = 0.0, float(np.median(extra)) if len(extra) else 0.0
    params = LatencyParams(
        prefill_base_s=max(0.0, float(p_intercept)),
        prefill_per_token_s=max(0.0, float(p_slope)),
        decode_base_s=float(intercept),
        decode_per_request_s=max(0.0, float(slope)),
        max_batch=max_batch,
        iteration_table=tuple((int(b), float(t)) for b, t in zip(batches, iteration)),
        source=source,
    )
    rows = [
        {
            "batch": int(b),
            "steps": len(decode[int(b)]),
            "measured_ms": 1000 * it,
            "fitted_ms": 1000 * params.iteration_s(int(b)),
            "tokens_per_s": b / it,
        }
        for b, it in zip(batches, iteration)
    ]
    return params, rows


def validation_workloads(rng: np.random.Generator, long_tokens: int) -> dict[str, list[Request]]:
    """Workloads unlike the fitting ones: mixed lengths, staggered arrivals, a long tail."""
    long_tokens = max(long_tokens, 24)
    mixed = [Request(0.0, int(rng.integers(16, 128)), int(rng.integers(8, long_tokens + 1))) for _ in range(12)]
    staggered = [
        Request(0.05 * i, int(rng.integers(16, 96)), int(rng.integers(16, long_tokens + 1))) for i in range(10)
    ]
    tail = [Request(0.0, 48, 12) for _ in range(7)] + [Request(0.0, 48, 3 * long_tokens)]
    return {"mixed-12": mixed, "staggered-10": staggered, "long-tail-8": tail}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rollhub.inference.engines.hf import HFEngine
    from rollhub.inference.models import init_tiny_model

    overrides = list(args.overrides)
    if args.quick:
        overrides = ["concurrencies=[1,4,8]", "repeats=1", "long_tokens=24", "prompt_tokens=[16,64]", *overrides]
    cfg = load_config(FitConfig, None, overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = cfg.model_path or str(init_tiny_model(Path(tmp) / "tiny", size=cfg.model_size))
        max_batch = max(cfg.concurrencies)
        engine = HFEngine(model_path, threads=cfg.threads, max_batch_size=max(32, max_batch), stop_token_ids=())
        loop = asyncio.new_event_loop()
        recorder = StepRecorder(engine)
        try:
            recorder.measure(loop, engine, [Request(0.0, 32, 8)], 1)  # warm-up: first forward passes are slow
            recorder.records.clear()
            for c in cfg.concurrencies:
                for p in cfg.prompt_tokens:
                    recorder.measure(loop, engine, [Request(0.0, p, cfg.long_tokens)] * c, cfg.repeats, seed=c)
            fit_records = list(recorder.records)
            params, fit_rows = fit(
                fit_records,
                max_batch=engine.max_batch_size,
                source=f"fit: HFEngine tiny-{cfg.model_size}, {cfg.threads} thread(s)",
            )
            validation = []
            for name, requests in validation_workloads(np.random.default_rng(0), cfg.long_tokens).items():
                measured = recorder.measure(loop, engine, requests, cfg.repeats, seed=7)
                predicted = _simulate(params, requests)
                validation.append(
                    {
                        "workload": name,
                        "measured_s": measured["cpu_s"],
                        "measured_wall_s": measured["wall_s"],
                        "predicted_s": predicted,
                        "error": predicted / measured["cpu_s"] - 1,
                    }
                )
        finally:
            loop.run_until_complete(engine.close())
            loop.close()
    params.to_json(out / "latency_params.json")
    if cfg.save_to:
        params.to_json(cfg.save_to)
    worst = max(abs(v["error"]) for v in validation)
    result = {
        "benchmark": "fit-latency",
        "config": asdict(cfg),
        "params": asdict(params),
        "fit_points": fit_rows,
        "validation": validation,
        "worst_error": worst,
        "within_tolerance": worst <= cfg.tolerance,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print_table("latency model fit: decode iteration vs batch (real HFEngine, engine-thread CPU time)", fit_rows)
    print_table(f"validation: predicted vs measured makespan (tolerance {cfg.tolerance:.0%})", validation)
    save_json(out / "result.json", result)
    save_plot(out / "fit.png", _plot, fit_rows, params)
    return result


def _plot(ax: Any, fit_rows: list[dict], params: Any) -> None:
    conc = [r["batch"] for r in fit_rows]
    ax.plot(conc, [r["measured_ms"] for r in fit_rows], "o", label="measured (HFEngine, median)")
    xs = np.linspace(min(conc), max(conc), 50)
    ax.plot(xs, [1000 * params.iteration_s(int(round(x))) for x in xs], "-", label="fitted latency model")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("decode iteration (ms)")
    ax.set_title("Latency model fit")
    ax.legend()
