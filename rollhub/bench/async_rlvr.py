"""`rollhub bench async-rlvr`: RLVR on Math-v0 with long-tailed output lengths.

The real `rollhub/Math-v0` env, the shipped training loop and the real EnvManager /
GroupBuffer, with the SIMULATED latency-model engine (long-CoT lengths: lognormal, capped at
`max_new_tokens`) and a learner that sleeps instead of training, on a virtual clock. Per
simulated GPU count K, at equal GPU budget:

  sync, prompt-pinned   α = 0; all samples of a prompt on one replica (ROLL's affinity
                        router without replication) - the baseline
  sync, replicated      α = 0; each sample is its own request on the least-loaded replica
                        (queue scheduling + prompt replication)
  async α               α in {1, 2, 4}; `train_share` of the GPUs train, the rest generate

Each sample is a trajectory on its own coroutine, so a finished sample frees its slot at
once (queue scheduling). Speedups are time per training step against the baseline, with
the Prop. 2 bound S(α) for the measured workload. Options: `--set key=value` on
`RlvrBenchConfig`.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rollhub.bench.report import bench_setup, print_table, save_json, save_plot
from rollhub.bench.sim.latency_model import OutputLengths
from rollhub.bench.sim.training import (
    GPU_REPLICA,
    SimRun,
    best_train_share,
    make_tokenizer,
    measured_speedup_bound,
    pipeline_floor_s,
    simulate_virtual,
)

ROLL_FLASH_RLVR = 2.24  # best RLVR speedup over sync reported by ROLL Flash


@dataclass
class RlvrBenchConfig:
    prompts: int = 32  # groups per batch
    samples_per_prompt: int = 16  # group size
    gpus: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    alphas: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    train_shares: list[float] = field(default_factory=lambda: [0.25, 0.5])
    mean_tokens: float = 1500.0
    length_sigma: float = 1.0
    max_new_tokens: int = 8192
    # 1600 GPU-s = 100 s on 16 GPUs, ~30% of the sync step there
    train_gpu_s: float = 1600.0
    steps: int = 4
    warmup_steps: int = 1
    tokenizer: str = "sim"
    seed: int = 0


QUICK = [
    "prompts=4",
    "samples_per_prompt=4",
    "gpus=[16]",
    "alphas=[2.0]",
    "train_shares=[0.5]",
    "max_new_tokens=2048",
    "mean_tokens=300.0",
    "steps=3",
    "train_gpu_s=200.0",
]


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg, out = bench_setup(RlvrBenchConfig, args, QUICK)
    tokenizer = make_tokenizer(cfg.tokenizer)
    started = time.perf_counter()
    lengths = OutputLengths(kind="lognormal", mean_tokens=cfg.mean_tokens, sigma=cfg.length_sigma)
    report: dict[str, Any] = {"benchmark": "async-rlvr", "config": asdict(cfg), "simulation": True, "by_gpus": {}}
    for gpus in cfg.gpus:
        base = SimRun(
            env_id="rollhub/Math-v0",
            groups=cfg.prompts,
            group_size=cfg.samples_per_prompt,
            gpus=gpus,
            train_gpu_s=cfg.train_gpu_s,
            steps=cfg.steps,
            warmup_steps=cfg.warmup_steps,
            latency=GPU_REPLICA,
            output_lengths=lengths,
            max_new_tokens=cfg.max_new_tokens,
            seed=cfg.seed,
        )
        pinned = simulate_virtual(replace(base, name="sync-pinned", routing="prompt_affinity"), tokenizer)
        replicated = simulate_virtual(replace(base, name="sync-replicated"), tokenizer)
        rows = []
        for label, result in (("sync, prompt-pinned", pinned), ("sync, replicated", replicated)):
            rows.append(
                {
                    "config": label,
                    "step_s": result.step_s,
                    "speedup": pinned.step_s / result.step_s,
                    "idle_frac": result.trainer_idle_fraction,
                    "gen_gpus": result.replicas,
                }
            )
        runs = {"sync_pinned": pinned.as_dict(), "sync_replicated": replicated.as_dict()}
        for alpha in cfg.alphas:
            result, share = best_train_share(
                replace(base, name=f"async-a{alpha:g}", alpha=alpha), cfg.train_shares, tokenizer
            )
            bound = measured_speedup_bound(replicated, alpha)
            rows.append(
                {
                    "config": f"async α={alpha:g} β={share:g}",
                    "step_s": result.step_s,
                    "speedup": pinned.step_s / result.step_s,
                    "speedup_vs_replicated": replicated.step_s / result.step_s,
                    "bound_S": bound,
                    "of_bound": (replicated.step_s / result.step_s) / bound,
                    "floor_s": pipeline_floor_s(result, replicated, alpha),
                    "of_floor": pipeline_floor_s(result, replicated, alpha) / result.step_s,
                    "idle_frac": result.trainer_idle_fraction,
                    "gen_gpus": result.replicas,
                    "stale_drops": result.dropped_stale,
                    "mean_staleness": result.mean_staleness,
                }
            )
            runs[f"async_a{alpha:g}"] = result.as_dict()
        report["by_gpus"][str(gpus)] = {"rows": rows, "runs": runs}
        print_table(
            f"async-rlvr, Math-v0, {cfg.prompts}x{cfg.samples_per_prompt} samples, "
            f"lengths lognormal(mean {cfg.mean_tokens:g}, σ {cfg.length_sigma:g}) ≤ {cfg.max_new_tokens}, "
            f"{gpus} simulated GPUs",
            rows,
        )
    best_overall = max((r["speedup"], k, r["config"]) for k, sec in report["by_gpus"].items() for r in sec["rows"])
    report["headline"] = {
        "speedup": best_overall[0],
        "gpus": int(best_overall[1]),
        "config": best_overall[2],
        "roll_flash_rlvr": ROLL_FLASH_RLVR,
    }
    report["wall_s"] = time.perf_counter() - started
    save_json(out / "result.json", report)
    save_plot(out / "speedup.png", _plot, cfg, report)
    print(
        f"headline: {best_overall[2]} at {best_overall[1]} GPUs: {best_overall[0]:.2f}x over sync "
        f"(ROLL Flash RLVR: up to {ROLL_FLASH_RLVR}x)"
    )
    return report


def _plot(ax: Any, cfg: RlvrBenchConfig, report: dict[str, Any]) -> None:
    gpus = [int(k) for k in report["by_gpus"]]
    labels = [r["config"] for r in next(iter(report["by_gpus"].values()))["rows"]]
    for index, label in enumerate(labels):
        ys = [report["by_gpus"][str(g)]["rows"][index]["speedup"] for g in gpus]
        ax.plot(gpus, ys, "o-", label=label.split(" β=")[0])
    ax.axhline(ROLL_FLASH_RLVR, ls="--", c="gray", label="ROLL Flash RLVR 2.24x")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("simulated GPUs (equal budget)")
    ax.set_ylabel("speedup over sync, prompt-pinned")
    ax.set_title("async-rlvr: Math-v0, long-tailed lengths (simulated engine)")
    ax.grid(alpha=0.3)
    ax.legend()
