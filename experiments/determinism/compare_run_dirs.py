#!/usr/bin/env python3
"""Compare two run dirs value by value: metrics.jsonl (every logged value but timings) and
trajectories.jsonl (per trajectory: prompt ids, response ids, rewards, behaviour log-probs, plus
seed/env/total reward/success). Also sft_metrics.jsonl (non-timing values) and summary.json's
success rates.

usage: python3 -m experiments.determinism.compare_run_dirs RUN_A RUN_B [--tol 0]
Prints the counts of compared values and every difference (first 40); exit 1 when any differ.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

TIMING_PREFIXES = ("time/",)
TIMING_WORDS = ("wall", "tokens_per_s", "idle_fraction", "_per_s")


def is_timing(key: str) -> bool:
    last = key.rsplit("/", 1)[-1]
    return (
        key.startswith(TIMING_PREFIXES)
        or any(w in key for w in TIMING_WORDS)
        or last.endswith("_s")
        or key.endswith("_s")
        or "timings" in key
    )


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Diff:
    def __init__(self, tol: float):
        self.tol = tol
        self.compared = 0
        self.diffs: list[str] = []

    def value(self, where: str, a, b) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if is_timing(key):
                    continue
                if key not in a or key not in b:
                    self.diffs.append(f"{where}/{key}: only in {'A' if key in a else 'B'}")
                    continue
                self.value(f"{where}/{key}", a[key], b[key])
            return
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                self.diffs.append(f"{where}: length {len(a)} != {len(b)}")
                return
            for i, (x, y) in enumerate(zip(a, b)):
                self.value(f"{where}[{i}]", x, y)
            return
        self.compared += 1
        if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
            if math.isnan(a) and math.isnan(b):
                return
            if abs(a - b) > self.tol:
                self.diffs.append(f"{where}: {a!r} != {b!r}")
            return
        if a != b:
            self.diffs.append(f"{where}: {a!r} != {b!r}")


def compare_metrics(d: Diff, a: Path, b: Path, name: str) -> int:
    ra, rb = read_jsonl(a / name), read_jsonl(b / name)
    if len(ra) != len(rb):
        d.diffs.append(f"{name}: {len(ra)} records != {len(rb)}")
    for i, (x, y) in enumerate(zip(ra, rb)):
        d.value(f"{name}[{i}] step {x.get('step')}", x, y)
    return len(ra)


def trajectory_view(t: dict) -> dict:
    return {
        "env_id": t.get("env_id"),
        "seed": t.get("seed"),
        "total_reward": t.get("total_reward"),
        "success": t.get("success"),
        "status": t.get("status"),
        "group_index": str(t.get("group_id", "")).split("-")[0],  # the rest of the id is random
        "num_response_tokens": t.get("num_response_tokens"),
        "turns": [
            {
                "prompt_ids": turn.get("prompt_ids"),
                "response_ids": turn.get("response_ids"),
                "reward": turn.get("reward"),
                "behaviour_logprobs": turn.get("behaviour_logprobs"),
            }
            for turn in t.get("turns", [])
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--tol", type=float, default=0.0, help="absolute tolerance for floats (default exact)")
    args = parser.parse_args()
    a, b = args.run_a, args.run_b

    metrics = Diff(args.tol)
    n_metrics = compare_metrics(metrics, a, b, "metrics.jsonl")
    n_sft = compare_metrics(metrics, a, b, "sft_metrics.jsonl")
    for name in ("summary.json",):
        if (a / name).exists() and (b / name).exists():
            sa, sb = json.loads((a / name).read_text()), json.loads((b / name).read_text())
            keep = lambda s: {k: v for k, v in s.items() if "success" in k or k in ("steps", "selected_step")}  # noqa: E731
            metrics.value(name, keep(sa), keep(sb))

    traj = Diff(args.tol)
    ta, tb = read_jsonl(a / "trajectories.jsonl"), read_jsonl(b / "trajectories.jsonl")
    if len(ta) != len(tb):
        traj.diffs.append(f"trajectories.jsonl: {len(ta)} != {len(tb)} trajectories")
    for i, (x, y) in enumerate(zip(ta, tb)):
        traj.value(f"trajectory[{i}]", trajectory_view(x), trajectory_view(y))

    print(
        f"metrics: {n_metrics} records + {n_sft} SFT records, {metrics.compared} values compared, "
        f"{len(metrics.diffs)} differ"
    )
    print(f"trajectories: {len(ta)} vs {len(tb)}, {traj.compared} values compared, {len(traj.diffs)} differ")
    for line in (metrics.diffs + traj.diffs)[:40]:
        print("  DIFF", line)
    return 1 if metrics.diffs or traj.diffs else 0


if __name__ == "__main__":
    sys.exit(main())
