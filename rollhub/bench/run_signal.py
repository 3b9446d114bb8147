"""`rollhub bench run-signal`: where a training run's learning signal went, window by window.

Reads a finished (or running) run folder: its `trajectories.jsonl` (every trained group) and
`metrics.jsonl` (every step), splits the run into equal windows of groups and of steps, and
reports per window what a group-relative estimator could learn from:

  all succeed / mixed / all fail   share of groups by outcome; only mixed groups carry an
                                   episode-level signal (GRPO's advantage is 0 in the others);
  shortfall turns                  turns whose own env reward is below `bar` (with a shaped
                                   reward: a step that made things worse) and not the
                                   solving step;
  ... where the group agreed       of those, the share made at an anchor state where every turn
                                   of the group took the same answer. GiGPO's step advantages
                                   are centred per anchor, so identical answers' advantages sum
                                   to 0 and that answer's net gradient there is exactly 0:
                                   the estimator cannot see these mistakes at all;

and, from the step metrics of the same window: zero-advantage group share, PPO ratio clip
fraction, capped importance-weight fraction, and the KL to the warm-start: the numbers to read
when RL stalls, in one command for any run instead of a throw-away script.

  rollhub bench run-signal --set run=runs/sokoban_tiny [--set windows=3] [--set bar=0.3]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollhub.bench.report import bench_setup, print_table, save_result
from rollhub.core.errors import UserError

OUTCOME_KINDS = ("all_succeed", "mixed", "all_fail")
#: metrics.jsonl keys averaged per window of steps (absent keys are skipped)
STEP_METRICS = {
    "train/success_rate": "train success",
    "batch/zero_advantage_groups": "zero-adv groups",
    "train/offpolicy/ratio_clip_fraction": "clip fraction",
    "train/offpolicy/w_capped_fraction": "capped IS weights",
    "train/kl_reference_full": "KL to warm-start",
    "train/kl_reference": "KL to warm-start (k3)",
    "train/invalid_action_rate": "invalid actions",
}


@dataclass
class RunSignalConfig:
    run: str = ""  # a run folder with trajectories.jsonl (and metrics.jsonl)
    windows: int = 3  # equal slices of the run, in the order groups were trained
    bar: float | None = (
        None  # shortfall threshold on a turn's own reward; null = the run's algorithm.turn_bar, else 0.3
    )

    def validate(self) -> None:
        if self.windows < 1:
            raise ValueError(f"windows must be >= 1, got {self.windows}")
        if self.bar is not None and not math.isfinite(self.bar):
            raise ValueError(f"bar must be a finite number, got {self.bar}")


QUICK: list[str] = []


@dataclass
class RunRecord:
    """What a run folder says about its signal: groups in training order, step rows, the bar."""

    run_dir: Path
    groups: list[list[dict[str, Any]]]
    steps: list[dict[str, Any]]
    bar: float


def read_groups(path: Path) -> list[list[dict[str, Any]]]:
    """The run's groups in the order their first trajectory was logged (training order)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                trajectory = json.loads(line)
            except json.JSONDecodeError as error:  # a run killed mid-write leaves a torn last line
                raise UserError(f"{path}:{number} is not JSON ({error}); truncate the torn line") from None
            groups.setdefault(str(trajectory.get("group_id")), []).append(trajectory)
    return list(groups.values())


def group_outcome(group: list[dict[str, Any]]) -> str:
    """all_succeed / mixed / all_fail by the trajectories' success flags."""
    wins = sum(bool(t.get("success")) for t in group)
    return "all_succeed" if wins == len(group) else "all_fail" if wins == 0 else "mixed"


def _anchor_key(turn: dict[str, Any]) -> str | None:
    anchor = turn.get("anchor")
    if anchor is None:
        return None
    return json.dumps(anchor, sort_keys=True)


def shortfall_turns(group: list[dict[str, Any]], bar: float) -> tuple[int, int]:
    """(shortfall turns, those at an anchor where every turn of the group gave the same answer).

    A turn without an anchor is its own state (GiGPO gives it no step group either), so it
    counts as agreed. The solving move is never a shortfall whatever its reward."""
    by_anchor: dict[str | None, list[dict[str, Any]]] = collections.defaultdict(list)
    solving: set[int] = set()
    for trajectory in group:
        turns = trajectory.get("turns", [])
        if turns and trajectory.get("success"):
            solving.add(id(turns[-1]))
        for turn in turns:
            by_anchor[_anchor_key(turn)].append(turn)
    total = agreed = 0
    for key, turns in by_anchor.items():
        same_answer = len({t.get("response_text") for t in turns}) == 1
        for turn in turns:
            if float(turn.get("reward", 0.0)) >= bar or id(turn) in solving:
                continue
            total += 1
            agreed += key is None or same_answer
    return total, agreed


def window_rows(
    groups: list[list[dict[str, Any]]], steps: list[dict[str, Any]], windows: int, bar: float
) -> list[dict[str, Any]]:
    rows = []
    n_groups, n_steps = len(groups), len(steps)
    for w in range(windows):
        lo, hi = n_groups * w // windows, n_groups * (w + 1) // windows
        part = groups[lo:hi]
        kinds = collections.Counter(group_outcome(g) for g in part)
        short = agreed = 0
        for group in part:
            s, a = shortfall_turns(group, bar)
            short += s
            agreed += a
        step_part = steps[n_steps * w // windows : n_steps * (w + 1) // windows]
        row: dict[str, Any] = {
            "window": f"{w + 1}/{windows}",
            "steps": f"{step_part[0]['step']}-{step_part[-1]['step']}" if step_part else "-",
            "groups": len(part),
        }
        for kind in OUTCOME_KINDS:
            row[kind] = kinds[kind] / len(part) if part else float("nan")
        row["shortfall turns"] = short
        row["shortfall where the group agreed"] = agreed / short if short else float("nan")
        for key, name in STEP_METRICS.items():
            values = [float(s[key]) for s in step_part if key in s and s[key] is not None]
            if key == "batch/zero_advantage_groups":
                values = [v / float(s["batch/groups"]) for v, s in zip(values, step_part) if s.get("batch/groups")]
            if values:
                row[name] = sum(values) / len(values)
        rows.append(row)
    return rows


def read_run(run: str, windows: int, bar: float | None) -> RunRecord:
    """A run folder's groups and step rows, and the shortfall bar (`bar`, else the run's own per-turn
    bar when it trained with one, else 0.3); a one-line error for a folder that cannot be read."""
    run_dir = Path(run)
    trajectories = run_dir / "trajectories.jsonl"
    if not run or not trajectories.exists():
        raise UserError(
            "--set run=RUN must name a training run folder with trajectories.jsonl (train.log_trajectories)"
        )
    if bar is None:
        bar = 0.3
        config_file = run_dir / "config.json"
        if config_file.exists():
            algorithm = json.loads(config_file.read_text()).get("algorithm", {})
            if algorithm.get("turn_bar_weight", 0) > 0:
                bar = float(algorithm.get("turn_bar", bar))
    groups = read_groups(trajectories)
    if len(groups) < windows:
        raise UserError(f"{trajectories} holds {len(groups)} groups, fewer than windows={windows}")
    steps = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "train/loss" in row or "batch/groups" in row:
                steps.append(row)
    return RunRecord(run_dir, groups, steps, bar)


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg, out = bench_setup(RunSignalConfig, args, QUICK)
    record = read_run(cfg.run, cfg.windows, cfg.bar)
    rows = window_rows(record.groups, record.steps, cfg.windows, record.bar)
    print_table(f"training signal of {record.run_dir} by window (shortfall: a turn's reward < {record.bar:g})", rows)
    result = {"benchmark": "run-signal", "config": vars(cfg), "bar": record.bar, "rows": rows}
    save_result(out, result, "run_signal.png", draw, rows)
    return result


def draw(ax: Any, rows: list[dict[str, Any]]) -> None:
    labels = [row["window"] for row in rows]
    bottom = [0.0] * len(rows)
    colours = {"all_succeed": "tab:green", "mixed": "tab:blue", "all_fail": "tab:red"}
    for kind in OUTCOME_KINDS:
        values = [row[kind] for row in rows]
        ax.bar(labels, values, bottom=bottom, color=colours[kind], label=kind.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values)]
    agreed = [row["shortfall where the group agreed"] for row in rows]
    ax.plot(labels, agreed, color="black", marker="o", label="shortfall where the group agreed")
    ax.set_ylim(0, 1)
    ax.set_xlabel("window of the run (training order)")
    ax.set_ylabel("share")
    ax.legend(loc="lower left", fontsize=8)
