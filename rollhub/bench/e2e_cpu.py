"""`rollhub bench e2e-cpu`: the real tiny-model Sokoban training, sync vs async, same budget.

Unlike the scheduling simulations, everything here is real: the tiny Qwen3 model, the
HFEngine, Sokoban, GiGPO with decoupled PPO (`configs/sokoban_tiny.yaml`). One shared
SFT warm-start, then two RL runs of the same number of trainer steps from it:

  sync   lockstep rollout, α = 0 (each batch generated, then trained on)
  async  env-level async rollout, α = `alpha` (generation continues while the trainer works)

Reported per run: wall time per step, trainer idle fraction (time blocked on the batch /
step time), final held-out success, and time-to-score: the steps and seconds until the
rolling training success rate first reaches a threshold. Per-step speed alone overstates
what async buys if stale samples learn less, so both are shown.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rollhub.bench.report import print_table, save_json, save_plot
from rollhub.core.config import load_config

logger = logging.getLogger(__name__)


@dataclass
class E2eConfig:
    recipe: str = "configs/sokoban_tiny.yaml"
    steps: int = 12
    alpha: float = 1.0
    sft_episodes: int = 300
    eval_episodes: int = 50
    score_delta: float = 0.10  # threshold = first-step training success of the sync run + delta
    rolling_window: int = 3
    threads: int = 1


QUICK = ["steps=3", "sft_episodes=16", "eval_episodes=4", "rolling_window=1"]


def _recipe_overrides(cfg: E2eConfig, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"run_dir={run_dir}",
        f"model.path={run_dir.parent / 'model'}",
        f"model.threads={cfg.threads}",
        f"engine.threads={cfg.threads}",
        f"sft.episodes={cfg.sft_episodes}",
        f"eval.episodes={cfg.eval_episodes}",
        "train.checkpoint_every=0",
        "train.log_trajectories=false",
        *extra,
    ]


def _train(recipe: str, overrides: list[str]) -> Any:
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.job import run_training

    config = load_config(RunConfig, recipe, overrides)
    return asyncio.run(run_training(config, progress=False, print_fn=logger.info))


def _records(run_dir: Path) -> list[dict[str, Any]]:
    from rollhub.trainer.metrics import read_jsonl

    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "time/step_s" in r]


def time_to_score(records: list[dict[str, Any]], threshold: float, window: int) -> tuple[int | None, float | None]:
    """First (step, elapsed seconds) whose rolling mean training success reaches threshold."""
    successes = [float(r.get("train/success_rate", 0.0)) for r in records]
    for i in range(len(records)):
        if i + 1 >= window and np.mean(successes[i + 1 - window : i + 1]) >= threshold:
            return i + 1, float(records[i]["time/elapsed_s"])
    return None, None


def run(args: argparse.Namespace) -> dict[str, Any]:
    overrides = [*QUICK, *args.overrides] if args.quick else list(args.overrides)
    cfg = load_config(E2eConfig, None, overrides)
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)  # every run starts fresh: the trainer refuses to overwrite a run folder
    out.mkdir(parents=True)
    started = time.perf_counter()
    warm_dir = out / "warmstart"
    warm = _train(cfg.recipe, _recipe_overrides(cfg, warm_dir, "train.steps=0"))
    runs: dict[str, Any] = {}
    for name, extra in (
        ("sync", ["rollout.lockstep=true", "rollout.async_ratio=0"]),
        ("async", ["rollout.lockstep=false", f"rollout.async_ratio={cfg.alpha}"]),
    ):
        run_dir = out / name
        run_dir.mkdir()
        shutil.copytree(warm_dir / "sft_model", run_dir / "sft_model")  # same warm-start, SFT skipped
        t0 = time.perf_counter()
        summary = _train(cfg.recipe, _recipe_overrides(cfg, run_dir, f"train.steps={cfg.steps}", *extra))
        records = _records(run_dir)
        runs[name] = {"summary": summary, "records": records, "wall_s": time.perf_counter() - t0}
    first = runs["sync"]["records"][0].get("train/success_rate", 0.0) if runs["sync"]["records"] else 0.0
    threshold = min(1.0, float(first) + cfg.score_delta)
    rows = []
    for name, data in runs.items():
        records = data["records"]
        rl_s = float(records[-1]["time/elapsed_s"]) if records else float("nan")
        steps_to, seconds_to = time_to_score(records, threshold, cfg.rolling_window)
        rows.append(
            {
                "mode": name,
                "steps": len(records),
                "s_per_step": rl_s / max(1, len(records)),
                "trainer_idle_frac": float(np.mean([r["trainer/idle_fraction"] for r in records]))
                if records
                else float("nan"),
                "final_success": data["summary"].final.success_rate if data["summary"].final else float("nan"),
                "last_train_success": float(records[-1].get("train/success_rate", float("nan")))
                if records
                else float("nan"),
                "steps_to_score": steps_to if steps_to is not None else "not reached",
                "s_to_score": seconds_to if seconds_to is not None else "not reached",
            }
        )
    sync_row, async_row = rows
    report = {
        "benchmark": "e2e-cpu",
        "config": asdict(cfg),
        "warmstart_success": warm.warmstart.success_rate if warm.warmstart else None,
        "score_threshold": threshold,
        "rows": rows,
        "step_speedup": sync_row["s_per_step"] / async_row["s_per_step"],
        "curves": {
            name: [
                {k: r.get(k) for k in ("time/elapsed_s", "train/success_rate", "trainer/idle_fraction", "time/step_s")}
                for r in d["records"]
            ]
            for name, d in runs.items()
        },
        "wall_s": time.perf_counter() - started,
    }
    print_table(
        f"e2e-cpu: tiny-model Sokoban, {cfg.steps} RL steps each from one SFT warm-start (threshold {threshold:.2f})",
        rows,
    )
    print(
        f"async is {report['step_speedup']:.2f}x faster per step; "
        f"warm-start held-out success {report['warmstart_success']}"
    )
    save_json(out / "result.json", report)
    save_plot(out / "e2e.png", _plot, report, panels=2)
    return report


def _plot(axes: Any, report: dict[str, Any]) -> None:
    for name, curve in report["curves"].items():
        xs = [c["time/elapsed_s"] for c in curve]
        axes[0].plot(xs, [c["train/success_rate"] for c in curve], "o-", label=name)
        axes[1].plot(range(1, len(curve) + 1), [c["time/step_s"] for c in curve], "o-", label=name)
    axes[0].axhline(report["score_threshold"], ls="--", c="gray", label="score threshold")
    axes[0].set_xlabel("RL wall time (s)")
    axes[0].set_ylabel("training success rate")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("wall time per step (s)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
