"""`rollhub rollout`: collect groups from an env with an engine, write JSONL, print a summary.

The composition is spelled out here (model -> engine -> manager -> batch) so it doubles as
the smallest example of wiring the rollout stack by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollhub.core.errors import UserError
from rollhub.rollout.agent import AgentConfig
from rollhub.rollout.config import EnvConfig, RolloutConfig

logger = logging.getLogger(__name__)


@dataclass
class RolloutCommandConfig:
    """What `--set` sets: the run's own `env`, `rollout` and `agent` sections, under the names a
    train config gives them (`--set rollout.redundant_trajectories=1`, `--set agent.history_window=2`)."""

    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)


def build_command_config(args: argparse.Namespace) -> RolloutCommandConfig:
    from rollhub.core.config import load_config

    overrides = [
        f"env.id={args.env}",
        f"env.train_seed_offset={args.seed}",
        f"env.max_concurrent={args.concurrency}",
        f"rollout.group_size={args.group_size}",
        f"rollout.lockstep={str(bool(args.lockstep)).lower()}",
        "rollout.async_ratio=0",  # batches are collected now (collect_batch): nothing runs ahead
        f"agent.max_new_tokens={args.max_new_tokens}",
        f"agent.temperature={args.temperature}",
        *args.overrides,
    ]
    return load_config(RolloutCommandConfig, None, overrides)


def engine_config(args: argparse.Namespace) -> Any:
    """This command's `engine:` section: in-process, or servers launched (--launch, --replicas) or attached (--url)."""
    from rollhub.core.config import load_config
    from rollhub.inference.engines.build import EngineConfig

    backend = "server" if args.engine in ("server", "sglang") or args.urls else "inprocess"
    if args.engine == "sglang" and not args.urls:
        raise UserError("--engine sglang attaches to a running server: give its --url (or use --engine server)")
    values = [
        f"backend={backend}",
        f"threads={args.threads}",
        f"max_batch_size={max(8, min(64, args.concurrency))}",
        f"replicas={args.replicas}",
        f"urls={json.dumps(list(args.urls))}",
    ]
    if args.launch:
        values.append(f"launch={json.dumps(args.launch)}")
    return load_config(EngineConfig, None, values)


async def _collect(args: argparse.Namespace, model_dir: Path, jsonl_path: Path) -> dict[str, Any]:
    from rollhub.envs.registry import spec as env_spec
    from rollhub.rollout.manager import EnvManager

    env_spec(args.env)  # unknown id -> UserError with suggestions, before loading a model
    config = build_command_config(args)
    from rollhub.inference.engines.build import build_engine
    from rollhub.inference.engines.launcher import start_engine

    engine: Any = build_engine(engine_config(args), model_dir, device=args.device, run_dir=jsonl_path.parent)
    try:
        await start_engine(engine)
        tokenizer = engine.tokenizer
    except BaseException:
        await engine.close()
        raise
    manager = EnvManager(
        engine, tokenizer, env=config.env, rollout=config.rollout, agent=config.agent, jsonl_path=str(jsonl_path)
    )
    try:
        groups = await manager.collect_batch(args.groups)
    finally:
        await manager.close()
        await engine.close()
    summary = manager.summary()
    trajectories = [t for g in groups for t in g.trajectories]
    summary.update(
        env_id=args.env,
        engine=args.engine,
        groups=len(groups),
        trajectories=len(trajectories),
        success_rate=sum(t.success for t in trajectories) / max(1, len(trajectories)),
        mean_reward=sum(t.total_reward for t in trajectories) / max(1, len(trajectories)),
        mean_turns=sum(len(t.turns) for t in trajectories) / max(1, len(trajectories)),
        format_errors=sum(t.info.get("format_errors", 0) for t in trajectories),
        trajectories_jsonl=str(jsonl_path),
    )
    return summary


def run_rollout_command(args: argparse.Namespace) -> int:
    import torch

    from rollhub.inference.models import init_tiny_model

    if args.groups < 1 or args.group_size < 1:
        raise UserError("--groups and --group-size must be >= 1")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.model:
        model_dir = Path(args.model)
        if not (model_dir / "config.json").exists():
            raise UserError(
                f"{model_dir} is not a model directory; create one with 'rollhub model init-tiny --out {model_dir}'"
            )
    else:
        model_dir = out / "model"
        if not (model_dir / "config.json").exists():
            init_tiny_model(model_dir, size="5m")
    jsonl_path = out / "trajectories.jsonl"
    jsonl_path.unlink(missing_ok=True)
    summary = asyncio.run(_collect(args, model_dir, jsonl_path))
    if not args.json:
        print(f"{summary['trajectories']} trajectories in {summary['groups']} groups -> {jsonl_path}")
        print(
            f"generation {summary['generation_tokens_per_s']:.0f} tok/s, success {summary['success_rate']:.2f}, "
            f"mean reward {summary['mean_reward']:.3f}"
        )
    print(json.dumps(summary, default=str))
    return 0
