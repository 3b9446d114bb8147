"""The training job: warm-start, then asynchronous RL, read top to bottom.

`run_training(config)` does, in order:
  1. prepare: build the tiny model if missing, load the policy (trainer) and a separate
     copy in the inference engine, optimizer, metrics log; or restore all of it from the
     latest checkpoint with `resume=True`;
  2. warm-start: SFT on scripted-expert demonstrations (if enabled), then evaluate on
     the held-out seeds;
  3. RL: the loop in `rl_loop` (below);
  4. evaluate again on the same held-out seeds, print both numbers, plot the curve.

One RL step (`rl_loop`):
  batch from the GroupBuffer (or a lockstep batch in sync mode)
  -> proximal log-probs (trainer weights at step start)
  -> advantages (GRPO / GiGPO, per group)
  -> loss (decoupled PPO by default) and one optimizer step
  -> version += 1 -> push the weights to the engine (in-process state dict)
  -> log (JSONL + TensorBoard), checkpoint.
Generation never stops while the trainer computes: the env manager keeps filling the
buffer up to (alpha+1)*B groups, and the heavy tensor work runs in a worker thread so the
event loop keeps stepping envs. Sync training is the same loop with alpha = 0 and
`lockstep: true` (each batch is generated, then trained on; nothing runs ahead).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from rollhub.core.config import config_to_dict
from rollhub.core.errors import UserError
from rollhub.trainer.batch import build_training_batch
from rollhub.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rollhub.trainer.config import RunConfig
from rollhub.trainer.evaluate import EvalResult, evaluate_policy
from rollhub.trainer.metrics import MetricsLog, plot_learning_curve, read_jsonl
from rollhub.trainer.policy import Policy
from rollhub.trainer.update import ppo_update
from rollhub.trainer.worker import ComputeThread, release_freed_memory

logger = logging.getLogger(__name__)

WARMSTART_FILE = "warmstart.json"
SFT_MODEL_DIR = "sft_model"


@dataclass
class TrainingSummary:
    run_dir: Path
    warmstart: EvalResult | None
    final: EvalResult | None
    steps: int
    wall_s: float
    phases_s: dict[str, float] = field(default_factory=dict)


class SeedCursor:
    """Training task seeds offset, offset+1, ...; its position is checkpointed."""

    def __init__(self, start: int):
        self.next_seed = start

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        seed = self.next_seed
        self.next_seed += 1
        return seed


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- 1. prepare -------------------------------------------------------------------------


def ensure_model(config: RunConfig) -> Path:
    """The model dir, built with `init_tiny_model` when missing and allowed."""
    path = Path(config.model.path)
    if (path / "config.json").exists():
        return path
    if config.model.init_tiny is None:
        raise UserError(f"model path {path} has no config.json; set model.init_tiny: 5m to build a tiny model there, or point model.path at an HF checkpoint dir")
    from rollhub.rollout.models import init_tiny_model

    logger.info("building tiny model %s at %s", config.model.init_tiny, path)
    return init_tiny_model(path, config.model.init_tiny, seed=config.seed)


def make_optimizer(policy: Policy, config: RunConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable weights; with optim.train_embeddings false it also freezes
    the embeddings (requires_grad off), so no gradient is computed for them either."""
    o = config.optim
    if not o.train_embeddings:
        for module in (policy.model.get_input_embeddings(), policy.model.get_output_embeddings()):
            if module is not None:
                module.weight.requires_grad_(False)
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)


def make_env_factory(config: RunConfig) -> Callable[[], Any]:
    from rollhub.envs.registry import make

    return lambda: make(config.env.id, **config.env.kwargs)


def check_env_registered(env_id: str) -> None:
    from rollhub.envs.registry import all_specs

    ids = [getattr(s, "id", s) for s in all_specs()]
    if env_id not in ids:
        import difflib

        close = difflib.get_close_matches(env_id, ids, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UserError(f"env id '{env_id}' is not registered{hint}; see 'rollhub envs list'")


# --- 2. warm-start ----------------------------------------------------------------------


async def collect_demonstrations(config: RunConfig, tokenizer: Any) -> list[Any]:
    """Scripted-expert episodes through the real agent loop (identical token layout)."""
    from rollhub.rollout.agent import run_episode
    from rollhub.rollout.prompting import ChatSegments
    from rollhub.trainer.sft import ExpertEngine

    make_env = make_env_factory(config)
    segments = ChatSegments(tokenizer)
    demos = []
    for k in range(config.sft.episodes):
        env = make_env()
        seed = config.sft.seed_offset + k
        expert = ExpertEngine(env, tokenizer, noise=config.sft.noise, rng=random.Random(seed))
        try:
            demos.append(await run_episode(env, expert, tokenizer, config.agent, seed, env_id=config.env.id, segments=segments))
        finally:
            await env.close()
    solved = sum(d.success for d in demos)
    logger.info("collected %d expert demonstrations (%d solved)", len(demos), solved)
    return [d for d in demos if d.success] or demos


# --- 3. RL ------------------------------------------------------------------------------


@dataclass
class LoopState:
    """What the loop carries from step to step (and checkpoints)."""

    version: int = 0  # policy version = optimizer steps taken
    idle_s: float = 0.0  # time the trainer waited for batches
    busy_s: float = 0.0
    groups_trained: int = 0
    warmstart_success: float | None = None
    wall_s: float = 0.0  # job wall time up to the last checkpoint, across resumes

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _batch_reward_metrics(groups: list[Any]) -> dict[str, float]:
    trajectories = [t for g in groups for t in g.trajectories]
    if not trajectories:
        return {}
    turns = sum(len(t.turns) for t in trajectories) or 1
    return {
        "train/success_rate": float(np.mean([t.success for t in trajectories])),
        "train/mean_return": float(np.mean([t.total_reward for t in trajectories])),
        "train/mean_turns": turns / len(trajectories),
        "train/invalid_action_rate": sum(t.info.get("invalid_actions", 0) for t in trajectories) / turns,
        "train/format_error_rate": sum(t.info.get("format_errors", 0) for t in trajectories) / turns,
    }


async def rl_loop(
    config: RunConfig,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    manager: Any,
    buffer: Any,
    state: LoopState,
    metrics_log: MetricsLog,
    *,
    save: Callable[[LoopState], None],
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    evaluate: Callable[[], Any] | None = None,
    reference: Policy | None = None,
) -> None:
    """RL steps from `state.version` to `config.train.steps` (see module docstring).

    `reference` is the frozen warm-start policy of the optional KL term (loss.kl_coef > 0).
    """
    sync = config.rollout.lockstep
    compute = ComputeThread()  # one thread, one malloc arena (rollhub/trainer/worker.py)
    started = time.perf_counter()
    step_started = time.perf_counter()
    try:
        while state.version < config.train.steps:
            # batch: the buffer drops groups more than ceil(alpha) versions stale
            wait_started = time.perf_counter()
            if sync:
                groups = await manager.collect_batch(config.rollout.groups_per_batch)  # the trainer idles meanwhile
            else:
                groups = await buffer.get_batch(state.version)
            wait_s = time.perf_counter() - wait_started
            compute_started = time.perf_counter()

            # advantages per group, broadcast to response tokens
            batch, stats = build_training_batch(groups, policy.tokenizer.pad_token_id, **config.algorithm.advantage_kwargs())

            # proximal log-probs, loss, optimizer step (off the event loop: envs keep stepping)
            step_metrics: dict[str, Any] = {}
            if batch is not None:
                _set_lr(optimizer, config, state.version)
                o = config.optim
                step_metrics = await compute.run(
                    ppo_update, policy, optimizer, batch, config.loss, minibatches=o.minibatches, epochs=o.epochs,
                    max_grad_norm=o.max_grad_norm, seed=config.seed * 1_000_003 + state.version, reference=reference,
                )
                step_metrics["lr"] = optimizer.param_groups[0]["lr"]
            else:
                logger.warning("step %d: nothing to train on in the batch (every group or sequence filtered out, e.g. all advantages 0); skipping the update", state.version + 1)

            # new policy version -> engine (pause, abort in-flight, load, resume)
            state.version += 1
            state.groups_trained += len(groups)
            weights = await compute.run(policy.engine_state_dict)
            await manager.update_weights(weights, state.version)
            del weights, batch
            release_freed_memory()
            compute_s = time.perf_counter() - compute_started

            # log
            state.idle_s += wait_s
            state.busy_s += compute_s
            now = time.perf_counter()
            step_wall = now - step_started
            step_started = now
            record: dict[str, Any] = {
                **_batch_reward_metrics(groups),
                **{f"train/{k}": v for k, v in step_metrics.items()},
                "batch/groups": stats.groups,
                "batch/sequences": stats.sequences,
                "batch/dropped_zero_advantage_sequences": stats.dropped_sequences,
                "batch/excluded_trajectories": stats.excluded_trajectories,
                "batch/zero_advantage_groups": stats.zero_advantage_groups,
                "gigpo/singleton_anchor_fraction": stats.singleton_anchor_fraction,
                "gigpo/mean_step_group_size": stats.mean_step_group_size,
                "time/step_s": step_wall,
                "time/wait_for_batch_s": wait_s,
                "time/train_s": compute_s,
                "time/elapsed_s": now - started,
                "trainer/idle_fraction": wait_s / step_wall if step_wall > 0 else 0.0,
                "trainer/idle_fraction_cumulative": state.idle_s / max(state.idle_s + state.busy_s, 1e-9),
                "policy/version": state.version,
            }
            record.update(_rollout_metrics(manager, buffer))
            warning = collapse_warning(record, trained=bool(step_metrics))
            if warning:
                logger.warning("step %d: %s", state.version, warning)
            if evaluate is not None and config.eval.every and state.version % config.eval.every == 0 and state.version < config.train.steps:
                result = await evaluate()
                record.update(result.metrics())
            metrics_log.log(state.version, record)
            if on_step is not None:
                on_step(state.version, record)

            if config.train.checkpoint_every and state.version % config.train.checkpoint_every == 0:
                save(state)
            if config.train.max_wall_s is not None and now - started > config.train.max_wall_s:
                logger.warning("stopping RL after %d steps: train.max_wall_s=%s reached", state.version, config.train.max_wall_s)
                break
    finally:
        compute.close()


def collapse_warning(record: dict[str, Any], *, trained: bool = True) -> str | None:
    """A hint when a step's batch can no longer teach anything: every group scored alike.

    A policy that collapsed into format errors earns all-zero rewards, hence all-zero
    advantages, and never recovers on its own; say so instead of training on silently.
    """
    groups = record.get("batch/groups") or 0
    if not groups or record.get("batch/zero_advantage_groups", 0) < groups:
        return None
    format_errors = record.get("train/format_error_rate", 0.0)
    if format_errors >= 0.5:
        return (f"every group has zero advantage and {format_errors:.0%} of turns are format errors: the policy has "
                "collapsed; resume from an earlier checkpoint with a lower optim.lr, or add loss.kl_coef")
    if not trained:  # the loop already warned that it skipped the update
        return None
    return "every group has zero advantage (all samples of each task scored alike): this step taught nothing"


def _set_lr(optimizer: torch.optim.Optimizer, config: RunConfig, version: int) -> None:
    """Linear warm-up over `warmup_steps`, then linear decay to lr * lr_end_factor at the last step."""
    o = config.optim
    factor = min(1.0, (version + 1) / o.warmup_steps) if o.warmup_steps > 0 else 1.0
    span = max(config.train.steps - 1, 1)
    factor *= 1.0 - (1.0 - o.lr_end_factor) * min(version / span, 1.0)
    for group in optimizer.param_groups:
        group["lr"] = config.optim.lr * factor


def _rollout_metrics(manager: Any, buffer: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    summary = manager.summary()
    for key in ("generation_tokens_per_s", "generated_tokens", "wasted_tokens", "redundant_cancelled", "infra_failures"):
        if key in summary:
            out[f"rollout/{key}"] = summary[key]
    out.update({k: v for k, v in summary.items() if k.startswith(("cluster/", "router/")) and isinstance(v, (int, float))})  # Ray backend
    if buffer is not None:
        for key, value in buffer.metrics().items():
            if isinstance(value, (int, float)):
                out[key] = value
        if getattr(buffer, "last_batch_staleness", None):
            hist = buffer.last_batch_staleness
            total = sum(hist.values())
            out["staleness/batch_mean"] = sum(k * v for k, v in hist.items()) / total if total else 0.0
            out["staleness/batch_histogram"] = {str(k): v for k, v in sorted(hist.items())}
    updates = summary.get("weight_updates") or []
    if updates:
        last = updates[-1]
        out["weights/pause_s"] = last.get("pause_s", 0.0)
        out["weights/update_s"] = last.get("update_s", 0.0)
    return out


# --- the whole job ----------------------------------------------------------------------


def _progress(enabled: bool):
    if not enabled:
        return contextlib.nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}"))


async def run_training(config: RunConfig, *, resume: bool = False, progress: bool = True, print_fn: Callable[[str], None] = print) -> TrainingSummary:
    """The whole job (see module docstring). Returns warm-start and final evaluations."""
    from rollhub.rollout.buffer import GroupBuffer
    from rollhub.rollout.engines.hf import HFEngine
    from rollhub.rollout.manager import EnvManager, EnvManagerConfig

    job_started = time.perf_counter()
    phases: dict[str, float] = {}
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(config.model.threads)
    check_env_registered(config.env.id)
    if config.cluster.backend == "ray":  # fail before the warm-start, not after it
        from rollhub.rollout.cluster.backend import import_ray

        import_ray()
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None and (run_dir / "metrics.jsonl").exists():
        logger.warning("no complete checkpoint in %s; starting the run over", run_dir)
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise UserError(f"{run_dir} already holds a run; pass --resume {run_dir} to continue it, or choose another run_dir")
    (run_dir / "config.json").write_text(json.dumps(config_to_dict(config), indent=2))
    seed_everything(config.seed)

    # 1. prepare
    t = time.perf_counter()
    model_dir = ensure_model(config)
    sft_dir = run_dir / SFT_MODEL_DIR
    start_from = sft_dir if (config.sft.enabled and (sft_dir / "config.json").exists()) else model_dir
    policy = Policy(start_from, device=config.model.device, temperature=config.agent.temperature if config.agent.temperature > 0 else 1.0,
                    micro_batch_size=config.optim.micro_batch_size, gradient_checkpointing=config.model.gradient_checkpointing, fsdp=config.model.fsdp)
    phases["prepare_s"] = time.perf_counter() - t
    metrics_log = MetricsLog(run_dir)
    state = LoopState()
    prior_wall_s = 0.0
    make_env = make_env_factory(config)
    eval_seeds = config.eval.seeds

    # 2. warm-start (skipped when resuming an RL checkpoint or a finished SFT)
    warmstart: EvalResult | None = None
    if checkpoint is None:
        metrics_log.truncate_after(-1)  # a resume without a complete checkpoint starts over
        if config.sft.enabled and start_from is model_dir:
            t = time.perf_counter()
            demos = await collect_demonstrations(config, policy.tokenizer)
            from rollhub.trainer.sft import sft_epochs

            sft_log = MetricsLog(run_dir, tensorboard=False, filename="sft_metrics.jsonl")
            history = await asyncio.to_thread(
                sft_epochs, policy, demos, epochs=config.sft.epochs, lr=config.sft.lr, batch_size=config.sft.batch_size,
                seed=config.seed, on_step=lambda i, m: sft_log.log(i, m),
            )
            policy.save_pretrained(sft_dir)
            phases["sft_s"] = time.perf_counter() - t
            print_fn(f"SFT warm-start: {len(demos)} demos, {len(history)} steps, final loss {history[-1]['sft/loss']:.3f} ({phases['sft_s']:.0f}s)")

    engine_source = sft_dir if (config.sft.enabled and (sft_dir / "config.json").exists()) else model_dir
    engine = HFEngine(engine_source, threads=config.rollout.engine_threads, max_batch_size=config.rollout.engine_max_batch_size, seed=config.rollout.seed)
    optimizer = make_optimizer(policy, config)
    # the KL anchor is the warm-start (or the base model without SFT), frozen
    reference = Policy(engine_source, device=config.model.device, micro_batch_size=config.optim.micro_batch_size,
                       temperature=policy.temperature) if config.loss.kl_coef > 0 else None
    seeds = SeedCursor(config.env.train_seed_offset)
    buffer = None if config.rollout.lockstep else GroupBuffer(config.rollout.groups_per_batch, config.rollout.async_ratio)

    if checkpoint is not None:
        payload = load_checkpoint(checkpoint, model=policy.model, optimizer=optimizer)
        state = LoopState(**payload["trainer"])
        prior_wall_s = state.wall_s
        seeds.next_seed = payload["rollout"].get("next_seed", seeds.next_seed)
        if buffer is not None and payload["rollout"].get("buffer"):
            buffer.load_state_dict(payload["rollout"]["buffer"])
        metrics_log.truncate_after(state.version)
        await engine.update_weights(policy.engine_state_dict(), state.version)
        print_fn(f"resumed {run_dir} at step {state.version}")
        warm = run_dir / WARMSTART_FILE
        if warm.exists():
            state.warmstart_success = json.loads(warm.read_text()).get("success_rate", state.warmstart_success)

    async def evaluate(label: str) -> EvalResult:
        t0 = time.perf_counter()
        if engine.weight_version != state.version:  # cluster.backend=ray pushes to remote engines only
            await engine.update_weights(policy.engine_state_dict(), state.version)
        result = await evaluate_policy(engine, policy.tokenizer, make_env, config.agent, eval_seeds, temperature=config.eval.temperature,
                                       max_concurrent=config.env.max_concurrent, env_id=config.env.id,
                                       samples_per_seed=config.eval.samples_per_seed)
        phases[f"eval_{label}_s"] = phases.get(f"eval_{label}_s", 0.0) + time.perf_counter() - t0
        return result

    try:
        if checkpoint is None:
            t = time.perf_counter()
            warmstart = await evaluate("warmstart")
            state.warmstart_success = warmstart.success_rate
            (run_dir / WARMSTART_FILE).write_text(json.dumps(warmstart.metrics(prefix="")))
            metrics_log.log(0, {**warmstart.metrics(), "policy/version": 0})
            print_fn(f"warm-start success on {config.eval.label}: {100 * warmstart.success_rate:.1f}%")

        # 3. RL
        manager_config = EnvManagerConfig(
            env_id=config.env.id, env_kwargs=dict(config.env.kwargs), group_size=config.rollout.group_size,
            max_concurrent_trajectories=config.env.max_concurrent, lockstep=config.rollout.lockstep,
            jsonl_path=str(run_dir / "trajectories.jsonl") if config.train.log_trajectories else None, agent=config.agent,
        )
        if config.cluster.backend == "ray":  # env shards and engine servers as Ray actors (docs/ray.md)
            from rollhub.rollout.cluster.backend import RayRollout

            manager = RayRollout(engine_source, manager_config, config.cluster, buffer=buffer, seeds=seeds, run_dir=run_dir)
            if state.version:
                await manager.update_weights(policy.engine_state_dict(), state.version)
        else:
            manager = EnvManager(engine, policy.tokenizer, manager_config, buffer=buffer, seeds=seeds)

        def save(loop_state: LoopState) -> None:
            loop_state.wall_s = prior_wall_s + time.perf_counter() - job_started
            rollout_state = {"next_seed": seeds.next_seed, "buffer": buffer.state_dict() if buffer is not None else None}
            save_checkpoint(run_dir, loop_state.version, model=policy.model, optimizer=optimizer, trainer_state=loop_state.as_dict(),
                            rollout_state=rollout_state, keep_last=config.train.keep_checkpoints)

        stop = asyncio.Event()
        producer = None if buffer is None else asyncio.ensure_future(manager.run(stop))
        t = time.perf_counter()
        with _progress(progress) as bar:
            task = bar.add_task("RL", total=config.train.steps, completed=state.version, info="") if bar is not None else None

            def on_step(step: int, record: dict[str, Any]) -> None:
                if bar is not None:
                    bar.update(task, completed=step, info=f"success {record.get('train/success_rate', 0):.2f}  idle {record['trainer/idle_fraction']:.2f}")
                logger.info("step %d: %s", step, {k: v for k, v in record.items() if isinstance(v, float)})

            try:
                await rl_loop(config, policy, optimizer, manager, buffer, state, metrics_log, save=save, on_step=on_step,
                              evaluate=lambda: evaluate("periodic"), reference=reference)
            finally:
                stop.set()
                if producer is not None:
                    await asyncio.gather(producer, return_exceptions=True)
                await manager.close()
        phases["rl_s"] = time.perf_counter() - t
        if state.version and (not config.train.checkpoint_every or state.version % config.train.checkpoint_every):
            save(state)

        # 4. final evaluation on the same held-out seeds
        final = await evaluate("final")
        metrics_log.log(state.version, {**final.metrics(), "policy/version": state.version})
        policy.save_pretrained(run_dir / "final_model")
    finally:
        await engine.close()
        metrics_log.close()

    wall = prior_wall_s + time.perf_counter() - job_started  # a resumed run counts its earlier processes too
    before = state.warmstart_success if warmstart is None else warmstart.success_rate
    records = read_jsonl(run_dir / "metrics.jsonl")
    plot_learning_curve(records, run_dir / "learning_curve.png", title=f"{config.env.id}: {config.algorithm.estimator}, alpha={config.rollout.async_ratio}")
    summary = {"warmstart_success_rate": before, "final_success_rate": final.success_rate, "eval_seeds": len(eval_seeds),
               "eval_samples_per_seed": config.eval.samples_per_seed, "steps": state.version, "wall_s": wall, "phases_s": phases}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if before is not None:
        print_fn(f"warm-start success: {100 * before:.1f}%  ->  final success: {100 * final.success_rate:.1f}%  "
                 f"({final.success_rate - before:+.1%} on {config.eval.label}, {state.version} RL steps, {wall / 60:.1f} min)")
    else:
        print_fn(f"final success: {100 * final.success_rate:.1f}% ({state.version} RL steps, {wall / 60:.1f} min)")
    return TrainingSummary(run_dir, warmstart, final, state.version, wall, phases)
