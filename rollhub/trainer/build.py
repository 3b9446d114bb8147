"""The composition root: every command builds its parts here from one `RunConfig`.

`rollhub train`, `eval` and `sft` (and `rollhub bench` runs that train) get their model
dir, policy, optimizer, engine, env factory, buffer and rollout source from these
functions, and nothing else reads a `RunConfig` to construct them. A training job builds its
parts once, after the warm-start (`build_run`); only the rollout source waits for RL (`build_rollout`).
The rule for configs, stated once: below this module a class or function takes plain arguments, or the one
section that configures it whole (`AgentConfig` -> the agent, `LossConfig` -> the loss,
`AlgorithmConfig` -> advantages, `EngineConfig` -> the engine); never a `RunConfig`, never
a few fields picked out of a section.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollhub.core.errors import UserError
from rollhub.inference.engines.base import InferenceEngine
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.seed_sources import SeedCursor, SeedSource
from rollhub.rollout.source import RolloutSource
from rollhub.rollout.trajectory_log import RUN_TRAJECTORY_LOG
from rollhub.trainer.config import RunConfig
from rollhub.trainer.lora import AdapterlessReference
from rollhub.trainer.metrics import MetricsLog
from rollhub.trainer.policy import Policy
from rollhub.trainer.progress import NO_PROGRESS, JobProgress
from rollhub.trainer.ranks.group import RankGroup
from rollhub.trainer.run import Run

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_run(
    config: RunConfig,
    model_dir: Path,
    *,
    policy: Policy | None = None,
    ranks: RankGroup | None = None,
    started: float | None = None,
) -> Run:
    """Everything a training job trains with, from the warm-start in `model_dir` (the SFT model, or
    the base model): policy, optimizer, engine, KL reference, buffer, seeds and metrics log.

    `policy`: the one SFT just trained in this process, trained on as it is (SFT leaves it without
    gradients, as a policy loaded from `model_dir` is). With `ranks` the policy is this
    rank's shard, loaded from `model_dir`, and the other ranks build theirs now."""
    if policy is None:
        policy = build_policy(config if ranks is None else sharded_config(config), model_dir)
    metrics_log = build_metrics_log(config)
    engine = build_engine(config, model_dir)
    optimizer = build_optimizer(policy, config)
    reference = build_reference(config if ranks is None else sharded_config(config), model_dir, policy)  # KL anchor
    if ranks is not None:
        ranks.start({"model_dir": str(model_dir), "reference_dir": str(model_dir)})
        ranks.attach(policy, optimizer, reference)
    return Run(
        config=config,
        run_dir=Path(config.run_dir),
        policy=policy,
        optimizer=optimizer,
        engine=engine,
        reference=reference,
        buffer=build_buffer(config),
        seeds=build_seeds(config),
        metrics_log=metrics_log,
        engine_model_dir=model_dir,
        started=time.perf_counter() if started is None else started,
        ranks=ranks,
    )


def sharded_config(config: RunConfig) -> RunConfig:
    """`config` with model.fsdp on: with ranks the policy is always FSDP2-sharded (gradients are
    reduced by FSDP). A copy, so the run's saved config.json still says what the user chose."""
    return dataclasses.replace(config, model=dataclasses.replace(config.model, fsdp=True))


def unsharded_config(config: RunConfig) -> RunConfig:
    """`config` with model.fsdp off: the SFT warm-start runs on rank 0 alone, on a whole policy."""
    return dataclasses.replace(config, model=dataclasses.replace(config.model, fsdp=False))


def ensure_model(config: RunConfig, *, progress: JobProgress = NO_PROGRESS) -> Path:
    """The model dir `model.path` names: a local checkpoint, a hub id from the Hugging Face cache, or
    one the recipe asks to be built (`model.export`, `model.init_tiny`); see rollhub.trainer.model_source.
    An export (a minute or more) shows on `progress`."""
    from rollhub.trainer.model_source import is_model_dir, resolve_model_path

    model = config.model
    exporting = model.export is not None and not is_model_dir(Path(model.path))
    with progress.phase(f"export {model.export} to {model.path}") if exporting else contextlib.nullcontext():
        return resolve_model_path(model.path, init_tiny=model.init_tiny, export=model.export, seed=config.seed)


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
        share_prefix=config.optim.share_prefix,
        lora=config.model.lora,
    )


def build_reference(config: RunConfig, model_dir: Path, policy: Policy) -> Policy | AdapterlessReference | None:
    """The frozen KL anchor (the warm-start), only when the loss has a KL term; with LoRA the policy
    itself with its adapters off (the base it loaded is the warm-start), not a second copy."""
    if config.loss.kl_coef <= 0:
        return None
    if policy.peft is not None:
        return AdapterlessReference(policy)
    return Policy(
        model_dir,
        device=model_device(config),
        micro_batch_size=config.optim.micro_batch_size,
        temperature=policy.temperature,
        dtype=config.model.dtype,
        fsdp=config.model.fsdp,  # with ranks, sharded like the policy
    )


def build_optimizer(policy: Policy, config: RunConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable weights; with optim.train_embeddings false it also freezes
    the embeddings (requires_grad off), so no gradient is computed for them either."""
    o = config.optim
    if not o.train_embeddings and policy.peft is None:  # LoRA leaves every base weight frozen already
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

    owns_ray = False
    if config.engine.placement == "ray":  # the servers' actors join the run's Ray (cluster.address)
        from rollhub.rollout.cluster.backend import ensure_ray

        owns_ray = ensure_ray(config.cluster)
    engine = build_from_section(
        config.engine_config, model_dir, device=model_device(config), run_dir=Path(config.run_dir)
    )
    if owns_ray:  # a Ray this run started ends with the fleet, the last user of it
        engine.placement.owns_ray = True
    lora = config.model.lora
    if config.engine.weight_sync == "lora_adapter" and lora is not None and hasattr(engine, "server_args"):
        from rollhub.inference.weight_sync import sglang_lora_args

        engine.server_args = sglang_lora_args(lora.rank, lora.target_modules)  # launched SGLang servers
    return engine


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
        config.env.id,
        config.env.kwargs,
        config.eval_env_id,
        config.eval_env_kwargs,
        demo_kwargs=config.sft.env_kwargs,
        eval_seeds=config.eval.seeds,
        train_seeds=config.train_seeds,
    )
    config.eval.env.id, config.eval.env.kwargs = config.eval_env_id, eval_kwargs
    from rollhub.envs.run_checks import check_env_kwargs, check_env_values, check_eval_disjoint

    for name in config.eval.baselines:  # each reading's env, typed and checked like evaluation's own
        where = f"eval.baselines.{name}"
        kwargs = check_env_kwargs(config.eval_env_id, config.baseline_env_kwargs(name), where=where)
        check_env_values(config.eval_env_id, kwargs, where, evaluation=True)
        check_eval_disjoint(
            config.env.id,
            config.env.kwargs,
            config.eval_env_id,
            kwargs,
            eval_seeds=config.eval.seeds,
            train_seeds=config.train_seeds,
        )
        config.eval.baselines[name] = {key: kwargs[key] for key in config.eval.baselines[name]}
    if config.eval.select.enabled:
        check_selection_disjoint(config)


def check_selection_disjoint(config: RunConfig) -> None:
    """Checkpoint selection's validation tasks (`eval.select.kwargs` over evaluation's env) checked
    like evaluation's, and by content apart from training and from the held-out tasks: a pick read
    on training tasks favours memorising, one read on held-out tasks makes the final held-out
    reading the best of several draws."""
    from rollhub.envs.run_checks import check_env_kwargs, check_env_values, check_eval_disjoint

    env_id, select = config.eval_env_id, config.eval.select
    kwargs = check_env_kwargs(env_id, config.select_env_kwargs, where="eval.select.kwargs")
    check_env_values(env_id, kwargs, "eval.select.kwargs", evaluation=True)
    fix = (
        "point eval.select.kwargs at validation tasks of their own, neither trained on nor held out "
        "(Sokoban: {split: validation}), or turn selection off (eval.select.episodes: 0)"
    )
    validation_seeds = list(select.seed_range)
    check_eval_disjoint(
        config.env.id,
        config.env.kwargs,
        env_id,
        kwargs,
        eval_seeds=validation_seeds,
        train_seeds=config.train_seeds,
        names=("validation", "training"),
        fix=fix,
    )
    check_eval_disjoint(
        env_id,
        kwargs,
        env_id,
        config.eval_env_kwargs,
        eval_seeds=config.eval.seeds,
        train_seeds=validation_seeds,
        names=("evaluation", "validation"),
        fix=fix,
    )
    config.eval.select.kwargs = {key: kwargs[key] for key in select.kwargs}


def make_baseline_env_factory(config: RunConfig, name: str) -> Callable[[], Any]:
    """Envs for the held-out reading `eval.baselines.<name>`: evaluation's env with its kwargs over."""
    from rollhub.envs.registry import make

    env_id, kwargs = config.eval_env_id, config.baseline_env_kwargs(name)
    return lambda: make(env_id, **kwargs)


def build_buffer(config: RunConfig) -> GroupBuffer | None:
    """The bounded-staleness hand-off of async mode; lockstep mode has none."""
    if config.rollout.lockstep:
        return None
    return GroupBuffer(config.rollout.groups_per_batch, config.rollout.async_ratio)


def build_seeds(config: RunConfig) -> SeedSource:
    """The training seeds, fresh ones from `config.train_seed_start` on. `EnvManager` and `RayRollout`
    alike draw each group's seed from it in the trainer's process (Ray ships the number to a shard)."""
    return SeedCursor(config.train_seed_start)


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
    """The env manager in this process, or its Ray counterpart with `cluster.backend: ray` (env shards
    over the run's engine fleet); both take the run's `env`, `rollout` and `agent` sections whole."""
    from rollhub.rollout.manager import EnvManager

    rollout = config.rollout
    unknown = sorted(set(rollout.env_concurrency or {}) - {config.env.id})
    if unknown:  # a cap under a misspelt id would silently cap nothing
        raise UserError(
            f"rollout.env_concurrency names {', '.join(unknown)}, which this run does not play; "
            f"use the training env's id ({config.env.id})"
        )
    jsonl_path = str(run_dir / RUN_TRAJECTORY_LOG) if config.train.log_trajectories else None
    if buffer is not None:  # redundant groups get admission slots of their own; the staleness rule
        buffer.configure(redundant_groups=rollout.redundant_groups, staleness_rule=rollout.staleness_rule)
    if config.agent.program:  # an agent program's sessions through the gateway (docs/gateway.md)
        return build_program_rollout(config, engine, tokenizer, buffer=buffer, seeds=seeds, jsonl_path=jsonl_path)
    if config.cluster.backend == "ray":  # env shards and engine servers as Ray actors (docs/ray.md)
        from rollhub.rollout.cluster.backend import RayRollout

        return RayRollout(
            model_dir,
            config.cluster,
            env=config.env,
            rollout=rollout,
            agent=config.agent,
            engine=engine,  # the run's fleet on Ray: one set of servers for rollouts and evaluation
            buffer=buffer,
            seeds=seeds,
            run_dir=run_dir,
            jsonl_path=jsonl_path,
        )
    return EnvManager(
        engine,
        tokenizer,
        env=config.env,
        rollout=rollout,
        agent=config.agent,
        buffer=buffer,
        seeds=seeds,
        jsonl_path=jsonl_path,
    )


def build_program_rollout(
    config: RunConfig,
    engine: InferenceEngine,
    tokenizer: Any,
    *,
    buffer: GroupBuffer | None,
    seeds: Iterator[int],
    jsonl_path: str | None,
) -> RolloutSource:
    """`agent.program` run once per episode against a gateway session; sampling pinned to the run's."""
    from rollhub.rollout.gateway.config import GatewayConfig
    from rollhub.rollout.gateway.programs import command_program
    from rollhub.rollout.gateway.rollout import ProgramRollout

    agent = config.agent
    if config.cluster.backend == "ray":
        raise UserError("agent.program runs in the trainer's process: use cluster.backend: local with it")
    gateway_config = GatewayConfig(
        temperature=agent.temperature,
        top_p=agent.top_p,
        top_k=agent.top_k,
        default_max_tokens=agent.max_new_tokens,
        max_context_tokens=agent.max_context_tokens,
    )
    return ProgramRollout(
        engine,
        tokenizer,
        command_program(agent.program),
        env_id=config.env.id,
        group_size=config.rollout.group_size,
        seeds=seeds,
        buffer=buffer,
        config=gateway_config,
        jsonl_path=jsonl_path,
    )


def build_metrics_log(config: RunConfig) -> MetricsLog:
    """The run's metrics log: metrics.jsonl, plus the trackers `log.trackers` names."""
    from rollhub.trainer.trackers import build_trackers

    trackers = build_trackers(
        config.run_dir,
        config.log.trackers,
        project=config.log.project,
        run_name=config.log.run_name,
        config=dataclasses.asdict(config),
    )
    return MetricsLog(config.run_dir, tensorboard="tensorboard" in config.log.trackers, trackers=trackers)
