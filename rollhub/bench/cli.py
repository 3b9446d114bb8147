"""`rollhub bench NAME`: each benchmark prints a table and writes JSON (and a PNG where a
plot helps) under `--out` (default `runs/bench/NAME`).

A benchmark is a function `run(args) -> dict` in its own module, listed in BENCHMARKS as
"module:function" so nothing heavy imports before it is chosen. Extra options go after the
name as `--set key=value` pairs, read by the benchmark itself.
"""

from __future__ import annotations

import argparse
import importlib

from rollhub.core.errors import UserError

BENCHMARKS: dict[str, tuple[str, str]] = {
    # name: ("module:function", one-line description)
    "alfworld": (
        "rollhub.bench.alfworld:run",
        "ALFWorld real engine: cold/cached reset, step latency, worker memory per env, 64 concurrent envs",
    ),
    "env": (
        "rollhub.bench.env_card:run",
        "performance card of one env id (adapters too): latency p50/p99, failures, memory, containers, tokens",
    ),
    "envs": (
        "rollhub.bench.env_throughput:run",
        "reset latency, steps/s, memory per env for every registered env; Sokoban rooms/s",
    ),
    "async": (
        "rollhub.bench.async_env:run",
        "any env id: real rollout path, lockstep vs env-async batches interleaved, measured vs predicted gain",
    ),
    "async-agentic": (
        "rollhub.bench.async_agentic:run",
        "SIMULATED agentic RL: lockstep vs env-level async vs async training vs redundancy",
    ),
    "async-rlvr": (
        "rollhub.bench.async_rlvr:run",
        "SIMULATED RLVR on Math-v0: sync vs replication vs async training over GPU counts",
    ),
    "sched-overhead": (
        "rollhub.bench.sched_overhead:run",
        "scheduler CPU per step at ~1,000 concurrent trajectories (simulated engine/envs subtracted)",
    ),
    "e2e-cpu": (
        "rollhub.bench.e2e_cpu:run",
        "real tiny-model Sokoban training, sync vs async: s/step, trainer idle, time-to-score",
    ),
    "run-signal": (
        "rollhub.bench.run_signal:run",
        "a run's groups by window: all succeed / mixed / all fail, mistakes its group estimator cannot see, clip, KL",
    ),
    "compare-runs": (
        "rollhub.bench.compare_runs:run",
        "finished training runs on the job's clock: held-out success by minute (SFT, then RL), warm-start, pick, gain",
    ),
    "fit-latency": (
        "rollhub.bench.fit_latency_model:run",
        "fit the SIMULATED latency-model engine to the real HFEngine and validate it",
    ),
    "sandbox": (
        "rollhub.bench.sandbox:run",
        "Docker sandbox start/exec latency, throughput at 1/8/32/64 concurrent, idle memory, leaks",
    ),
    "rollout-engine": (
        "rollhub.bench.rollout_engine:run",
        "real HFEngine on CPU: decode tok/s at 1/8/32 concurrent, prefix-cache and lockstep effects on Sokoban",
    ),
    "trainer": (
        "rollhub.bench.trainer:run",
        "trainer step on a recorded Sokoban batch: padded vs packed micro-batches, 1 vs 2 ranks, tokens/s, peak memory",
    ),
    "weight-sync": (
        "rollhub.bench.weight_sync:run",
        "weight push latency to rollhub serve processes, disk vs distributed (gloo), tiny model and SmolLM2-135M",
    ),
    "redundancy-bias": (
        "rollhub.bench.redundancy_bias:run",
        "SIMULATED: difficulty mix of trained groups with redundancy (cancel vs carry, staleness rules)",
    ),
    "async-real": (
        "rollhub.bench.async_real:run",
        "real tiny-model training on real ALFWorld and SWE envs: lockstep vs env-async vs async vs async+redundancy",
    ),
    "cpu-limit": (
        "rollhub.bench.cpu_limit:run",
        "sustained matmul GFLOP/s (fp32/bf16, 1/2 threads) and each main-job phase's FLOPs and utilisation of it",
    ),
    "peer-trl": ("rollhub.bench.peer_trl:run", "TRL GRPOTrainer vs ours (sync, async), interleaved: accuracy vs time"),
    "swe": (
        "rollhub.bench.swe:run",
        "SWE-v0 reset/tool/eval latencies; gold and empty patches graded by us and by the official swebench harness",
    ),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="run a reproducible benchmark (rollhub bench --list)")
    parser.add_argument("name", nargs="?", help="benchmark name")
    parser.add_argument(
        "target", nargs="?", help="what it measures, where it takes one (bench env, bench async: an env id)"
    )
    parser.add_argument("--list", action="store_true", help="list benchmarks")
    parser.add_argument("--out", default=None, help="output folder (default runs/bench/NAME)")
    parser.add_argument("--quick", action="store_true", help="smallest sizes (smoke test)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="benchmark option"
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        for name, (_, description) in sorted(BENCHMARKS.items()):
            print(f"{name:20s} {description}")
        return 0
    if args.name not in BENCHMARKS:
        import difflib

        close = difflib.get_close_matches(args.name, list(BENCHMARKS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; available: {', '.join(sorted(BENCHMARKS))}"
        raise UserError(f"unknown benchmark '{args.name}'{hint}")
    target, _ = BENCHMARKS[args.name]
    module_name, _, func_name = target.partition(":")
    if args.out is None:
        args.out = f"runs/bench/{args.name}"
    getattr(importlib.import_module(module_name), func_name)(args)
    return 0
