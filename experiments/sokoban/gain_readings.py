"""`python -m experiments.sokoban.gain_readings`: how far one run's held-out gain sits from its gain on many seeds.

The campaign's target judges RL's gain on one run by the held-out reading (100 seeds x 4 at
T = 1), a difference of two such readings. The same runs were also read on 1000 other seeds x 2
(the diagnostic split), five times the draws and so about 2.4 times tighter. Read together,
run by run, they show how much of a single held-out gain is the reading rather than the
policy: the spread of (held-out gain - diagnostic gain) over many runs is the held-out
reading's own noise on a gain, measured, not assumed. A run passes the bar on a split when
its gain there is at least `bar` points.

It reads the campaign's run record (`experiments/sokoban/results/runs.json`): each run's `summary`
holds the held-out warm-start and final, and its `diagnostic` the same two policies read on the
diagnostic seeds (`sft_T1`, `final_T1`). Runs without both are left out unless named.

  python -m experiments.sokoban.gain_readings [--set records=PATH] [--set runs=[a,b]] [--set bar=10]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.sokoban.cli import main as tool_main
from rollhub.bench.report import bench_setup, print_table, save_result
from rollhub.core.errors import UserError

QUICK: list[str] = []

HELD_OUT_DRAWS = 400  # 100 seeds x 4: the reading the campaign's target is judged on
DIAGNOSTIC_DRAWS = 2000  # 1000 seeds x 2


@dataclass
class GainReadingsConfig:
    records: str = "experiments/sokoban/results/runs.json"  # a run record with `runs: {name: {...}}`
    runs: list[str] = field(default_factory=list)  # run names to read; default: every run with both readings
    bar: float = 10.0  # the gain, in points, a run must reach to pass

    def validate(self) -> None:
        if not (math.isfinite(self.bar) and 0 < self.bar < 100):
            raise ValueError(f"bar must be a gain in points between 0 and 100, got {self.bar}")


def _fraction(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None


def read_gains(name: str, run: dict[str, Any]) -> dict[str, Any] | None:
    """The run's two gains in points, or None when it lacks one of the four readings."""
    summary, diagnostic = run.get("summary") or {}, run.get("diagnostic") or {}
    held = _fraction(summary.get("warmstart_success_rate")), _fraction(summary.get("final_success_rate"))
    diag = _fraction(diagnostic.get("sft_T1")), _fraction(diagnostic.get("final_T1"))
    if None in held or None in diag:
        return None
    held_gain, diag_gain = 100 * (held[1] - held[0]), 100 * (diag[1] - diag[0])
    return {
        "run": name,
        "held-out": f"{100 * held[0]:.2f} -> {100 * held[1]:.2f}",
        "held-out gain": round(held_gain, 2),
        "diagnostic": f"{100 * diag[0]:.1f} -> {100 * diag[1]:.1f}",
        "diagnostic gain": round(diag_gain, 2),
        "difference": round(held_gain - diag_gain, 2),
        # the draw noise alone (binomial, rooms fixed) of each gain, in points
        "held-out draw sd": round(100 * _gain_sd(held, HELD_OUT_DRAWS), 2),
        "diagnostic draw sd": round(100 * _gain_sd(diag, DIAGNOSTIC_DRAWS), 2),
    }


def _gain_sd(pair: tuple[float | None, float | None], draws: int) -> float:
    return math.sqrt(sum(p * (1 - p) / draws for p in pair if p is not None))


def read_records(cfg: GainReadingsConfig) -> list[dict[str, Any]]:
    path = Path(cfg.records)
    if not path.exists():
        raise UserError(f"{path} does not exist (a run record such as experiments/sokoban/results/runs.json)")
    try:
        runs = json.loads(path.read_text()).get("runs")
    except (json.JSONDecodeError, AttributeError) as error:
        raise UserError(f"{path} is not a run record with a 'runs' mapping ({error})") from None
    if not isinstance(runs, dict):
        raise UserError(f"{path} has no 'runs' mapping")
    rows = []
    for name in cfg.runs or list(runs):
        if name not in runs:
            raise UserError(f"{path} has no run named {name!r}")
        row = read_gains(name, runs[name])
        if row is None and cfg.runs:
            raise UserError(f"run {name!r} lacks a held-out or a diagnostic reading of its warm-start and final")
        if row is not None:
            rows.append(row)
    if not rows:
        raise UserError(f"no run in {path} has both a held-out and a diagnostic reading of warm-start and final")
    for row in rows:
        row["passes held-out"] = row["held-out gain"] >= cfg.bar
        row["passes diagnostic"] = row["diagnostic gain"] >= cfg.bar
    return rows


def spread(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the runs say about the held-out reading's noise on a gain."""
    differences = [row["difference"] for row in rows]
    result: dict[str, Any] = {
        "runs": len(rows),
        "mean difference (held-out - diagnostic), points": round(statistics.fmean(differences), 2),
        "mean held-out draw sd, points": round(statistics.fmean(row["held-out draw sd"] for row in rows), 2),
        "mean diagnostic draw sd, points": round(statistics.fmean(row["diagnostic draw sd"] for row in rows), 2),
        "pass held-out": sum(row["passes held-out"] for row in rows),
        "pass diagnostic": sum(row["passes diagnostic"] for row in rows),
        "verdicts differ": sum(row["passes held-out"] != row["passes diagnostic"] for row in rows),
    }
    if len(rows) > 1:
        result["sd of the difference, points"] = round(statistics.stdev(differences), 2)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg, out = bench_setup(GainReadingsConfig, args, QUICK)
    rows = read_records(cfg)
    title = f"RL gain per run, points: held-out (100 seeds x 4) against diagnostic (1000 x 2), bar +{cfg.bar:g}"
    print_table(
        title, rows, ["run", "held-out gain", "diagnostic gain", "difference", "passes held-out", "passes diagnostic"]
    )
    summary = spread(rows)
    print_table("what the runs say about one held-out gain", [summary])
    result = {"benchmark": "gain-readings", "config": vars(cfg), "rows": rows, "summary": summary}
    save_result(out, result, "gain_readings.png", _draw, rows, cfg)
    return result


def _draw(ax: Any, rows: list[dict[str, Any]], cfg: GainReadingsConfig) -> None:
    xs, ys = [row["diagnostic gain"] for row in rows], [row["held-out gain"] for row in rows]
    reach = [
        row[gain] + sign * row[sd]
        for row in rows
        for sign in (-1, 1)
        for gain, sd in (("held-out gain", "held-out draw sd"), ("diagnostic gain", "diagnostic draw sd"))
    ]
    low, high = min(reach + [0.0]) - 1, max(reach + [cfg.bar]) + 1
    ax.fill_between([cfg.bar, high], cfg.bar, high, color="tab:green", alpha=0.08, label="passes on both")
    ax.plot([low, high], [low, high], color="grey", linewidth=1, label="held-out gain = diagnostic gain")
    ax.axhline(cfg.bar, color="tab:red", linestyle="--", linewidth=1, label=f"bar +{cfg.bar:g}")
    ax.axvline(cfg.bar, color="tab:red", linestyle="--", linewidth=1)
    ax.errorbar(
        xs,
        ys,
        yerr=[r["held-out draw sd"] for r in rows],
        xerr=[r["diagnostic draw sd"] for r in rows],
        fmt="o",
        markersize=4,
        capsize=2,
        label="a run (bars: draw noise, 1 sd)",
    )
    for row, x, y in zip(rows, xs, ys):
        ax.annotate(row["run"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("RL gain on the diagnostic seeds (1000 x 2, T = 1), points")
    ax.set_ylabel("RL gain on the held-out seeds (100 x 4, T = 1), points")
    ax.set_title("one run's gain, read on two splits")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def main(argv: list[str] | None = None) -> int:
    return tool_main(run, "gain-readings", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
