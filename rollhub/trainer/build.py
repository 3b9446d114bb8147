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

import difflib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from rollhub.core.errors import UserError
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.engines.base import InferenceEngine
from rollhub.rollout.source import RolloutSource
from rollhub.rollout.trajectory_log import RUN_TRAJECTORY_LOG
from rollhub.trainer.config import RunConfig
from rollhub.trainer.policy import Policy

logger = logging.getLogger(__name__)


def check_env_registered(env_id: str) -> None:
    """Fail before any model loads when the env id is unknown."""
    from rollhub.envs.registry import all_specs

    ids = [spec.id for spec in all_specs()]
    if env_id not in ids:
        close = difflib.get_close_matches(env_id, ids, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(f"env id '{env_id}' is not registered{hint}; see 'rollhub envs list'")


def check_env_kwargs(env_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`env.kwargs` checked against the env constructor (names and types), before any model loads.

    Returns them typed (an int given for a float argument widened, `1e-3` read as a number),
    so the run builds its envs from exactly what was checked. A wrong key or type raises
    UserError naming `env.kwargs.KEY`; an env whose extra is not installed raises the
    MissingExtraError that building it would.
    """
    from rollhub.envs.arguments import typed_env_kwargs
    from rollhub.envs.registry import spec

    check_env_registered(env_id)
    return typed_env_kwargs(spec(env_id), kwargs, key_prefix="env.kwargs.")


def ensure_model(config: RunConfig) -> Path:
    """The model dir, built with `init_tiny_model` when missing and allowed."""
    path = Path(config.model.path)
    if (path / "config.json").exists():
        return path
    if config.model.init_tiny is None:
        raise UserError(
            f"model path {path} has no config.json; set model.init_tiny: 5m to build a tiny model there, "
            "or point model.path at an HF checkpoint dir"
        )
    from rollhub.rollout.models import init_tiny_model

    logger.info("building tiny model %s at %s", config.model.init_tiny, path)
    return init_tiny_model(path, config.model.init_tiny, seed=config.seed)


def build_policy(config: RunConfig, model_dir: Path) -> Policy:
    """The trained policy; it scores tokens at the sampling temperature (1 when greedy)."""
    temperature = config.agent.temperature if config.agent.temperature > 0 else 1.0
    return Policy(
        model_dir,
        device=config.model.device,
        temperature=temperature,
        micro_batch_size=config.optim.micro_batch_size,
        gradient_checkpointing=config.model.gradient_checkpointing,
        fsdp=config.model.fsdp,
    )


def build_reference(config: RunConfig, model_dir: Path, policy: Policy) -> Policy | None:
    """The frozen KL anchor (the warm-start), only when the loss has a KL term."""
    if config.loss.kl_coef <= 0:
        return None
    return Policy(
        model_dir,
        device=config.model.device,
        micro_batch_size=config.optim.micro_batch_size,
        temperature=policy.temperature,
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
    """The generation engine of a run (training rollouts and evaluation alike)."""
    from rollhub.rollout.engines.build import build_engine as build_from_section

    return build_from_section(config.engine, model_dir)


def make_env_factory(config: RunConfig) -> Callable[[], Any]:
    from rollhub.envs.registry import make

    return lambda: make(config.env.id, **config.env.kwargs)


def build_buffer(config: RunConfig) -> GroupBuffer | None:
    """The bounded-staleness hand-off of async mode; lockstep mode has none."""
    if config.rollout.lockstep:
        return None
    return GroupBuffer(config.rollout.groups_per_batch, config.rollout.async_ratio)


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

    manager_config = EnvManagerConfig(
        env_id=config.env.id,
        env_kwargs=dict(config.env.kwargs),
        group_size=config.rollout.group_size,
        max_concurrent_trajectories=config.env.max_concurrent,
        lockstep=config.rollout.lockstep,
        jsonl_path=str(run_dir / RUN_TRAJECTORY_LOG) if config.train.log_trajectories else None,
        agent=config.agent,
        max_infra_failure_rate=config.rollout.max_infra_failure_rate,
        infra_failure_window=config.rollout.infra_failure_window,
    )
    if config.cluster.backend == "ray":  # env shards and engine servers as Ray actors (docs/ray.md)
        from rollhub.rollout.cluster.backend import RayRollout

        return RayRollout(
            model_dir, manager_config, config.cluster, engine=config.engine, buffer=buffer, seeds=seeds, run_dir=run_dir
        )
    return EnvManager(engine, tokenizer, manager_config, buffer=buffer, seeds=seeds)
