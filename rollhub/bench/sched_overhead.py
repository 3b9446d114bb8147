"""`rollhub bench sched-overhead`: CPU the rollout scheduler spends per training step at
~1,000 concurrent trajectories, as a share of the step time it schedules.

The training loop (`rl_loop`), EnvManager, GroupBuffer, agent layer and asyncio run for real
on a virtual clock; the engine and the envs are simulations whose own CPU is measured and
subtracted (the simulated engine's timing model, the simulation tokenizer), and the learner
sleeps instead of training. What remains is what the scheduling stack would cost a real run,
compared with the simulated step time. Target: < 1%.

A second table prices the agent layer's tokenisation with the real BPE tokenizer (chat
template + encode per turn), which a real run pays on top of scheduling.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rollhub.bench.report import bench_setup, print_table, save_json, save_plot
from rollhub.bench.sim.training import SimResult, SimRun, make_tokenizer, simulate_virtual


@dataclass
class OverheadConfig:
    concurrent: list[list[int]] = field(default_factory=lambda: [[16, 8], [64, 8], [125, 8]])  # groups x size
    async_groups: int = 64  # α = 1 run: (α+1) x 64 x 8 = 1,024 trajectories in flight
    group_size: int = 8
    turns: int = 10
    step_std_s: float = 10.0
    train_gpu_s: float = 2048.0
    gpus: int = 16
    steps: int = 3
    real_tokenizer_groups: int = 8
    target: float = 0.01


QUICK = ["concurrent=[[4,4]]", "async_groups=4", "group_size=4", "turns=3", "steps=2", "real_tokenizer_groups=2"]


def _row(label: str, result: SimResult) -> dict[str, Any]:
    return {
        "config": label,
        "trajectories_in_flight": result.peak_trajectories_in_flight,
        "step_s": result.step_s,
        "cpu_s_per_step": result.cpu_s_per_step,
        "scheduler_cpu_s_per_step": result.scheduler_cpu_s_per_step,
        "overhead": result.scheduler_cpu_s_per_step / result.step_s,
        "ms_per_env_call": 1000 * result.scheduler_cpu_s_per_step * len(result.step_times_s) / max(1, result.env_calls),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg, out = bench_setup(OverheadConfig, args, QUICK)
    started = time.perf_counter()
    env_kwargs = {"turns": cfg.turns, "step_std_s": cfg.step_std_s}
    base = SimRun(
        env_kwargs=env_kwargs, group_size=cfg.group_size, gpus=cfg.gpus, train_gpu_s=cfg.train_gpu_s, steps=cfg.steps
    )
    tokenizer = make_tokenizer("sim")
    rows = []
    for groups, size in cfg.concurrent:
        result = simulate_virtual(replace(base, name="env-async", groups=groups, group_size=size), tokenizer)
        rows.append(_row(f"sync env-async {groups}x{size}", result))
    result = simulate_virtual(
        replace(base, name="async", groups=cfg.async_groups, alpha=1.0, train_share=0.75), tokenizer
    )
    rows.append(_row(f"async α=1 {cfg.async_groups}x{cfg.group_size}", result))
    print_table(f"scheduler CPU per training step (simulators subtracted), target < {cfg.target:.0%}", rows)

    tokenizer_rows = []
    for kind in ("sim", "real"):
        small = simulate_virtual(
            replace(base, name=kind, groups=cfg.real_tokenizer_groups, steps=2, warmup_steps=1), make_tokenizer(kind)
        )
        cpu_total = small.cpu_s_per_step * len(small.step_times_s)
        tokenizer_rows.append(
            {
                "tokenizer": kind,
                "env_calls": small.env_calls,
                "ms_cpu_per_turn_all": 1000 * cpu_total / max(1, small.env_calls),
            }
        )
    print_table("agent-layer CPU per turn (everything in the process, simulators included)", tokenizer_rows)

    at_1000 = [r for r in rows if r["trajectories_in_flight"] >= 900]
    report = {
        "benchmark": "sched-overhead",
        "config": asdict(cfg),
        "rows": rows,
        "tokenizer_rows": tokenizer_rows,
        "overhead_at_1000": max((r["overhead"] for r in at_1000), default=None),
        "meets_target": all(r["overhead"] < cfg.target for r in at_1000) if at_1000 else None,
        "wall_s": time.perf_counter() - started,
    }
    save_json(out / "result.json", report)
    save_plot(out / "overhead.png", _plot, rows, cfg.target)
    return report


def _plot(ax: Any, rows: list[dict[str, Any]], target: float) -> None:
    ax.bar([r["config"] for r in rows], [100 * r["overhead"] for r in rows])
    ax.axhline(100 * target, ls="--", c="gray", label=f"target {target:.0%}")
    ax.set_ylabel("scheduler CPU / step time (%)")
    ax.set_title("Scheduler overhead (simulated engine and envs subtracted)")
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend()
