"""The training job's `Learner` (rollhub.trainer.rl_loop): advantages, then one update of the policy.

The tensor work runs in one compute thread (rollhub.trainer.worker), off the event loop, so
envs keep stepping while the trainer computes. Besides the update a step counts batches that
cannot teach anything: consecutive all-failed ones stop the run (rollout.max_failed_batches),
empty ones are counted, and a batch whose groups all scored alike warns of a collapse.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

import torch

from rollhub.rollout.types import Group, RolloutFailureError
from rollhub.trainer.batch import batch_failed, build_training_batch
from rollhub.trainer.config import RunConfig
from rollhub.trainer.policy import Policy
from rollhub.trainer.step_metrics import batch_reward_metrics
from rollhub.trainer.update import ppo_update
from rollhub.trainer.worker import ComputeThread

logger = logging.getLogger(__name__)


class PolicyLearner:
    """`update` is `ppo_update`, or with trainer ranks `RankGroup.ppo_update` (the same step, data
    parallel: rollhub.trainer.ranks). `reference` is the frozen warm-start of the KL term
    (loss.kl_coef > 0)."""

    def __init__(
        self,
        config: RunConfig,
        policy: Policy,
        optimizer: torch.optim.Optimizer,
        *,
        reference: Policy | None = None,
        update: Callable[..., dict[str, Any]] = ppo_update,
    ) -> None:
        self.config, self.policy, self.optimizer = config, policy, optimizer
        self.reference, self.update = reference, update
        self.compute = ComputeThread()  # one thread, one malloc arena (rollhub/trainer/worker.py)
        self.failed_batches = 0  # consecutive batches in which every trajectory failed (not checkpointed)
        self.empty_batches = 0  # batches with nothing to train on, since this process started
        self.first_format_errors: float | None = None  # the collapse warning's baseline
        self.had_signal = False  # a group of an earlier step scored unalike: the policy can do the task

    async def step(self, groups: list[Group], version: int) -> dict[str, Any]:
        """Raises RolloutFailureError when every trajectory failed in rollout.max_failed_batches
        consecutive batches, instead of training on nothing."""
        config = self.config
        # advantages per group, broadcast to response tokens
        batch, stats = build_training_batch(
            groups, self.policy.tokenizer.pad_token_id, config.algorithm, loss=config.loss
        )
        self.failed_batches = self.failed_batches + 1 if batch_failed(groups, stats) else 0
        if config.rollout.max_failed_batches and self.failed_batches >= config.rollout.max_failed_batches:
            raise failed_batches_error(groups, self.failed_batches, config)

        # proximal log-probs, loss, optimizer step (off the event loop: envs keep stepping)
        step_metrics: dict[str, Any] = {}
        if batch is not None:
            set_lr(self.optimizer, config, version)
            o = config.optim
            step_metrics = await self.compute.run(
                self.update,
                self.policy,
                self.optimizer,
                batch,
                config.loss,
                minibatches=o.minibatches,
                epochs=o.epochs,
                max_grad_norm=o.max_grad_norm,
                seed=config.seed * 1_000_003 + version,
                reference=self.reference,
                pack_tokens=o.pack_tokens,
            )
            step_metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        else:
            # routine for a strong policy (every group all-success): warn once, count the rest
            self.empty_batches += 1
            (logger.warning if self.empty_batches == 1 else logger.debug)(
                "step %d: nothing to train on in the batch (every group or sequence filtered out, "
                "e.g. all advantages 0); skipping the update (later ones: batch/empty_batches in the metrics)",
                version + 1,
            )
        del batch

        record: dict[str, Any] = {
            **batch_reward_metrics(groups),
            **{f"train/{k}": v for k, v in step_metrics.items()},
            "batch/groups": stats.groups,
            "batch/sequences": stats.sequences,
            "batch/dropped_zero_advantage_sequences": stats.dropped_sequences,
            "batch/excluded_trajectories": stats.excluded_trajectories,
            "batch/groups_without_baseline": stats.groups_without_baseline,
            "batch/consecutive_failed": self.failed_batches,
            "batch/empty_batches": self.empty_batches,
            "batch/zero_advantage_groups": stats.zero_advantage_groups,
            "gigpo/singleton_anchor_fraction": stats.singleton_anchor_fraction,
            "gigpo/mean_step_group_size": stats.mean_step_group_size,
        }
        if self.first_format_errors is None and "train/format_error_rate" in record:
            self.first_format_errors = record["train/format_error_rate"]
        warning = collapse_warning(
            record,
            trained=bool(step_metrics),
            start_format_errors=self.first_format_errors,
            had_signal=self.had_signal,
        )
        if warning:
            logger.warning("step %d: %s", version + 1, warning)
        self.had_signal = self.had_signal or stats.zero_advantage_groups < stats.groups
        return record

    async def weights(self) -> dict[str, torch.Tensor]:
        """The full state dict for the engine (gathered from every rank with ranks)."""
        return await self.compute.run(self.policy.engine_state_dict)

    def close(self) -> None:
        self.compute.close()


def set_lr(optimizer: torch.optim.Optimizer, config: RunConfig, version: int) -> None:
    """Linear warm-up over `warmup_steps`, then linear decay to lr * lr_end_factor at the last step."""
    o = config.optim
    factor = min(1.0, (version + 1) / o.warmup_steps) if o.warmup_steps > 0 else 1.0
    span = max(config.train.steps - 1, 1)
    factor *= 1.0 - (1.0 - o.lr_end_factor) * min(version / span, 1.0)
    for group in optimizer.param_groups:
        group["lr"] = config.optim.lr * factor


def failed_batches_error(groups: list[Group], failed: int, config: RunConfig) -> RolloutFailureError:
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


def collapse_warning(
    record: dict[str, Any],
    *,
    trained: bool = True,
    start_format_errors: float | None = None,
    had_signal: bool = False,
) -> str | None:
    """A hint when a step's batch can no longer teach anything: every group scored alike.

    A policy that collapsed into format errors earns all-zero rewards, hence all-zero
    advantages, and never recovers on its own; say so instead of training on silently.
    `start_format_errors` is the rate of the process's first RL step: a policy that made as
    many format errors from the start has not collapsed (it was never taught the format), unless
    `had_signal`: an earlier step of the process had a group that scored unalike, so the policy
    has succeeded in that format, and a batch of hard tasks all failed is no sign it cannot.
    """
    groups = record.get("batch/groups") or 0
    if not groups or record.get("batch/zero_advantage_groups", 0) < groups:
        return None
    format_errors = record.get("train/format_error_rate", 0.0)
    never_learnt = start_format_errors is not None and format_errors < start_format_errors + 0.25
    if format_errors >= 0.5 and never_learnt and not had_signal:
        return (
            f"every group has zero advantage and {format_errors:.0%} of turns are format errors, as from the "
            f"first step ({start_format_errors:.0%}): the policy does not know the answer format; warm-start it "
            "(sft.enabled) or show the format in the prompt"
        )
    if format_errors >= 0.5 and not never_learnt:
        return (
            f"every group has zero advantage and {format_errors:.0%} of turns are format errors: the policy has "
            "collapsed; resume from an earlier checkpoint with a lower optim.lr, or add loss.kl_coef"
        )
    if not trained:  # the loop already warned that it skipped the update
        return None
    return "every group has zero advantage (all samples of each task scored alike): this step taught nothing"
