"""A finished MathTool training run as one record: what it printed, its summary and its steps.

    python -m experiments.mathtool.record_run RUN_DIR LOG --command "..." --commit SHA --what "..." \
        --out experiments/mathtool/results/NAME.json [--plot]

LOG is the job's output, run under `/usr/bin/time -v` (its wall clock and peak resident set are kept).
The held-out readings come from RUN_DIR/summary.json, the per-step rows from RUN_DIR/metrics.jsonl
(the keys below), `--plot` draws train success and step seconds next to the record.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

SPLIT = (
    "held-out: the 200 problems of MathTool-v0's test split (eval seeds 1,000,000-1,000,199), greedy; "
    "training draws only train-split problems"
)
STEP_KEYS = (
    "step",
    "eval/success_rate",
    "eval/mean_turns",
    "eval/tool_call_rate",
    "eval/valid_call_rate",
    "eval/without_tool/success_rate",
    "train/success_rate",
    "train/format_error_rate",
    "train/tool_call_rate",
    "train/valid_call_rate",
    "batch/sequences",
    "batch/zero_advantage_groups",
    "time/step_s",
    "time/wait_for_batch_s",
    "time/train_s",
    "weights/update_s",
)
PRINTED = ("warm-start success", "WARNING rollhub.trainer.rl_loop: stopping RL", "tool use on", "the same seeds")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("log", type=Path)
    parser.add_argument("--command", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--what", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot", action="store_true")
    args = parser.parse_args(argv)
    log = args.log.read_text(errors="replace").replace("\r", "\n")
    printed = [line.strip() for line in log.splitlines() if line.startswith(PRINTED)]
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", log)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log)
    rows = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if k in STEP_KEYS} for row in rows]
    record = {
        "what": args.what,
        "command": args.command,
        "commit": args.commit,
        "split": SPLIT,
        "printed": printed,
        "job_wall": wall.group(1) if wall else None,
        "largest_process_max_rss_mb": int(rss.group(1)) // 1024 if rss else None,
        "summary": json.loads((args.run_dir / "summary.json").read_text()),
        "steps": steps,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    if args.plot:
        plot(steps, args.out.with_suffix(".png"), next((line for line in printed if "->" in line), args.what))
    print("\n".join(printed))


def plot(steps: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = [s for s in steps if "train/success_rate" in s]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    left.plot([s["step"] for s in trained], [s["train/success_rate"] for s in trained], marker="o", label="train batch")
    left.set_xlabel("RL step")
    left.set_ylabel("success")
    left.legend()
    right.bar(
        [s["step"] for s in trained], [s.get("time/train_s", 0) for s in trained], label="trainer compute", color="C1"
    )
    right.bar(
        [s["step"] for s in trained],
        [s.get("time/wait_for_batch_s", 0) for s in trained],
        bottom=[s.get("time/train_s", 0) for s in trained],
        label="waiting for rollouts",
        color="C7",
    )
    right.set_xlabel("RL step")
    right.set_ylabel("seconds")
    right.legend()
    fig.suptitle(title[:120], fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
