"""The end of a job: summary.json, the learning curve and the before/after lines."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollhub.trainer.evaluate import EvalResult
from rollhub.trainer.exploit_trend import rising_exploit_warnings
from rollhub.trainer.metrics import plot_learning_curve, read_jsonl
from rollhub.trainer.run import Run
from rollhub.trainer.run_dir import warmstart_greedy, warmstart_record

logger = logging.getLogger(__name__)


@dataclass
class TrainingSummary:
    run_dir: Path
    warmstart: EvalResult | None
    final: EvalResult | None
    steps: int
    wall_s: float
    phases_s: dict[str, float] = field(default_factory=dict)
    last: EvalResult | None = None  # the last step's policy, when eval.select picked another one
    selected_step: int | None = None  # the RL step whose weights are `final` (eval.select)


def greedy_metrics(greedy: EvalResult | None, prefix: str = "eval/") -> dict[str, float]:
    return {} if greedy is None else {f"{prefix}greedy_success_rate": greedy.success_rate}


def report(
    run: Run,
    warmstart: EvalResult | None,
    final: EvalResult,
    *,
    print_fn: Callable[[str], None],
    last: EvalResult | None = None,
    selected_step: int | None = None,
    final_greedy: EvalResult | None = None,
    final_baselines: dict[str, EvalResult] | None = None,
) -> TrainingSummary:
    """summary.json, the learning curve and the before/after lines."""
    config, state = run.config, run.state
    warm = warmstart_record(run.run_dir)
    wall = run.wall_s()  # a resumed run counts its earlier processes too
    before = state.warmstart_success if warmstart is None else warmstart.success_rate
    records = read_jsonl(run.run_dir / "metrics.jsonl")
    exploit_warnings = rising_exploit_warnings(records)  # a train/exploit/* rate that rose over the run
    title = f"{config.env.id}: {config.algorithm.estimator}, alpha={config.rollout.async_ratio}"
    try:
        plot_learning_curve(
            records,
            run.run_dir / "learning_curve.png",
            title=title,
            eval_seeds=config.eval.episodes,
            samples_per_seed=config.eval.samples_per_seed,
        )
    except ImportError as exc:  # matplotlib is optional on a bare machine (the device check carries no plots)
        logger.warning("learning curve not drawn: %s", exc)
    summary = {
        "warmstart_success_rate": before,
        "final_success_rate": final.success_rate,
        "eval_seeds": config.eval.episodes,
        "eval_samples_per_seed": config.eval.samples_per_seed,
        "steps": state.version,
        "selected_step": selected_step,  # eval.select: the step whose weights are final_model
        "last_step_success_rate": (last or final).success_rate,
        "warmstart_greedy_success_rate": warmstart_greedy(run.run_dir) if final_greedy is not None else None,
        "final_greedy_success_rate": None if final_greedy is None else final_greedy.success_rate,
        "warmstart_eval": {k: v for k, v in warm.items() if k != "baselines"},
        "final_eval": final.metrics(prefix=""),
        "baselines": {
            name: {"warmstart": warm.get("baselines", {}).get(name), "final": reading.metrics(prefix="")}
            for name, reading in (final_baselines or {}).items()
        },
        "wall_s": wall,
        "phases_s": run.phases,
        "exploit_warnings": exploit_warnings,
    }
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    readings = (("warm-start", warmstart), ("final", final))
    failed = [(when, reading) for when, reading in readings if reading is not None and reading.all_infra_failed]
    for when, reading in failed:  # its 0% would blame the policy for what the machinery did
        print_fn(f"{when} reading on {config.eval.label}: {reading.describe()}")
    if failed:
        print_fn(f"no success rate to compare ({state.version} RL steps, {wall / 60:.1f} min)")
    elif before is not None:
        print_fn(
            f"warm-start success: {100 * before:.1f}%  ->  final success: {100 * final.success_rate:.1f}%  "
            f"({final.success_rate - before:+.1%} on {config.eval.label}, "
            f"{state.version} RL steps, {wall / 60:.1f} min)"
        )
    else:
        print_fn(f"final success: {100 * final.success_rate:.1f}% ({state.version} RL steps, {wall / 60:.1f} min)")
    if final.tool_call_rate is not None:
        before_text = "" if warmstart is None else f"warm-start {warmstart.describe()}  ->  "
        print_fn(f"tool use on {config.eval.label}: {before_text}final {final.describe()}")
    for name, reading in (final_baselines or {}).items():
        earlier = warm.get("baselines", {}).get(name)
        start = "" if earlier is None else f"warm-start {100 * earlier['success_rate']:.1f}%  ->  "
        print_fn(f"the same seeds, {name}: {start}final {100 * reading.success_rate:.1f}%")
    if final_greedy is not None:
        greedy_before = summary["warmstart_greedy_success_rate"]
        start = "" if greedy_before is None else f"warm-start {100 * greedy_before:.1f}%  ->  "
        print_fn(f"greedy success ({config.eval.greedy_label}): {start}final {100 * final_greedy.success_rate:.1f}%")
    if selected_step is not None:
        select = config.eval.select
        print_fn(
            f"final policy: step {selected_step}, the best on {select.label} (eval.select); "
            + (
                f"the last step's ({state.version}) held-out success: {100 * last.success_rate:.1f}%"
                if last is not None
                else "it is the last step's"
            )
        )
    for line in exploit_warnings:
        print_fn(line)
    return TrainingSummary(run.run_dir, warmstart, final, state.version, wall, run.phases, last, selected_step)
