"""Run metrics: one JSON line per step (the record), TensorBoard scalars (the dashboard),
and a PNG learning curve (the summary), evaluation readings drawn with their n and interval.

`truncate_after(step)` rewrites the JSONL so it ends at the checkpoint a run resumes from:
steps redone after a crash are then logged once, never twice. The rewrite goes to a temporary
file that is fsynced and renamed over the log, so a kill during it keeps the old log whole,
and opening a log drops a torn last line first, so the next record is never fused onto it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rollhub.core.intervals import wilson_interval
from rollhub.rollout.trajectory_log import drop_torn_tail
from rollhub.trainer.checkpoint import fsync_dir

logger = logging.getLogger(__name__)


class MetricsLog:
    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        filename: str = "metrics.jsonl",
        trackers: list[Any] | None = None,
    ):
        """`trackers`: further sinks of the step scalars (rollhub.trainer.trackers), closed with the log."""
        self.run_dir = Path(run_dir)
        self.trackers = list(trackers or [])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / filename
        drop_torn_tail(self.path)  # a kill mid-write must not cost the next record too
        self._writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            except Exception as exc:  # tensorboard is optional at run time
                logger.warning("TensorBoard disabled: %s", exc)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        scalars = {
            key: value
            for key, value in record.items()
            if key != "step"
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
        }
        if self._writer is not None:
            for key, value in scalars.items():
                self._writer.add_scalar(key, value, step)
            self._writer.flush()
        for tracker in self.trackers:
            tracker.log(step, scalars)

    def truncate_after(self, step: int) -> None:
        """Drop records of steps > `step` (they will be redone after a resume)."""
        if not self.path.exists():
            return
        kept = [r for r in read_jsonl(self.path) if int(r.get("step", 0)) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as handle:
            for record in kept:
                handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())  # the rename must not publish a file whose data is still in flight
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close()


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return value


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (from a kill mid-write) is skipped."""
    records = []
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("skipping a torn line in %s", path)
    return records


#: an evaluation reading's key: the held-out reading, its greedy twin, or a named baseline's
READING_KEY = re.compile(r"^(?:eval|final)/(?:(?P<baseline>[^/]+)/)?(?P<greedy>greedy_)?success_rate$")


def evaluation_readings(
    records: Iterable[dict[str, Any]], *, eval_seeds: int | None = None, samples_per_seed: int = 1
) -> dict[str, list[dict[str, Any]]]:
    """Every evaluation reading in `records`, per series: `eval/success_rate` (the held-out reading),
    `eval/greedy_success_rate`, each baseline `eval/NAME/success_rate` and the final policy's
    `final/success_rate`, as points {step, success_rate, n, low, high}.

    A reading is one success rate on n episodes, so it is a point with its Wilson 95% interval,
    never a line to the next reading (a line between two readings of 20 episodes draws a trend
    the data do not hold). n is the planned episodes (`eval_seeds` x `samples_per_seed`, one per
    seed for a greedy reading) less the reading's infra failures, which are never scored; with
    `eval_seeds` unknown, n and the interval are None."""
    series: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        for key, value in record.items():
            match = READING_KEY.match(key)
            if not match or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            step = record.get("final/selected_step", record["step"]) if key.startswith("final/") else record["step"]
            n = None
            if eval_seeds is not None:
                planned = eval_seeds * (1 if match.group("greedy") else samples_per_seed)
                n = max(0, planned - int(record.get(key.rsplit("/", 1)[0] + "/infra_failures", 0) or 0))
            low, high = wilson_interval(value * n, n) if n else (None, None)
            series.setdefault(key, []).append(
                {"step": step, "success_rate": float(value), "n": n, "low": low, "high": high}
            )
    return series


def plot_learning_curve(
    records: Iterable[dict[str, Any]],
    out_png: str | Path,
    *,
    keys: tuple[str, ...] = ("train/success_rate", "eval/success_rate"),
    title: str = "",
    eval_seeds: int | None = None,
    samples_per_seed: int = 1,
) -> Path | None:
    """PNG of the given keys against step (missing keys are skipped), and beside it a JSON file of
    the evaluation readings it draws (`evaluation_readings`).

    Per-batch series (`train/...`) are lines; evaluation readings, the baselines' included, are
    points with their n and Wilson 95% interval (`eval_seeds` x `samples_per_seed` episodes
    each; see `evaluation_readings`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    readings = evaluation_readings(records, eval_seeds=eval_seeds, samples_per_seed=samples_per_seed)
    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for key in keys:
        if READING_KEY.match(key):
            continue  # drawn below, as readings
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if not points:
            continue
        xs, ys = zip(*points)
        plotted = True
        if len(points) < 30:
            ax.plot(xs, ys, marker="o", label=key)
            continue
        # long noisy series (one batch per step): faint raw values, a rolling mean on top
        window = max(5, len(points) // 20)
        line = ax.plot(xs, ys, alpha=0.25)[0]
        windows = [ys[max(0, i - window + 1) : i + 1] for i in range(len(ys))]
        means = [sum(w) / len(w) for w in windows]
        ax.plot(xs, means, color=line.get_color(), label=f"{key} (mean of {window} steps)")
    markers = iter("osD^v<>phX" * 4)
    for key, points in readings.items():
        if key.startswith("final/"):
            continue  # the picked policy's star, below
        plotted = True
        xs = [p["step"] for p in points]
        ys = [p["success_rate"] for p in points]
        label = key if points[0]["n"] is None else f"{key} (n={points[0]['n']}, 95% Wilson interval)"
        yerr = None
        if all(p["n"] for p in points):
            yerr = [[p["success_rate"] - p["low"] for p in points], [p["high"] - p["success_rate"] for p in points]]
        ax.errorbar(xs, ys, yerr=yerr, fmt=next(markers), linestyle="none", capsize=3, label=label)
    if not plotted:
        plt.close(fig)
        return None
    # eval.select: the picked policy's held-out reading, at the step whose weights it has
    picked = [
        r for r in records if isinstance(r.get("final/success_rate"), (int, float)) and "final/selected_step" in r
    ]
    if picked:
        record = picked[-1]
        ax.scatter(
            [record["final/selected_step"]],
            [record["final/success_rate"]],
            marker="*",
            s=200,
            zorder=3,
            color="black",
            label=f"final policy (picked at step {record['final/selected_step']})",
        )
    ax.set_xlabel("trainer step")
    ax.set_ylabel("value")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    Path(out_png).with_suffix(".json").write_text(json.dumps(readings, indent=1))
    return Path(out_png)
