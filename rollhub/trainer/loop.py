"""The training job: warm-start, then asynchronous RL, read top to bottom.

`run_training(config)` is a sequence of named phases; its parts come from the composition
root, `rollhub.trainer.build`:
  1. `open_run_dir`: refuse to overwrite another run, find the checkpoint to resume;
  2. prepare: the model dir (a tiny model is built if missing) and the policy;
  3. `warm_start`: SFT on scripted-expert demonstrations (if enabled), then the engine,
     optimizer and reference policy; `restore` loads a checkpoint over all of them;
  4. `evaluate_warm_start` on the held-out seeds;
  5. `reinforce`: the rollout source (`EnvManager`, or `RayRollout` on Ray) feeds `rl_loop`;
  6. `evaluate` again on the same seeds, then `report` prints both numbers and plots the curve.

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
import collections
import contextlib
import dataclasses
import functools
import json
import logging
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollhub.core.config import config_to_dict
from rollhub.core.errors import UserError
from rollhub.inference.engines.base import InferenceEngine
from rollhub.rollout.buffer import GroupBuffer
from rollhub.rollout.seed_sources import SeedCursor, SeedSource  # noqa: F401 (SeedCursor lived here: re-exported)
from rollhub.rollout.source import RolloutSource
from rollhub.rollout.trajectory_log import RUN_TRAJECTORY_LOG
from rollhub.rollout.types import RolloutFailureError
from rollhub.trainer.batch import batch_failed, build_training_batch
from rollhub.trainer.build import (
    build_buffer,
    build_engine,
    build_optimizer,
    build_policy,
    build_reference,
    build_rollout,
    build_seeds,
    check_run_envs,
    ensure_model,
    make_sft_env_factory,
    start_engine,
)
from rollhub.trainer.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from rollhub.trainer.config import RunConfig
from rollhub.trainer.distributed import RankGroup, sharded_config
from rollhub.trainer.evaluate import EvalResult, evaluate_held_out
from rollhub.trainer.metrics import MetricsLog, plot_learning_curve, read_jsonl
from rollhub.trainer.policy import Policy
from rollhub.trainer.selection import CheckpointSelector
from rollhub.trainer.update import ppo_update
from rollhub.trainer.worker import ComputeThread, release_freed_memory

logger = logging.getLogger(__name__)

WARMSTART_FILE = "warmstart.json"
SFT_MODEL_DIR = "sft_model"
SFT_DONE_FILE = "sft_done.json"  # written after sft_model/ is complete: the only proof that it is


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- 2. warm-start ----------------------------------------------------------------------


async def collect_demonstrations(config: RunConfig, tokenizer: Any) -> list[Any]:
    """Scripted-expert episodes through the real agent loop (identical token layout)."""
    from rollhub.rollout.agent import run_episode
    from rollhub.rollout.prompting import ChatSegments
    from rollhub.trainer.sft import ExpertEngine

    make_env = make_sft_env_factory(config)
    segments = ChatSegments(tokenizer)
    demos = []
    for k in range(config.sft.episodes):
        env = make_env()
        seed = config.sft.seed_offset + k
        expert = ExpertEngine(
            env, tokenizer, noise=config.sft.noise, noise_kind=config.sft.noise_kind, rng=random.Random(seed)
        )
        try:
            demos.append(
                await run_episode(env, expert, tokenizer, config.agent, seed, env_id=config.env.id, segments=segments)
            )
        finally:
            await env.close()
    solved = sum(d.success for d in demos)
    logger.info("collected %d expert demonstrations (%d solved)", len(demos), solved)
    return [d for d in demos if d.success] or demos


async def fine_tune_on_demos(config: RunConfig, policy: Policy, log_dir: Path) -> tuple[list[Any], list[dict]]:
    """Collect the expert demos and run the SFT epochs (log in log_dir/sft_metrics.jsonl, started
    empty: lines of an interrupted attempt would be counted twice); returns (demos, history)."""
    from rollhub.trainer.sft import sft_epochs

    demos = await collect_demonstrations(config, policy.tokenizer)
    sft_log = MetricsLog(log_dir, tensorboard=False, filename="sft_metrics.jsonl")
    sft_log.truncate_after(-1)
    history = await asyncio.to_thread(
        _with_threads,
        config.sft.torch_threads(config),
        sft_epochs,
        policy,
        demos,
        epochs=config.sft.epochs,
        lr=config.sft.lr,
        batch_size=config.sft.batch_size,
        seed=config.seed,
        on_step=sft_log.log,
    )
    return demos, history


def _with_threads(threads: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` with `threads` torch threads, the previous count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_num_threads(before)


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
    final_reserve_s: float = 0.0  # what the final readings will cost (train.max_job_wall_s), from the warm-start's

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _batch_reward_metrics(groups: list[Any]) -> dict[str, float]:
    """Rates over the scored trajectories (an infra failure is no evidence about the policy), plus
    the failure counts of the rule in rollhub.rollout.types: infra failures, model failures by reason."""
    everything = [t for g in groups for t in g.trajectories]
    trajectories = [t for t in everything if t.scored]
    if not everything:
        return {}
    record: dict[str, float] = {"train/infra_failed_trajectories": float(len(everything) - len(trajectories))}
    if not trajectories:
        return record
    turns = sum(len(t.turns) for t in trajectories) or 1
    reasons = collections.Counter(t.model_failure for t in trajectories if t.model_failure is not None)
    record.update(
        {
            "train/success_rate": float(np.mean([t.success for t in trajectories])),
            "train/mean_return": float(np.mean([t.total_reward for t in trajectories])),
            "train/mean_turns": turns / len(trajectories),
            "train/invalid_action_rate": sum(t.info.get("invalid_actions", 0) for t in trajectories) / turns,
            "train/format_error_rate": sum(t.info.get("format_errors", 0) for t in trajectories) / turns,
            "train/model_failure_rate": sum(reasons.values()) / len(trajectories),
            **{f"train/model_failures/{reason}": float(count) for reason, count in sorted(reasons.items())},
        }
    )
    return record


#: how often a trainer waiting for a batch checks whether the rollout source gave up
_FAILURE_POLL_S = 0.5


async def _next_async_batch(buffer: GroupBuffer, rollout: RolloutSource, version: int) -> list[Any]:
    """`buffer.get_batch`, unless the rollout source fails first: then its error, not a wait forever.

    The producer runs as its own task; when it stops (`failure` set, e.g. the infra failure
    budget is spent) no group will ever arrive, so the trainer must look instead of waiting.
    """
    batch = asyncio.ensure_future(buffer.get_batch(version))
    try:
        while True:
            done, _ = await asyncio.wait({batch}, timeout=_FAILURE_POLL_S)
            if done:
                return batch.result()
            failure = rollout.failure
            if failure is not None:
                raise failure
    finally:
        if not batch.done():
            batch.cancel()
            await asyncio.gather(batch, return_exceptions=True)


def _failed_batches_error(groups: list[Any], failed: int, config: RunConfig) -> RolloutFailureError:
    """The cause, the counts of the last batch and what to check, as one line."""
    everything = [t for g in groups for t in g.trajectories]
    scored = [t for t in everything if t.scored]
    reasons = collections.Counter(t.model_failure for t in scored if t.model_failure is not None)
    turns = sum(len(t.turns) for t in scored) or 1
    format_errors = sum(t.info.get("format_errors", 0) for t in scored) / turns
    detail = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items())) or "none"
    return RolloutFailureError(
        f"training stopped: every trajectory failed in {failed} consecutive batches "
        f"(rollout.max_failed_batches={config.rollout.max_failed_batches}); the last one had "
        f"{len(everything)} trajectories: {len(everything) - len(scored)} infra failures, none succeeded, no group "
        f"had an advantage signal, model failures: {detail}, format errors on {format_errors:.0%} of turns. "
        f"Check that {config.env.id} can be solved and rewards differ ('rollhub envs try'), the agent's prompt and "
        "answer format, and the SFT warm-start; set rollout.max_failed_batches: 0 to train on regardless"
    )


async def rl_loop(
    config: RunConfig,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    rollout: RolloutSource,
    buffer: GroupBuffer | None,
    state: LoopState,
    metrics_log: MetricsLog,
    *,
    save: Callable[[LoopState], None],
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    evaluate: Callable[[], Any] | None = None,
    validate: Callable[[int], Any] | None = None,
    reference: Policy | None = None,
    update: Callable[..., dict[str, Any]] = ppo_update,
    seeds: SeedSource | None = None,
    reset_reference: Callable[[], None] | None = None,
    deadline: float | None = None,
) -> None:
    """RL steps from `state.version` to `config.train.steps` (see module docstring).

    `deadline` (a `time.perf_counter()` reading; train.max_job_wall_s): RL stops cleanly when
    another step as long as the last one would end past it.

    `validate(step)` scores the policy on the validation seeds when eval.select is due
    (rollhub.trainer.selection) and returns its metrics ({} when not due).
    `reference` is the frozen warm-start policy of the optional KL term (loss.kl_coef > 0).
    `update` is `ppo_update`, or with trainer ranks `RankGroup.ppo_update` (the same step,
    data parallel: rollhub.trainer.distributed).
    `reset_reference()` makes the KL anchor the current policy (loss.reference_reset_every; with
    ranks, `RankGroup.reset_reference`).
    `seeds` is the rollout source's seed iterator; it sees every consumed batch (hard-seed
    replay pools the seeds of groups that did not all succeed: rollhub.rollout.seed_sources).
    Raises RolloutFailureError instead of looping on when rollout cannot feed it: the rollout
    source spent its infra failure budget (rollout.max_infra_failure_rate), or every
    trajectory failed in rollout.max_failed_batches consecutive batches.
    """
    sync = config.rollout.lockstep
    failed_batches = 0  # consecutive batches in which every trajectory failed (not checkpointed)
    compute = ComputeThread()  # one thread, one malloc arena (rollhub/trainer/worker.py)
    first_format_errors: float | None = None  # the collapse warning's baseline
    empty_batches = 0  # batches with nothing to train on, since this process started
    started = time.perf_counter()
    step_started = time.perf_counter()
    try:
        while state.version < config.train.steps:
            # batch: the buffer drops groups more than ceil(alpha) versions stale
            wait_started = time.perf_counter()
            if sync:  # raises RolloutFailureError once the rollout's infra failure budget is spent
                groups = await rollout.collect_batch(config.rollout.groups_per_batch)  # the trainer idles meanwhile
            else:
                groups = await _next_async_batch(buffer, rollout, state.version)
            wait_s = time.perf_counter() - wait_started
            compute_started = time.perf_counter()
            seed_metrics = seeds.observe(groups) if seeds is not None else {}  # replay: pool the hard seeds

            # advantages per group, broadcast to response tokens
            batch, stats = build_training_batch(groups, policy.tokenizer.pad_token_id, config.algorithm)
            failed_batches = failed_batches + 1 if batch_failed(groups, stats) else 0
            if config.rollout.max_failed_batches and failed_batches >= config.rollout.max_failed_batches:
                raise _failed_batches_error(groups, failed_batches, config)

            # proximal log-probs, loss, optimizer step (off the event loop: envs keep stepping)
            step_metrics: dict[str, Any] = {}
            if batch is not None:
                _set_lr(optimizer, config, state.version)
                o = config.optim
                step_metrics = await compute.run(
                    update,
                    policy,
                    optimizer,
                    batch,
                    config.loss,
                    minibatches=o.minibatches,
                    epochs=o.epochs,
                    max_grad_norm=o.max_grad_norm,
                    seed=config.seed * 1_000_003 + state.version,
                    reference=reference,
                    pack_tokens=o.pack_tokens,
                )
                step_metrics["lr"] = optimizer.param_groups[0]["lr"]
            else:
                # routine for a strong policy (every group all-success): warn once, count the rest
                empty_batches += 1
                (logger.warning if empty_batches == 1 else logger.debug)(
                    "step %d: nothing to train on in the batch (every group or sequence filtered out, "
                    "e.g. all advantages 0); skipping the update (later ones: batch/empty_batches in the metrics)",
                    state.version + 1,
                )

            # new policy version -> engine (pause, abort in-flight, load, resume)
            state.version += 1
            state.groups_trained += len(groups)
            reset_every = config.loss.reference_reset_every
            if reset_reference is not None and reset_every and state.version % reset_every == 0:
                await compute.run(reset_reference)  # the KL anchor moves to this version
                step_metrics["reference_reset"] = 1.0
            weights = await compute.run(policy.engine_state_dict)
            await rollout.update_weights(weights, state.version)
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
                "batch/groups_without_baseline": stats.groups_without_baseline,
                "batch/consecutive_failed": failed_batches,
                "batch/empty_batches": empty_batches,
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
            record.update(_rollout_metrics(rollout, buffer))
            record.update(seed_metrics)
            if first_format_errors is None and "train/format_error_rate" in record:
                first_format_errors = record["train/format_error_rate"]
            warning = collapse_warning(record, trained=bool(step_metrics), start_format_errors=first_format_errors)
            if warning:
                logger.warning("step %d: %s", state.version, warning)
            if (
                evaluate is not None
                and config.eval.every
                and state.version % config.eval.every == 0
                and state.version < config.train.steps
            ):
                result = await evaluate()
                record.update(result.metrics())
            if validate is not None:
                record.update(await validate(state.version))
            metrics_log.log(state.version, record)
            if on_step is not None:
                on_step(state.version, record)

            if config.train.checkpoint_every and state.version % config.train.checkpoint_every == 0:
                save(state)
            if config.train.max_wall_s is not None and now - started > config.train.max_wall_s:
                logger.warning(
                    "stopping RL after %d steps: train.max_wall_s=%s reached", state.version, config.train.max_wall_s
                )
                break
            if deadline is not None and time.perf_counter() + step_wall > deadline:
                logger.warning(
                    "stopping RL after %d steps: what is left of train.max_job_wall_s=%s is the final readings'",
                    state.version,
                    config.train.max_job_wall_s,
                )
                break
    finally:
        compute.close()


def copy_into_reference(reference: Policy, policy: Policy) -> None:
    """Make the KL anchor a frozen copy of the current policy (loss.reference_reset_every)."""
    reference.model.load_state_dict(policy.model.state_dict())  # copies, without autograd


def _reference_resetter(run: Run) -> Callable[[], None] | None:
    if run.reference is None or not run.config.loss.reference_reset_every:
        return None
    if run.ranks is not None:
        return run.ranks.reset_reference
    return functools.partial(copy_into_reference, run.reference, run.policy)


def collapse_warning(
    record: dict[str, Any], *, trained: bool = True, start_format_errors: float | None = None
) -> str | None:
    """A hint when a step's batch can no longer teach anything: every group scored alike.

    A policy that collapsed into format errors earns all-zero rewards, hence all-zero
    advantages, and never recovers on its own; say so instead of training on silently.
    `start_format_errors` is the rate of the process's first RL step: a policy that made as
    many format errors from the start has not collapsed (it was never taught the format).
    """
    groups = record.get("batch/groups") or 0
    if not groups or record.get("batch/zero_advantage_groups", 0) < groups:
        return None
    format_errors = record.get("train/format_error_rate", 0.0)
    if format_errors >= 0.5 and start_format_errors is not None and format_errors < start_format_errors + 0.25:
        return (
            f"every group has zero advantage and {format_errors:.0%} of turns are format errors, as from the "
            f"first step ({start_format_errors:.0%}): the policy does not know the answer format; warm-start it "
            "(sft.enabled) or show the format in the prompt"
        )
    if format_errors >= 0.5:
        return (
            f"every group has zero advantage and {format_errors:.0%} of turns are format errors: the policy has "
            "collapsed; resume from an earlier checkpoint with a lower optim.lr, or add loss.kl_coef"
        )
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


def _rollout_metrics(rollout: RolloutSource, buffer: GroupBuffer | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    summary = rollout.summary()
    for key in (
        "generation_tokens_per_s",
        "generated_tokens",
        "wasted_tokens",
        "redundant_cancelled",
        "infra_failures",
    ):
        if key in summary:
            out[f"rollout/{key}"] = summary[key]
    out.update(
        {
            k: v
            for k, v in summary.items()
            if k.startswith(("cluster/", "router/", "engine/")) and isinstance(v, (int, float))
        }
    )  # Ray backend, and the in-process engine's counters
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


@dataclass
class Run:
    """The collaborators of one training job, built once by `run_training`."""

    config: RunConfig
    run_dir: Path
    policy: Policy
    optimizer: torch.optim.Optimizer
    engine: InferenceEngine
    reference: Policy | None
    buffer: GroupBuffer | None
    seeds: SeedSource  # SeedCursor, or ReplaySeedSource with rollout.replay
    metrics_log: MetricsLog
    engine_model_dir: Path  # what the engine loaded: the SFT model, or the base model
    state: LoopState = field(default_factory=LoopState)
    phases: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    prior_wall_s: float = 0.0  # wall time of earlier processes of a resumed run
    ranks: RankGroup | None = None  # trainer ranks this process leads (rollhub.trainer.distributed)

    def wall_s(self) -> float:
        return self.prior_wall_s + time.perf_counter() - self.started

    def save(self, state: LoopState) -> None:
        """Checkpoint the loop; also records how long trajectories.jsonl is now, so that a resume
        cuts the lines of groups it will generate again (`restore`)."""
        from rollhub.rollout.trajectory_log import log_size

        state.wall_s = self.wall_s()
        rollout_state = {
            "next_seed": self.seeds.next_seed,
            "seed_source": self.seeds.state_dict(),  # with replay also its pool, counts and draws
            "buffer": self.buffer.state_dict() if self.buffer else None,
            "trajectories_bytes": log_size(self.run_dir / RUN_TRAJECTORY_LOG),
        }
        # with ranks: every rank's shard gathered into the full state, on this rank (rank 0)
        model_state, optimizer_state = self.ranks.checkpoint_state() if self.ranks else (None, None)
        moved_anchor = self.reference is not None and self.config.loss.reference_reset_every > 0
        save_checkpoint(
            self.run_dir,
            state.version,
            model=self.policy.model,
            optimizer=self.optimizer,
            trainer_state=state.as_dict(),
            rollout_state=rollout_state,
            keep_last=self.config.train.keep_checkpoints,
            model_state=model_state,
            optimizer_state=optimizer_state,
            reference_state=self.reference.model.state_dict() if moved_anchor else None,
        )


def _progress(enabled: bool):
    if not enabled:
        return contextlib.nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    )


def open_run_dir(config: RunConfig, *, resume: bool) -> Path | None:
    """Create the run folder, refuse to overwrite another run, and return the checkpoint to resume (if any).

    config.json is replaced atomically: `rollhub train --resume` reads it back, so a torn one
    would make the run unresumable. A run that starts from step 0 drops any trajectory log of
    an earlier attempt, as `run_training` does with the metrics, so no group is logged twice.
    """
    from rollhub.rollout.trajectory_log import truncate_log
    from rollhub.trainer.checkpoint import atomic_write_text

    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None and (run_dir / "metrics.jsonl").exists():
        logger.warning("no complete checkpoint in %s; starting the run over", run_dir)
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise UserError(
            f"{run_dir} already holds a run; pass --resume {run_dir} to continue it, or choose another run_dir"
        )
    atomic_write_text(run_dir / "config.json", json.dumps(config_to_dict(config), indent=2))
    if checkpoint is None:
        truncate_log(run_dir / RUN_TRAJECTORY_LOG, 0)
    return checkpoint


async def warm_start(config: RunConfig, policy: Policy, sft_dir: Path, *, print_fn: Callable[[str], None]) -> float:
    """SFT on scripted-expert demos, saved to `sft_dir`; returns its wall time.

    The model folder is saved atomically (`Policy.save_pretrained`), and `SFT_DONE_FILE` is
    written after it: `run_training` trusts the SFT model only when that marker exists. An
    interrupted SFT is redone from scratch, so its metrics log starts empty too.
    """
    from rollhub.trainer.checkpoint import atomic_write_text

    started = time.perf_counter()
    demos, history = await fine_tune_on_demos(config, policy, sft_dir.parent)
    policy.save_pretrained(sft_dir)
    wall = time.perf_counter() - started
    done = {"demos": len(demos), "steps": len(history), "final_loss": history[-1]["sft/loss"], "wall_s": wall}
    atomic_write_text(sft_dir.parent / SFT_DONE_FILE, json.dumps(done))
    print_fn(
        f"SFT warm-start: {len(demos)} demos, {len(history)} steps, "
        f"final loss {history[-1]['sft/loss']:.3f} ({wall:.0f}s)"
    )
    return wall


def sft_finished(run_dir: Path) -> bool:
    """Whether `run_dir` holds a finished SFT model: its marker is written only after the folder is whole."""
    return (run_dir / SFT_DONE_FILE).is_file() and (run_dir / SFT_MODEL_DIR / "config.json").is_file()


def sft_model_ready(run_dir: Path) -> bool:
    """`sft_finished`, and when it is not, remove what a killed SFT left, so SFT is redone on a clean slate."""
    if sft_finished(run_dir):
        return True
    sft_dir = run_dir / SFT_MODEL_DIR
    if sft_dir.exists():
        logger.warning("%s has no %s (its save was interrupted): removing it and redoing SFT", sft_dir, SFT_DONE_FILE)
        shutil.rmtree(sft_dir)
    (run_dir / SFT_DONE_FILE).unlink(missing_ok=True)
    return False


async def restore(run: Run, checkpoint: Path, *, print_fn: Callable[[str], None]) -> None:
    """Trainer, optimizer, seed cursor, buffer and logs as they were at `checkpoint`.

    Both logs are cut back to the checkpoint: metrics by step, trajectories.jsonl to the length
    the checkpoint recorded (the groups after it are generated again from the restored seed cursor).
    """
    from rollhub.rollout.trajectory_log import truncate_log

    if run.ranks is not None:  # the full state read here, sharded onto every rank (any world size)
        payload = read_checkpoint(checkpoint)
        run.ranks.load_state(payload["model"], payload["optimizer"])
        set_rng_state(payload["rng"])
    else:
        payload = load_checkpoint(checkpoint, model=run.policy.model, optimizer=run.optimizer)
    run.state = LoopState(**payload["trainer"])
    run.prior_wall_s = run.state.wall_s
    if run.reference is not None and payload.get("reference") is not None:  # a reset KL anchor
        if run.ranks is not None:
            run.ranks.load_reference(payload["reference"])
        else:
            run.reference.model.load_state_dict(payload["reference"])
    # checkpoints from before seed sources hold next_seed alone (replay then starts on an empty pool)
    saved = payload["rollout"]
    run.seeds.load_state_dict(
        {"next_seed": saved.get("next_seed", run.seeds.next_seed), **(saved.get("seed_source") or {})}
    )
    if run.buffer is not None and payload["rollout"].get("buffer"):
        run.buffer.load_state_dict(payload["rollout"]["buffer"])
    run.metrics_log.truncate_after(run.state.version)
    if payload["rollout"].get("trajectories_bytes") is not None:
        truncate_log(run.run_dir / RUN_TRAJECTORY_LOG, payload["rollout"]["trajectories_bytes"])
    await run.engine.update_weights(run.policy.engine_state_dict(), run.state.version)
    print_fn(f"resumed {run.run_dir} at step {run.state.version}")
    warm = run.run_dir / WARMSTART_FILE
    if warm.exists():
        run.state.warmstart_success = json.loads(warm.read_text()).get("success_rate", run.state.warmstart_success)


async def evaluate(run: Run, label: str, *, greedy: bool = False) -> EvalResult:
    """Success on the held-out seeds with the current weights (timed under `eval_{label}_s`);
    greedy: one episode per seed at T = 0 (eval.greedy)."""
    config = run.config
    started = time.perf_counter()
    if run.engine.weight_version != run.state.version:  # cluster.backend=ray pushes to remote engines only
        await run.engine.update_weights(run.policy.engine_state_dict(), run.state.version)
    result = await evaluate_held_out(run.engine, run.policy.tokenizer, config, greedy=greedy)
    key = f"eval_{label}_s"
    run.phases[key] = run.phases.get(key, 0.0) + time.perf_counter() - started
    return result


async def validate(run: Run, selector: CheckpointSelector, step: int, *, force: bool = False) -> dict[str, float]:
    """eval.select: score the current weights on the validation seeds when due; keep the best."""
    if not (force or selector.due(step)):
        return {}
    started = time.perf_counter()
    if run.engine.weight_version != run.state.version:
        await run.engine.update_weights(run.policy.engine_state_dict(), run.state.version)
    result = await selector.score(run.engine, run.policy.tokenizer)
    selector.consider(step, result, run.policy)
    run.phases["select_s"] = run.phases.get("select_s", 0.0) + time.perf_counter() - started
    return selector.metrics(result)


async def finish(run: Run, selector: CheckpointSelector | None) -> tuple[EvalResult, EvalResult | None, int | None]:
    """The final held-out evaluation and final_model/: the last step's policy, or with
    eval.select the best one on the validation seeds (then the last one is scored too).
    Returns (final, last step's result if another policy was picked, the picked step)."""
    state, final_dir = run.state, run.run_dir / "final_model"
    final = await evaluate(run, "final")
    if selector is not None:
        if selector.last is None or selector.last.step != state.version:
            run.metrics_log.log(state.version, await validate(run, selector, state.version, force=True))
        best = selector.best
        if best is not None and best.step != state.version:
            await run.engine.update_weights(selector.best_state_dict(), state.version)
            selected = await evaluate(run, "selected")
            selector.hand_over(final_dir)
            return selected, final, best.step
    run.policy.save_pretrained(final_dir)
    return final, None, (state.version if selector is not None else None)


async def evaluate_warm_start(run: Run, *, print_fn: Callable[[str], None]) -> EvalResult:
    result = await evaluate(run, "warmstart")
    greedy = await evaluate(run, "warmstart_greedy", greedy=True) if run.config.eval.greedy_reading else None
    run.state.warmstart_success = result.success_rate
    record = result.metrics(prefix="") | _greedy_metrics(greedy, prefix="")
    (run.run_dir / WARMSTART_FILE).write_text(json.dumps(record))
    run.metrics_log.log(0, {**result.metrics(), **_greedy_metrics(greedy), "policy/version": 0})
    print_fn(f"warm-start success on {run.config.eval.label}: {100 * result.success_rate:.1f}%")
    if greedy is not None:
        print_fn(f"warm-start success on {run.config.eval.greedy_label}: {100 * greedy.success_rate:.1f}%")
    return result


def _greedy_metrics(greedy: EvalResult | None, prefix: str = "eval/") -> dict[str, float]:
    return {} if greedy is None else {f"{prefix}greedy_success_rate": greedy.success_rate}


def _warmstart_greedy(run_dir: Path) -> float | None:
    """The warm-start's greedy reading, also after a resume (it lives in warmstart.json)."""
    warm = run_dir / WARMSTART_FILE
    return json.loads(warm.read_text()).get("greedy_success_rate") if warm.exists() else None


async def reinforce(run: Run, *, progress: bool, selector: CheckpointSelector | None = None) -> None:
    """The RL phase: start the rollout source, run `rl_loop`, stop everything it started."""
    config = run.config
    deadline = job_deadline(run)
    if deadline is not None and time.perf_counter() > deadline:  # before any rollout worker starts
        logger.warning(
            "no RL: the warm-start used up train.max_job_wall_s=%s (%.0f s so far)",
            config.train.max_job_wall_s,
            run.wall_s(),
        )
        return
    rollout = build_rollout(
        config,
        run.engine,
        run.policy.tokenizer,
        model_dir=run.engine_model_dir,
        buffer=run.buffer,
        seeds=run.seeds,
        run_dir=run.run_dir,
    )
    if config.cluster.backend == "ray" and run.state.version:  # fresh remote engines load the base weights
        await rollout.update_weights(run.policy.engine_state_dict(), run.state.version)
    stop = asyncio.Event()
    producer = None if run.buffer is None else asyncio.ensure_future(rollout.run(stop))
    started = time.perf_counter()
    with _progress(progress) as bar:
        task = (
            bar.add_task("RL", total=config.train.steps, completed=run.state.version, info="")
            if bar is not None
            else None
        )

        def on_step(step: int, record: dict[str, Any]) -> None:
            if bar is not None:
                info = f"success {record.get('train/success_rate', 0):.2f}  idle {record['trainer/idle_fraction']:.2f}"
                bar.update(task, completed=step, info=info)
            logger.info("step %d: %s", step, {k: v for k, v in record.items() if isinstance(v, float)})

        try:
            await rl_loop(
                config,
                run.policy,
                run.optimizer,
                rollout,
                run.buffer,
                run.state,
                run.metrics_log,
                save=run.save,
                on_step=on_step,
                evaluate=lambda: evaluate(run, "periodic"),
                validate=None if selector is None else (lambda step: validate(run, selector, step)),
                reference=run.reference,
                update=run.ranks.ppo_update if run.ranks is not None else ppo_update,
                seeds=run.seeds,
                reset_reference=_reference_resetter(run),
                deadline=deadline,
            )
        finally:
            stop.set()
            if producer is not None:
                await asyncio.gather(producer, return_exceptions=True)
            await rollout.close()
    run.phases["rl_s"] = time.perf_counter() - started
    every = config.train.checkpoint_every
    if run.state.version and (not every or run.state.version % every):
        run.save(run.state)


def final_reserve_s(phases: dict[str, float]) -> float:
    """What the final readings will cost, from the warm-start's: the held-out reading twice (the
    last step and, with eval.select, the picked one), one validation reading and the greedy one.
    A trained policy solves rooms in fewer turns than its warm-start, so this errs long."""
    return (
        2 * phases.get("eval_warmstart_s", 0.0)
        + phases.get("eval_warmstart_greedy_s", 0.0)
        + phases.get("select_s", 0.0)
    )


def job_deadline(run: Run) -> float | None:
    """The `time.perf_counter()` reading after which RL must stop for the job to end within
    train.max_job_wall_s (earlier processes of a resumed run count too); None without one."""
    budget = run.config.train.max_job_wall_s
    if budget is None:
        return None
    return run.started + budget - run.prior_wall_s - run.state.final_reserve_s


def report(
    run: Run,
    warmstart: EvalResult | None,
    final: EvalResult,
    *,
    print_fn: Callable[[str], None],
    last: EvalResult | None = None,
    selected_step: int | None = None,
    final_greedy: EvalResult | None = None,
) -> TrainingSummary:
    """summary.json, the learning curve and the before/after lines."""
    config, state = run.config, run.state
    wall = run.wall_s()  # a resumed run counts its earlier processes too
    before = state.warmstart_success if warmstart is None else warmstart.success_rate
    records = read_jsonl(run.run_dir / "metrics.jsonl")
    title = f"{config.env.id}: {config.algorithm.estimator}, alpha={config.rollout.async_ratio}"
    plot_learning_curve(records, run.run_dir / "learning_curve.png", title=title)
    summary = {
        "warmstart_success_rate": before,
        "final_success_rate": final.success_rate,
        "eval_seeds": config.eval.episodes,
        "eval_samples_per_seed": config.eval.samples_per_seed,
        "steps": state.version,
        "selected_step": selected_step,  # eval.select: the step whose weights are final_model
        "last_step_success_rate": (last or final).success_rate,
        "warmstart_greedy_success_rate": _warmstart_greedy(run.run_dir) if final_greedy is not None else None,
        "final_greedy_success_rate": None if final_greedy is None else final_greedy.success_rate,
        "wall_s": wall,
        "phases_s": run.phases,
    }
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if before is not None:
        print_fn(
            f"warm-start success: {100 * before:.1f}%  ->  final success: {100 * final.success_rate:.1f}%  "
            f"({final.success_rate - before:+.1%} on {config.eval.label}, "
            f"{state.version} RL steps, {wall / 60:.1f} min)"
        )
    else:
        print_fn(f"final success: {100 * final.success_rate:.1f}% ({state.version} RL steps, {wall / 60:.1f} min)")
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
    return TrainingSummary(run.run_dir, warmstart, final, state.version, wall, run.phases, last, selected_step)


async def run_training(
    config: RunConfig,
    *,
    resume: bool = False,
    progress: bool = True,
    print_fn: Callable[[str], None] = print,
    ranks: RankGroup | None = None,
) -> TrainingSummary:
    """The whole job (see module docstring). Returns warm-start and final evaluations.

    `ranks`: this process is rank 0 of a group of trainer ranks (rollhub.trainer.distributed);
    everything but the tensor work of the policy (updates, weight gathers, checkpoints) stays here.
    """
    job_started = time.perf_counter()
    torch.set_num_threads(config.model.threads)
    check_run_envs(config)  # both envs' names and types, and train/eval overlap, before the model loads
    if config.cluster.backend == "ray":  # fail before the warm-start, not after it
        from rollhub.rollout.cluster.backend import import_ray

        import_ray()
    checkpoint = open_run_dir(config, resume=resume)
    run_dir = Path(config.run_dir)
    seed_everything(config.seed)

    # 1. prepare: the policy starts from a finished SFT model when there is one
    phases: dict[str, float] = {}
    t = time.perf_counter()
    model_dir = ensure_model(config)
    sft_dir = run_dir / SFT_MODEL_DIR
    sft_done = config.sft.enabled and sft_model_ready(run_dir)  # a half-written sft_model/ is removed
    if ranks is not None and checkpoint is None and config.sft.enabled and not sft_done:
        # trainer ranks: the SFT warm-start runs on rank 0 alone, on an unsharded policy (the
        # other ranks wait for `start`); the sharded policy then loads the SFT model
        unsharded = dataclasses.replace(config, model=dataclasses.replace(config.model, fsdp=False))
        phases["sft_s"] = await warm_start(config, build_policy(unsharded, model_dir), sft_dir, print_fn=print_fn)
        sft_done = True
    policy = build_policy(config if ranks is None else sharded_config(config), sft_dir if sft_done else model_dir)
    phases["prepare_s"] = time.perf_counter() - t
    metrics_log = MetricsLog(run_dir)

    # 2. warm-start (skipped when resuming an RL checkpoint or a finished SFT)
    if checkpoint is None:
        metrics_log.truncate_after(-1)  # a resume without a complete checkpoint starts over
        if config.sft.enabled and not sft_done:
            phases["sft_s"] = await warm_start(config, policy, sft_dir, print_fn=print_fn)
    engine_model_dir = sft_dir if (config.sft.enabled and sft_finished(run_dir)) else model_dir
    engine = build_engine(config, engine_model_dir)
    optimizer = build_optimizer(policy, config)
    reference = build_reference(config, engine_model_dir, policy)  # the KL anchor: the warm-start, frozen
    if ranks is not None:  # the other ranks build their shards of the same model now
        ranks.start({"model_dir": str(sft_dir if sft_done else model_dir), "reference_dir": str(engine_model_dir)})
        ranks.attach(policy, optimizer, reference)
    run = Run(
        config=config,
        run_dir=run_dir,
        policy=policy,
        optimizer=optimizer,
        engine=engine,
        reference=reference,
        buffer=build_buffer(config),
        seeds=build_seeds(config),
        metrics_log=metrics_log,
        engine_model_dir=engine_model_dir,
        phases=phases,
        started=job_started,
        ranks=ranks,
    )
    if checkpoint is not None:
        await restore(run, checkpoint, print_fn=print_fn)
    selector = (
        CheckpointSelector(config, run_dir, resumed_at=run.state.version if checkpoint is not None else None)
        if config.eval.select.enabled
        else None
    )

    warmstart: EvalResult | None = None
    try:
        await start_engine(run.engine)  # launched servers up and ready before the first evaluation
        if checkpoint is None:
            warmstart = await evaluate_warm_start(run, print_fn=print_fn)
            if selector is not None:  # the warm-start is a candidate too: RL that only hurts hands it back
                metrics_log.log(0, await validate(run, selector, 0, force=True))
            run.state.final_reserve_s = final_reserve_s(run.phases)
        # 3. RL
        await reinforce(run, progress=progress, selector=selector)
        # 4. final evaluation on the same held-out seeds (of the policy eval.select picked, if on)
        final, last, selected_step = await finish(run, selector)
        # the engine holds the final policy's weights (the picked one's with eval.select)
        final_greedy = await evaluate(run, "final_greedy", greedy=True) if config.eval.greedy_reading else None
        if last is None:
            record = {**final.metrics(), **_greedy_metrics(final_greedy)}
        else:  # the curve's point at the last step is the last step's policy; the picked one is final/
            picked = {**final.metrics(prefix="final/"), **_greedy_metrics(final_greedy, prefix="final/")}
            record = {**last.metrics(), **picked, "final/selected_step": selected_step}
        metrics_log.log(run.state.version, {**record, "policy/version": run.state.version})
    finally:
        await run.engine.close()
        metrics_log.close()
    return report(
        run, warmstart, final, print_fn=print_fn, last=last, selected_step=selected_step, final_greedy=final_greedy
    )
