"""`rollhub bench async-real`: the same training step on REAL environments, four schedules.

Everything is real: the tiny Qwen3 model (random init, `init_tiny`), the in-process
HFEngine, GiGPO with decoupled PPO, `rollhub train`'s own loop (`run_training`), and the
envs: ALFWorld on the real TextWorld engine (`split: train`, the generated games) and SWE
in real Docker containers (`split: train`: real container starts at reset, real tool calls
when the model writes one, real grading in a fresh container at the end:
`grade_on_truncation`). Schedules, run interleaved in one process (env by env, each
repeat cycles through all four):

  lockstep     sync training, every env of a batch steps together (rollout.lockstep)
  env-async    sync training (α = 0), each trajectory on its own coroutine
  async        + async training, α = `alpha`
  async+red    + `redundant_groups` groups and `redundant_trajectories` per group

Reported per env and schedule: wall time per step (mean after `warmup_steps`), time until
`target_groups` groups were trained (from the start of RL), speedups over lockstep, trainer
idle fraction, and what redundancy cancelled. The paper's counterparts are 1.58x (ALFWorld)
and 1.23x (SWE) for env-level asynchrony over lockstep (ROLL Flash, arXiv 2510.11345).
`barrier_bound` (env-async row) is what removing the lockstep barrier on env steps alone
could gain: a lockstep turn waits for the slowest env step of the batch (sum over turns of
the max), independent envs for the slowest trajectory (max over trajectories of the sum);
that difference, taken off the measured lockstep step, bounds the env-step share of the
gain (`lockstep_env_bound`, from the lockstep run's trajectory log). It does not count the
overlap of one trajectory's generation with another's reset or env step, so env-async can
exceed it.

On a shared CPU machine the model is small and generation cheap, so the env is most of a
step: the conditions of the paper's claim, but on 2 contended cores, not GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollhub.bench.report import print_table, save_json
from rollhub.core.config import load_config
from rollhub.envs.alfworld.env import ACTION_FORMATS

logger = logging.getLogger(__name__)

PAPER_ENV_ASYNC = {"alfworld": 1.58, "swe": 1.23}
ENV_IDS = {"alfworld": "rollhub/ALFWorld-v0", "swe": "rollhub/SWE-v0"}


@dataclass
class AsyncRealConfig:
    envs: list[str] = field(default_factory=lambda: ["alfworld", "swe"])
    schedules: list[str] = field(default_factory=lambda: ["lockstep", "env-async", "async", "async+red"])
    groups: int = 2  # B
    group_size: int = 4  # N
    steps: int = 4
    warmup_steps: int = 1
    target_groups: int = 6  # time until this many groups were trained
    repeats: int = 1
    alpha: float = 1.0
    redundant_groups: int = 1
    redundant_trajectories: int = 1
    alfworld_max_steps: int = 10
    # index: the tiny model answers the number of an admissible command (it garbles spelled-out
    # ones), so after its SFT the episodes really move through the game
    alfworld_action_format: str = "index"
    swe_max_steps: int = 4
    swe_containers: int = 8  # rollout.env_concurrency for SWE: containers at once on this host
    max_new_tokens: int = 32
    max_context_tokens: int = 2048
    threads: int = 1
    # SFT warm-start on the env's expert (once per env, shared by every schedule), so the tiny
    # model writes well-formed actions and the envs really step / run tool calls; 0 = none
    sft_episodes: int = 12
    sft_epochs: float = 3.0
    # a model folder every schedule starts from instead of the random tiny model, e.g. the SFT
    # model of a `configs/alfworld_tiny.yaml` run: a policy that already answers in the env's
    # format, so the envs really step (set sft_episodes=0 to use it as it is)
    model: str = ""
    # further `rollhub train` overrides for every run, e.g. the prompt layout that model was
    # trained on: ["agent.history_window=1", "agent.system_prompt=''"]
    run_overrides: list[str] = field(default_factory=list)

    def validate(self) -> None:
        unknown = set(self.envs) - set(ENV_IDS)
        if unknown:
            raise ValueError(f"envs must be among {sorted(ENV_IDS)}, got {sorted(unknown)}")
        bad = set(self.schedules) - {"lockstep", "env-async", "async", "async+red"}
        if bad:
            raise ValueError(f"unknown schedules {sorted(bad)}")
        if self.alfworld_action_format not in ACTION_FORMATS:
            raise ValueError(
                f"alfworld_action_format must be one of {ACTION_FORMATS}, got {self.alfworld_action_format!r}"
            )
        if self.steps <= self.warmup_steps or self.groups < 1 or self.group_size < 1:
            raise ValueError("steps must exceed warmup_steps; groups and group_size >= 1")
        if self.model and not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"model={self.model!r} is not a model folder (no config.json there)")
        bad_overrides = [o for o in self.run_overrides if not isinstance(o, str) or "=" not in o]
        if bad_overrides:
            raise ValueError(f"run_overrides must be KEY=VALUE strings, got {bad_overrides!r}")


QUICK = [
    "envs=[alfworld]",
    "schedules=[lockstep,async+red]",
    "groups=1",
    "group_size=2",
    "steps=2",
    "target_groups=2",
    "alfworld_max_steps=2",
    "max_new_tokens=8",
    "sft_episodes=0",
]


def schedule_overrides(cfg: AsyncRealConfig, schedule: str) -> list[str]:
    if schedule == "lockstep":
        return ["rollout.lockstep=true", "rollout.async_ratio=0"]
    if schedule == "env-async":
        return ["rollout.lockstep=false", "rollout.async_ratio=0"]
    extra = [f"rollout.async_ratio={cfg.alpha}"]
    if schedule == "async+red":
        extra += [
            f"rollout.redundant_groups={cfg.redundant_groups}",
            f"rollout.redundant_trajectories={cfg.redundant_trajectories}",
        ]
    return extra


def env_overrides(cfg: AsyncRealConfig, env: str) -> list[str]:
    if env == "alfworld":
        return [
            "env.id=rollhub/ALFWorld-v0",
            f"env.kwargs={{split: train, max_steps: {cfg.alfworld_max_steps}, "
            f"action_format: {cfg.alfworld_action_format}}}",
            "eval.env.kwargs={split: valid_unseen}",
            "agent.history_window=2",
        ]
    return [
        "env.id=rollhub/SWE-v0",
        f"env.kwargs={{split: train, max_steps: {cfg.swe_max_steps}, grade_on_truncation: true}}",
        "eval.env.kwargs={split: eval}",
        "agent.history_window=1",
        f"rollout.env_concurrency={{rollhub/SWE-v0: {cfg.swe_containers}}}",
    ]


def run_one(
    cfg: AsyncRealConfig, env: str, schedule: str, run_dir: Path, model_dir: Path, *extra: str
) -> dict[str, Any]:
    """One `rollhub train` run (no evaluation episodes); its per-step records."""
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.job import run_training
    from rollhub.trainer.metrics import read_jsonl

    overrides = [
        f"run_dir={run_dir}",
        f"model.path={model_dir}",
        f"model.threads={cfg.threads}",
        f"engine.threads={cfg.threads}",
        f"rollout.groups_per_batch={cfg.groups}",
        f"rollout.group_size={cfg.group_size}",
        f"train.steps={cfg.steps}",
        "train.checkpoint_every=0",
        f"train.log_trajectories={'true' if schedule == 'lockstep' else 'false'}",
        "eval.episodes=0",
        f"sft.enabled={'true' if cfg.sft_episodes else 'false'}",
        f"sft.episodes={max(1, cfg.sft_episodes)}",
        f"sft.epochs={cfg.sft_epochs}",
        "sft.lr=0.001",
        "algorithm.estimator=gigpo",
        f"agent.max_new_tokens={cfg.max_new_tokens}",
        f"agent.max_context_tokens={cfg.max_context_tokens}",
        "agent.min_new_tokens=4",
        "env.max_concurrent=64",
        *env_overrides(cfg, env),
        *schedule_overrides(cfg, schedule),
        *cfg.run_overrides,
        *extra,
    ]
    config = load_config(RunConfig, None, overrides)
    started = time.perf_counter()
    asyncio.run(run_training(config, progress=False, print_fn=logger.info))
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "time/step_s" in r]
    return {"records": records, "wall_s": time.perf_counter() - started}


def summarise(cfg: AsyncRealConfig, records: list[dict[str, Any]]) -> dict[str, Any]:
    measured = records[cfg.warmup_steps :]
    groups = 0
    to_target = float("nan")
    for record in records:
        groups += int(record.get("batch/groups", cfg.groups))
        if groups >= cfg.target_groups:
            to_target = float(record["time/elapsed_s"])
            break
    return {
        "step_s": statistics.fmean(float(r["time/step_s"]) for r in measured) if measured else float("nan"),
        "to_target_s": to_target,
        "idle_frac": statistics.fmean(float(r["trainer/idle_fraction"]) for r in measured) if measured else 0.0,
        "cancelled": int(records[-1].get("rollout/redundant_cancelled", 0)) if records else 0,
        "dropped_stale": int(records[-1].get("buffer/dropped_stale", 0)) if records else 0,
        "turns": statistics.fmean(float(r.get("train/mean_turns", 0.0)) for r in records) if records else 0.0,
    }


def lockstep_env_bound(run_dir: Path, batch_trajectories: int, step_s: float) -> dict[str, float] | None:
    """The most env-level asynchrony can gain over the measured lockstep run.

    A lockstep turn waits for the slowest env of the batch: the batch spends
    sum over turns of (max env step) in envs, where independent envs would need only
    max over trajectories of (sum of its env steps). Removing that barrier time from the
    measured lockstep step (generation and training unchanged) gives the ideal env-async
    step; bound = lockstep step / ideal step. Read from the lockstep run's trajectory log.
    """
    from rollhub.trainer.metrics import read_jsonl

    path = run_dir / "trajectories.jsonl"
    if not path.exists():
        return None
    lines = read_jsonl(path)
    waste = []
    for start in range(0, len(lines) - batch_trajectories + 1, batch_trajectories):
        batch = [
            [t.get("timings_s", {}).get("env_step", 0.0) for t in r["turns"]]
            for r in lines[start : start + batch_trajectories]
        ]
        turns = max((len(t) for t in batch), default=0)
        barrier = sum(max((t[k] for t in batch if k < len(t)), default=0.0) for k in range(turns))
        independent = max((sum(t) for t in batch), default=0.0)
        waste.append(barrier - independent)
    if not waste or step_s <= 0:
        return None
    mean_waste = statistics.fmean(waste)
    return {"barrier_s_per_step": mean_waste, "bound": step_s / max(step_s - mean_waste, 1e-9)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import os

    from rollhub.inference.models import init_tiny_model

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    overrides = [*QUICK, *args.overrides] if args.quick else list(args.overrides)
    cfg = load_config(AsyncRealConfig, None, overrides)
    cfg.validate()
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)  # the trainer refuses to overwrite a run folder
    out.mkdir(parents=True)
    model_dir = Path(cfg.model).resolve() if cfg.model else init_tiny_model(out / "model", "5m", seed=0)
    started = time.perf_counter()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {env: {s: [] for s in cfg.schedules} for env in cfg.envs}
    for env in cfg.envs:
        warm_dir = out / env / "warmstart"
        if cfg.sft_episodes:  # one SFT per env, copied into every run (which then skips it)
            logger.info("async-real: %s SFT warm-start on %d expert episodes", env, cfg.sft_episodes)
            run_one(cfg, env, "env-async", warm_dir, model_dir, "train.steps=0")
        for repeat in range(cfg.repeats):
            for schedule in cfg.schedules:  # interleaved: each repeat runs every schedule once
                run_dir = out / env / f"{schedule}-{repeat}"
                if cfg.sft_episodes:
                    run_dir.mkdir(parents=True)
                    shutil.copytree(warm_dir / "sft_model", run_dir / "sft_model")
                    shutil.copy(warm_dir / "sft_done.json", run_dir / "sft_done.json")
                logger.info("async-real: %s %s (repeat %d)", env, schedule, repeat)
                data = run_one(cfg, env, schedule, run_dir, model_dir)
                summary = summarise(cfg, data["records"])
                if schedule == "lockstep":
                    summary["bound"] = lockstep_env_bound(run_dir, cfg.groups * cfg.group_size, summary["step_s"])
                results[env][schedule].append(summary)
                shutil.rmtree(run_dir / "final_model", ignore_errors=True)
    rows = []
    for env in cfg.envs:
        base = results[env].get("lockstep") or next(iter(results[env].values()))
        base_step = statistics.fmean(r["step_s"] for r in base)
        base_target = statistics.fmean(r["to_target_s"] for r in base)
        bounds = [r["bound"]["bound"] for r in results[env].get("lockstep", []) if r.get("bound")]
        bound = statistics.fmean(bounds) if bounds else None
        for schedule, runs in results[env].items():
            step = statistics.fmean(r["step_s"] for r in runs)
            target = statistics.fmean(r["to_target_s"] for r in runs)
            rows.append(
                {
                    "env": env,
                    "schedule": schedule,
                    "step_s": step,
                    "speedup": base_step / step if step > 0 else float("nan"),
                    f"to_{cfg.target_groups}_groups_s": target,
                    "speedup_to_target": base_target / target if target > 0 else float("nan"),
                    "idle_frac": statistics.fmean(r["idle_frac"] for r in runs),
                    "cancelled": sum(r["cancelled"] for r in runs),
                    "dropped_stale": sum(r["dropped_stale"] for r in runs),
                    "mean_turns": statistics.fmean(r["turns"] for r in runs),
                    "paper_env_async": PAPER_ENV_ASYNC[env] if schedule == "env-async" else "",
                    "barrier_bound": bound if schedule == "env-async" and bound else "",
                }
            )
    print_table(
        f"async-real: {'model ' + cfg.model if cfg.model else 'tiny model'}, real envs, "
        f"batch {cfg.groups}x{cfg.group_size}, {cfg.steps} steps "
        f"({cfg.warmup_steps} warm-up), alpha={cfg.alpha:g}, redundancy +{cfg.redundant_groups} groups "
        f"+{cfg.redundant_trajectories}/group",
        rows,
    )
    report = {
        "benchmark": "async-real",
        "config": asdict(cfg),
        "rows": rows,
        "runs": results,
        "paper_env_async": PAPER_ENV_ASYNC,
        "wall_s": time.perf_counter() - started,
    }
    save_json(out / "result.json", report)
    return report
