"""`rollhub bench compare-runs`: finished training runs side by side on the job's clock.

Under a fixed wall budget, which split between SFT and RL gives the best final policy? A run's
learning curve plots against trainer steps, so a run that spent 5 minutes on SFT and one that
spent 90 seconds cannot be read on one axis. Here every held-out reading is placed at the minute
of the job it was taken (SFT wall time, then RL's elapsed time), the warm-start reading at the end
of SFT, and the final (picked) policy is marked; a vertical line shows the budget when one is given.

It reads only what a run writes (`metrics.jsonl`, `summary.json`, `sft_done.json`,
`config.json`), so it works on any run folder, finished or not (an unfinished run has no final).

  rollhub bench compare-runs --set runs=[runs/a,runs/b] [--set labels=[a,b]] [--set budget_min=30]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollhub.bench.report import bench_setup, print_table, save_result
from rollhub.core.errors import UserError

QUICK: list[str] = []


@dataclass
class CompareRunsConfig:
    runs: list[str] = field(default_factory=list)  # training run folders (each with metrics.jsonl)
    labels: list[str] = field(default_factory=list)  # one per run; default: the folder names
    metric: str = "eval/success_rate"  # the held-out reading to plot
    budget_min: float | None = None  # a vertical line at the job's wall budget, in minutes

    def validate(self) -> None:
        if not self.runs:
            raise ValueError("runs must name at least one run folder, e.g. --set runs=[runs/a,runs/b]")
        if self.labels and len(self.labels) != len(self.runs):
            raise ValueError(f"labels has {len(self.labels)} entries for {len(self.runs)} runs")
        if self.budget_min is not None and not (math.isfinite(self.budget_min) and self.budget_min > 0):
            raise ValueError(f"budget_min must be a positive number of minutes, got {self.budget_min}")


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not JSON ({error})") from None
    return value if isinstance(value, dict) else None


def job_clock(steps: list[dict[str, Any]]) -> dict[int, float]:
    """Seconds of RL at each logged step, on one clock across resumes (step 0: the warm-start, 0 s).

    `time/elapsed_s` restarts at 0 when a run resumes; each restart continues from the last
    time seen, so a resumed run reads as one run (the time lost between the crash and the
    resume is not counted)."""
    clock: dict[int, float] = {0: 0.0}
    offset = last = 0.0
    for row in steps:
        elapsed = row.get("time/elapsed_s")
        if not isinstance(elapsed, (int, float)) or "step" not in row:
            continue
        if elapsed < last:  # a resume: its clock started again
            offset += last
        last = float(elapsed)
        clock[int(row["step"])] = offset + last
    return clock


def _sft_size(sft: dict[str, Any]) -> str:
    if not sft.get("enabled"):
        return "none"
    epochs = sft.get("epochs", "?")
    if isinstance(epochs, (int, float)):
        epochs = f"{epochs:g}"  # 5.0 reads as 5
    return f"{sft.get('episodes', '?')} x {epochs}"


def _job_minutes(summary: dict[str, Any], sft_s: float, last_reading: float) -> float:
    """The whole job's minutes, with SFT counted once even when its model was copied in.

    An RL-only run (an `sft_done.json` beside a copied `sft_model/`) records no SFT time in its
    own `wall_s`; the SFT it started from is added so that it reads like the whole job."""
    if "wall_s" not in summary:
        return last_reading  # unfinished: the last reading is as far as the job is known
    own_sft_s = float((summary.get("phases_s") or {}).get("sft_s", 0.0))
    return (float(summary["wall_s"]) - own_sft_s + sft_s) / 60.0


def read_run(run_dir: Path, label: str, metric: str) -> dict[str, Any]:
    """One run's held-out curve on the job's clock, with its warm-start, final and SFT settings."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        raise UserError(f"{run_dir} has no metrics.jsonl: --set runs must name training run folders")
    from rollhub.trainer.metrics import read_jsonl

    steps = read_jsonl(metrics)
    clock = job_clock(steps)
    readings = [
        (int(r["step"]), float(r[metric])) for r in steps if isinstance(r.get(metric), (int, float)) and "step" in r
    ]
    if not readings:
        raise UserError(f"{metrics} has no {metric!r} readings (was the run evaluated? eval.every)")
    sft_done = _read_json(run_dir / "sft_done.json") or {}
    sft_s = float(sft_done.get("wall_s", 0.0))
    sft = (_read_json(run_dir / "config.json") or {}).get("sft") or {}
    summary = _read_json(run_dir / "summary.json") or {}
    curve = [
        {"step": step, "minute": (sft_s + clock[step]) / 60.0, metric: value}
        for step, value in readings
        if step in clock
    ]
    row: dict[str, Any] = {
        "run": label,
        "SFT demos x epochs": _sft_size(sft),
        "SFT min": sft_s / 60.0,
        "warm-start": readings[0][1] if readings[0][0] == 0 else float("nan"),
        "RL steps": summary.get("steps", max(clock)),
        "job min": _job_minutes(summary, sft_s, curve[-1]["minute"]),
        "final (pick)": summary.get("final_success_rate", float("nan")),
        "picked step": summary.get("selected_step"),
        "last step": summary.get("last_step_success_rate", float("nan")),
        "greedy warm-start": summary.get("warmstart_greedy_success_rate", float("nan")),
        "greedy final": summary.get("final_greedy_success_rate", float("nan")),
    }
    row["RL gain"] = row["final (pick)"] - row["warm-start"]
    picked = row["picked step"]
    pick_minute = (sft_s + clock[picked]) / 60.0 if picked in clock else None
    return {"row": row, "curve": curve, "pick_minute": pick_minute}


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg, out = bench_setup(CompareRunsConfig, args, QUICK)
    labels = cfg.labels or [Path(r).name for r in cfg.runs]
    runs = [read_run(Path(r), label, cfg.metric) for r, label in zip(cfg.runs, labels)]
    rows = [r["row"] for r in runs]
    print_table(f"{cfg.metric} by run (minutes of the whole job: SFT, then RL)", rows)
    curves = [{"run": r["row"]["run"], "pick_minute": r["pick_minute"], "points": r["curve"]} for r in runs]
    result = {"benchmark": "compare-runs", "config": vars(cfg), "rows": rows, "curves": curves}
    save_result(out, result, "compare_runs.png", _draw, runs, cfg)
    return result


def _draw(ax: Any, runs: list[dict[str, Any]], cfg: CompareRunsConfig) -> None:
    for entry in runs:
        row, curve = entry["row"], entry["curve"]
        xs = [point["minute"] for point in curve]
        ys = [100 * point[cfg.metric] for point in curve]
        line = ax.plot(xs, ys, marker="o", markersize=3, label=f"{row['run']} (SFT {row['SFT demos x epochs']})")[0]
        if entry["pick_minute"] is not None and not math.isnan(row["final (pick)"]):
            star = [entry["pick_minute"]], [100 * row["final (pick)"]]
            ax.plot(*star, marker="*", markersize=14, linestyle="", color=line.get_color())
    if cfg.budget_min is not None:
        ax.axvline(cfg.budget_min, color="grey", linestyle="--", label=f"budget {cfg.budget_min:g} min")
    ax.set_xlabel("minute of the job (SFT, then RL; the first point of each line is the warm-start)")
    ax.set_ylabel(f"{cfg.metric} (%)")
    ax.set_title("held-out success on the job's clock (star: the picked final policy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
