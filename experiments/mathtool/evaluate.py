"""Held-out reading of a model on rollhub/MathTool-v0, with the tool and without it.

    python -m experiments.mathtool.evaluate [--model runs/models/smollm2-135m-instruct] [--episodes 200]
        [--config configs/mathtool_smollm2.yaml] [--out experiments/mathtool/results/baseline.json]
        [--set backend=sandbox] [--no-baseline]

Plays the recipe's evaluation (its agent settings, `eval.env` kwargs, held-out seeds, greedy) with an
in-process HFEngine, once as configured and once with `tools: none` on the same problems, and reports
per setting: success, tool-call rate (episodes with at least one parsed call), valid-call rate
(episodes with a call that ran), tool-output-correct rate (a tool output held the gold answer),
copy rate (success among those), format errors, mean turns, and a few transcripts. With
`--set backend=sandbox` it also reports the sandbox pool's cost (start and exec latency, peak
containers alive) and the containers left after the pool is closed (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rollhub.core.config import load_config
from rollhub.envs.registry import make
from rollhub.inference.engines.hf import HFEngine
from rollhub.rollout.tool_calls import parse_tool_calls
from rollhub.trainer.config import RunConfig
from rollhub.trainer.evaluate import evaluate_policy


def episode_facts(trajectory: Any, gold: str) -> dict[str, Any]:
    calls = valid = 0
    output_has_gold = False
    for turn in trajectory.turns:
        calls += len(parse_tool_calls(turn.response_text).calls)
        for message in turn.observation:
            if message.get("role") == "tool":
                valid += 1
                output_has_gold |= gold in message.get("content", "").replace(",", "")
    return {"calls": calls, "valid": valid, "output_has_gold": output_has_gold}


def summarise(result: Any, golds: list[str]) -> dict[str, Any]:
    scored = [t for t in result.trajectories if t.scored]
    facts = [episode_facts(t, golds[i]) for i, t in enumerate(result.trajectories) if t.scored]
    n = len(scored) or 1
    with_gold = [t for t, f in zip(scored, facts, strict=True) if f["output_has_gold"]]
    return {
        "episodes": len(scored),
        "infra_failures": result.infra_failures,
        "success": result.success_rate,
        "tool_call_rate": sum(f["calls"] > 0 for f in facts) / n,
        "valid_call_rate": sum(f["valid"] > 0 for f in facts) / n,
        "tool_output_correct_rate": len(with_gold) / n,
        "copy_rate": statistics.fmean(t.success for t in with_gold) if with_gold else None,
        "format_error_rate": result.format_error_rate,
        "invalid_action_rate": result.invalid_action_rate,
        "mean_turns": result.mean_turns,
    }


async def sandbox_cost() -> dict[str, Any]:
    """The shared pool's latency and peak, then close it and count what is left (leaks)."""
    from rollhub.envs.mathtool.backends import close_shared_pool, shared_pool
    from rollhub.sandbox.docker_backend import connect
    from rollhub.sandbox.pool import percentile

    pool = shared_pool()
    metrics = pool.metrics.summary()
    for name, values in (("start", pool.metrics.start_latency_s), ("exec", pool.metrics.exec_latency_s)):
        p99 = percentile(values, 0.99)
        metrics[f"{name}_p99_ms"] = None if p99 is None else round(p99 * 1000, 2)
    await close_shared_pool()
    client = connect(api_timeout_s=30)
    left = client.containers.list(all=True, filters={"label": "rollhub.role=mathtool"})
    return {**metrics, "containers_left_after_close": len(left)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = load_config(RunConfig, args.config)
    seeds = list(range(config.eval.seed_offset, config.eval.seed_offset + args.episodes))
    engine = HFEngine(args.model, threads=args.threads, max_batch_size=args.batch)
    report: dict[str, Any] = {"model": args.model, "config": args.config, "episodes": args.episodes, "greedy": True}
    try:
        settings = [("with_tool", {})] + ([] if args.no_baseline else [("without_tool", {"tools": "none"})])
        for label, extra in settings:
            kwargs = {**config.eval_env_kwargs, **args.env_set, **extra}
            probe = make(config.eval_env_id, **kwargs)
            golds = []
            for seed in seeds:
                await probe.reset(seed=seed)
                golds.append(probe.unwrapped.problem.answer)
            started = time.perf_counter()
            result = await evaluate_policy(
                engine,
                engine.tokenizer,
                lambda kwargs=kwargs: make(config.eval_env_id, **kwargs),
                config.agent,
                seeds,
                temperature=0.0,
                max_concurrent=args.batch,
                env_id=config.eval_env_id,
            )
            summary = summarise(result, golds)
            summary["wall_s"] = round(time.perf_counter() - started, 1)
            summary["env_kwargs"] = kwargs
            summary["transcripts"] = [
                {
                    "seed": t.seed,
                    "success": t.success,
                    "replies": [turn.response_text for turn in t.turns],
                    "observations": [turn.observation for turn in t.turns],
                }
                for t in result.trajectories[: args.transcripts]
            ]
            if kwargs.get("backend") == "sandbox" and label == "with_tool":
                summary["sandbox"] = await sandbox_cost()
            report[label] = summary
            print(label, {k: v for k, v in summary.items() if k not in ("transcripts", "env_kwargs")}, flush=True)
    finally:
        await engine.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/models/smollm2-135m-instruct")
    parser.add_argument("--config", default="configs/mathtool_smollm2.yaml")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--transcripts", type=int, default=8)
    parser.add_argument("--out", default="experiments/mathtool/results/baseline.json")
    parser.add_argument("--set", dest="env_set", action="append", default=[], help="env kwarg KEY=VALUE")
    parser.add_argument("--no-baseline", action="store_true", help="skip the tools=none reading")
    args = parser.parse_args()
    args.env_set = dict(item.split("=", 1) for item in args.env_set)
    report = asyncio.run(run(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
