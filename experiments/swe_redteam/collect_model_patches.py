"""Real model patches for the agreement check: SmolLM2 plays SWE episodes, each episode's final diff is kept.

The episodes run through the trainer's own evaluation loop (`evaluate_policy`, what `rollhub eval`
runs) with the recipe's engine and agent settings, on tasks drawn round-robin over every shipped
package (both splits: this measures the grader, not the policy). The env grades on truncation
too, so an episode that runs out of steps still hands its diff to the grader; an episode the
agent loop ends itself (context full, a model failure) was never graded, and its diff is taken
from the live container at close. Output: one row {instance_id, patch, source, ...} per episode
(the input of `rollhub swe agree --patches`; every episode is appended to `*.episodes.jsonl` as it
ends, so a stopped run keeps what it played) and the trajectories (`rollhub view`).

    python experiments/swe_redteam/collect_model_patches.py --tasks 16 --episodes 3 --max-steps 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from rollhub.envs.swe.env import SWEEnv
from rollhub.envs.swe.grading.evaluate import ModelFault, extract_diff
from rollhub.sandbox.base import SandboxError

HERE = Path(__file__).resolve().parent


class RecordingSWEEnv(SWEEnv):
    """SWEEnv that remembers its seed and the diff its episode ended with, graded or not."""

    def __init__(self, *args: Any, sink: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sink = sink  # each episode's row is appended at close: a stopped run keeps what it played
        self.seed: int | None = None
        self.ungraded_patch: str | None = None
        self.diff_error = ""

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.seed = seed
        return await super().reset(seed=seed, options=options)

    async def close(self) -> None:
        if self.task is not None and self.last_eval is None and not self._done and self._box is not None:
            try:
                self.ungraded_patch = await extract_diff(self._box, self.task)
            except (ModelFault, SandboxError) as exc:
                self.diff_error = str(exc)
        await super().close()
        if self.task is not None:
            with self.sink.open("a") as f:
                f.write(json.dumps(self.record()) + "\n")

    def record(self) -> dict[str, Any]:
        assert self.task is not None
        row: dict[str, Any] = {"instance_id": self.task.instance_id, "source": "smollm2", "seed": self.seed}
        if self.last_eval is not None:
            row.update(
                patch=self.last_eval.model_patch,
                ended="graded by the env",
                env_reward=self.last_eval.reward,
                env_resolution=self.last_eval.grade.status,
            )
        elif self.ungraded_patch is not None:
            row.update(patch=self.ungraded_patch, ended="ended by the agent loop; diff taken at close")
        else:
            row.update(patch=None, ended=f"no diff: {self.diff_error or 'the episode ended before any'}")
        return row


async def collect(args: argparse.Namespace) -> None:
    from rollhub.envs.swe.redteam import stratified
    from rollhub.envs.swe.tasks import SHIPPED_TASKS, load_tasks
    from rollhub.inference.engines.launcher import start_engine
    from rollhub.rollout.trajectory_log import TrajectoryWriter
    from rollhub.trainer.build import build_engine, ensure_model
    from rollhub.trainer.cli import load_run_config
    from rollhub.trainer.evaluate import evaluate_policy

    config = load_run_config(args.config, args.overrides, None)
    tasks = stratified(load_tasks(SHIPPED_TASKS, split="all"), args.tasks, args.seed)
    kwargs = {k: v for k, v in config.env.kwargs.items() if k not in ("split", "instance_ids", "packages")}
    kwargs.update(max_steps=args.max_steps, grade_on_truncation=True)
    envs: list[RecordingSWEEnv] = []
    episodes = Path(args.out).with_suffix(".episodes.jsonl")  # every episode, also those without a diff
    episodes.parent.mkdir(parents=True, exist_ok=True)
    episodes.write_text("")

    def make_env() -> RecordingSWEEnv:
        env = RecordingSWEEnv(tasks, sink=episodes, **kwargs)
        envs.append(env)
        return env

    engine = build_engine(config, ensure_model(config))
    started = time.monotonic()
    try:
        await start_engine(engine)
        result = await evaluate_policy(
            engine,
            engine.tokenizer,
            make_env,
            config.agent,
            range(len(tasks) * args.episodes),  # seed s plays task s % len(tasks)
            temperature=args.temperature,
            max_concurrent=args.concurrency,
            env_id=config.env.id,
        )
    finally:
        await engine.close()
    wall_s = time.monotonic() - started

    rows = sorted((env.record() for env in envs if env.task is not None), key=lambda r: r["seed"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for row in rows:
            if row["patch"] is not None:
                f.write(json.dumps(row) + "\n")
    by_seed = {r["seed"]: r for r in rows}
    with TrajectoryWriter(args.trajectories) as writer:
        for t in result.trajectories:
            row = by_seed.get(t.seed, {})
            writer.write(
                t, {"instance_id": row.get("instance_id"), "patch": row.get("patch"), "ended": row.get("ended")}
            )
    patches = [r["patch"] for r in rows if r["patch"] is not None]
    summary = {
        "command": args.command_line,
        "tasks": [t.instance_id for t in tasks],
        "episodes": len(result.trajectories),
        "infra_failures": result.infra_failures,
        "with_diff": len(patches),
        "non_empty": sum(bool(p.strip()) for p in patches),
        "distinct_non_empty": len({(r["instance_id"], r["patch"]) for r in rows if r["patch"]}),
        "env_resolved": sum(r.get("env_reward") == 1.0 for r in rows),
        "ended": {e: sum(r["ended"] == e for r in rows) for e in sorted({r["ended"] for r in rows})},
        "mean_turns": result.mean_turns,
        "format_error_rate": result.format_error_rate,
        "wall_s": round(wall_s, 1),
    }
    Path(args.summary).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def main() -> None:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/swe_smollm2.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tasks", type=int, default=16, help="tasks drawn round-robin over packages")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per task")
    parser.add_argument("--max-steps", type=int, default=8, help="tool calls per episode")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=8, help="episodes at once")
    parser.add_argument("--seed", type=int, default=0, help="draws the tasks")
    parser.add_argument("--out", default=str(HERE / "results" / "model_patches.jsonl"))
    parser.add_argument("--summary", default=str(HERE / "results" / "model_patches_summary.json"))
    parser.add_argument("--trajectories", default="runs/swe_model_patches/trajectories.jsonl")
    args = parser.parse_args()
    args.command_line = "python " + " ".join(sys.argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(collect(args))


if __name__ == "__main__":
    main()
