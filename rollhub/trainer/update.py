"""A training step: its plan (`StepPlan`), and the optimizer steps that run it.

`plan_step` decides, once per batch, what the step runs: the rows of each PPO mini-batch
(one optimizer step each), the micro-batches of each, and where the proximal log-probs
come from. The single process runs that plan (`run_step`); trainer ranks shard the same
plan across ranks (rollhub.trainer.ranks), so the two cannot decide differently.

Every micro-batch's loss is normalised by the token/sequence counts of the WHOLE batch
(`BatchNormaliser`), so the accumulated gradient is exactly the full-batch gradient,
whatever the micro-batch size.

A step whose loss or gradient is not finite (a NaN/inf advantage, an overflow) is skipped:
one such step would write NaN into every weight and into Adam's moments, and every later
checkpoint would carry them. The gradients are dropped, the optimizer is not stepped (its
state stays as it was), a warning says so, and the step reports `skipped_nonfinite`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rollhub.trainer.losses import BatchNormaliser, LossConfig, full_kl, policy_loss
from rollhub.trainer.packing import (
    plan_packed_micro_batches,
    plan_padded_micro_batches,
    prompt_split,
    sequence_lengths,
)
from rollhub.trainer.policy import Policy, TokenBatch, response_positions

logger = logging.getLogger(__name__)


def policy_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    prox_logprobs: torch.Tensor | None,
    loss_config: LossConfig,
    *,
    max_grad_norm: float | None = 1.0,
    reference_logprobs: torch.Tensor | None = None,
    reference: Policy | None = None,
    normaliser: BatchNormaliser | None = None,
    pack_tokens: int | None = None,
    logprobs_out: torch.Tensor | None = None,
    logprobs_rows: torch.Tensor | None = None,
    micro_batches: list[list[int]] | None = None,
) -> dict[str, float]:
    """Compute the loss over `batch` in micro-batches, accumulate gradients, step once.

    With loss_config.kl_estimator "full", `reference` (a frozen policy) gives its whole
    next-token distribution at each response position of each micro-batch, and the KL
    term is exact; "k3" and "k2" use the precomputed sampled-token `reference_logprobs`.

    `prox_logprobs=None` means the proximal policy IS the current weights (one optimizer
    step per batch): the update's own forward pass, detached, serves as pi_prox, which
    saves the separate no-grad pass over the batch (a third of the trainer's compute).

    `normaliser`, when given, replaces the one counted from `batch` alone: a data-parallel
    rank passes the token/sequence counts of the whole step over all ranks, so that the
    gradients the ranks reduce add up to the full-batch gradient.

    `pack_tokens`: micro-batches are packed to that many tokens (rollhub.trainer.packing)
    instead of `policy.micro_batch_size` right-padded rows; the loss, its masks and the
    normaliser are the same, so the gradient is the same up to float rounding.

    `micro_batches`: the rows of `batch` in each micro-batch, as the step's plan laid them out
    (`micro_batch_rows`; None plans them here the same way). Padded micro-batches are runs of
    consecutive rows. Trainer ranks pass packed plans padded with empty rows to the count every
    rank runs, since FSDP2 gathers the parameters in every forward and a rank that ran fewer
    would leave the others waiting.

    `logprobs_out` (with `logprobs_rows`, the rows of a larger batch that `batch` holds)
    receives the detached log-probs of this forward, i.e. pi at the weights before the step:
    PPO epochs reuse them as the proximal policy instead of a separate pass.

    The result also holds the step's time split (`split/*_s`: reference, forward, loss,
    backward, optimizer), measured with wall clocks around each phase.
    """
    if normaliser is None:
        normaliser = BatchNormaliser.from_mask(batch.response_mask)
    optimizer.zero_grad(set_to_none=True)
    total_loss = 0.0
    weighted: dict[str, float] = {}
    weights: dict[str, float] = {}
    split = dict.fromkeys(SPLIT_KEYS[1:], 0.0)
    with_entropy = loss_config.entropy_coef != 0
    exact_kl = loss_config.kl_coef > 0 and loss_config.kl_estimator == "full"
    if exact_kl and reference is None:
        raise ValueError("loss.kl_estimator 'full' needs the reference policy")
    packed = pack_tokens is not None
    plan = (
        micro_batches
        if micro_batches is not None
        else micro_batch_rows(sequence_lengths(batch.attention_mask), pack_tokens, policy.micro_batch_size)
    )
    clock = PhaseClock(policy.device)
    # the opening every row shares runs once for all micro-batches (rollhub.trainer.prefix_kv)
    prefix = None if packed else policy.prefix_kv(batch)
    clock.lap(split, "split/forward_s")
    for group in plan:
        if packed:
            index: slice | torch.Tensor = torch.as_tensor(group, dtype=torch.long)
            part = batch.select(index).to(policy.device)
        else:
            index = slice(group[0], group[-1] + 1)
            part = batch.slice(index.start, index.stop).to(policy.device)
        width = part.input_ids.shape[1]
        reference_part = reference_logprobs[index, :width].to(policy.device) if reference_logprobs is not None else None
        kl_tokens = None
        clock.restart()
        if exact_kl:
            with torch.no_grad():
                reference_full = reference.token_logprobs(part, with_full=True, packed=packed)[2]
            clock.lap(split, "split/reference_s")
            logp, entropy, full = policy.token_logprobs(
                part, with_entropy=with_entropy, with_full=True, packed=packed, prefix=prefix
            )
            rows, cols = response_positions(part)
            kl_tokens = torch.zeros_like(logp).index_put((rows, cols + 1), full_kl(full, reference_full))
        else:
            logp, entropy = policy.token_logprobs(part, with_entropy=with_entropy, packed=packed, prefix=prefix)
        clock.lap(split, "split/forward_s")
        prox = logp.detach() if prox_logprobs is None else prox_logprobs[index, :width].to(policy.device)
        if logprobs_out is not None:
            targets = index if logprobs_rows is None else logprobs_rows[index]
            logprobs_out[targets, :width] = logp.detach().float().cpu()
        loss, metrics = policy_loss(
            logp,
            prox,
            part.behaviour_logprobs,
            part.advantages,
            part.response_mask,
            loss_config,
            normaliser=normaliser,
            reference_logp=reference_part,
            entropy=entropy,
            kl_tokens=kl_tokens,
        )
        clock.lap(split, "split/loss_s")
        loss.backward()
        clock.lap(split, "split/backward_s")
        total_loss += float(loss.detach())
        tokens = float(part.response_mask.sum())
        for key, value in metrics.items():
            weighted[key] = weighted.get(key, 0.0) + value * tokens
            weights[key] = weights.get(key, 0.0) + tokens
    clock.restart()
    if prefix is not None:
        prefix.backward()
        clock.lap(split, "split/backward_s")
    grad_norm = _clip_and_norm(policy.parameters(), max_grad_norm)
    skipped = _step_if_finite(optimizer, total_loss, grad_norm, policy.device)
    clock.lap(split, "split/optimizer_s")
    out: dict[str, Any] = {key: weighted[key] / max(weights[key], 1e-12) for key in weighted}
    out["loss"] = total_loss
    out["grad_norm"] = grad_norm
    out["response_tokens"] = normaliser.num_tokens
    out["skipped_nonfinite"] = float(skipped)
    out["micro_batches"] = float(len(plan))
    out.update(split)
    return out


#: the phases of a step, in order (seconds, summed over micro-batches and PPO mini-batches)
SPLIT_KEYS = (
    "split/prox_s",  # the no-grad proximal pass (ppo_update)
    "split/reference_s",  # reference log-probs: exact-KL distributions per micro-batch, or the k3/k2 pass
    "split/forward_s",  # the policy's forward with gradient
    "split/loss_s",  # the loss and its metrics
    "split/backward_s",
    "split/optimizer_s",  # gradient clipping and the optimizer step
)


class PhaseClock:
    """Wall-clock laps of a step's phases, each added to its key of a split dict.

    On a CUDA device every reading first waits for the kernels queued there: they run
    asynchronously, so an unsynchronized forward would be billed to whichever later phase first
    waits (the loss's .item(), a copy to the host). `synchronize` is torch.cuda.synchronize
    unless given; the CPU runs synchronously and is never synchronized.
    """

    def __init__(self, device: str | torch.device, synchronize: Callable[[torch.device], Any] | None = None):
        target = torch.device(device)
        self._synchronize = None
        if target.type == "cuda":
            wait = synchronize if synchronize is not None else torch.cuda.synchronize
            self._synchronize = lambda: wait(target)
        self.since = self.now()

    def now(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return time.perf_counter()

    def restart(self) -> None:
        """Start the next phase here (the time since the last lap is billed to no phase)."""
        self.since = self.now()

    def lap(self, split: dict[str, float], key: str) -> float:
        """Add the time since the last reading to `split[key]`; the next phase starts now."""
        now = self.now()
        split[key] = split.get(key, 0.0) + now - self.since
        self.since = now
        return now


def _step_if_finite(optimizer: torch.optim.Optimizer, loss: float, grad_norm: float, device: str) -> bool:
    """Step the optimizer, unless the loss or gradient is NaN/inf; returns True when the step was skipped.

    A skipped step drops the gradients and leaves weights and optimizer state untouched: one
    NaN step would poison every weight and Adam moment, and every checkpoint after it.
    """
    if not _any_rank(not (math.isfinite(loss) and math.isfinite(grad_norm)), device):
        optimizer.step()
        return False
    optimizer.zero_grad(set_to_none=True)
    logger.warning(
        "non-finite loss %s or gradient norm %s: skipped this optimizer step (weights and optimizer "
        "state unchanged); check the batch's advantages and rewards",
        loss,
        grad_norm,
    )
    return True


def _any_rank(flag: bool, device: str | torch.device) -> bool:
    """`flag` on any process of the group: under FSDP every rank must skip or step together."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _clip_and_norm(parameters, max_grad_norm: float | None) -> float:
    """Clip to `max_grad_norm` and return the norm, over the trainable weights only: a frozen
    weight (optim.train_embeddings false) may still hold a gradient an earlier phase left, and
    counting it would shrink every real update by a norm the optimizer never applies."""
    params = [p for p in parameters if p.requires_grad and p.grad is not None]
    if not params:
        return 0.0
    limit = max_grad_norm if max_grad_norm is not None else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, limit))


def micro_batch_rows(lengths: Sequence[int], pack_tokens: int | None, micro_batch_size: int) -> list[list[int]]:
    """The rows of each micro-batch of rows of these lengths: packed to `pack_tokens` tokens, else
    runs of `micro_batch_size` consecutive rows (right-padded)."""
    if pack_tokens is not None:
        return plan_packed_micro_batches(lengths, pack_tokens)
    return plan_padded_micro_batches(len(lengths), micro_batch_size)


def minibatch_orders(
    batch: TokenBatch, *, minibatches: int, epochs: int, seed: int, pack_tokens: int | None = None
) -> list[list[Any]]:
    """Each epoch's mini-batch rows: a seeded shuffle, so a resumed run draws the same parts.

    With `pack_tokens` a prompt's rows stay in one mini-batch, so packing forwards it once.
    """
    generator = torch.Generator().manual_seed(seed)
    parts = min(minibatches, len(batch))
    if pack_tokens is not None:
        return [list(prompt_split(batch.input_ids, batch.response_mask, parts, generator)) for _ in range(epochs)]
    return [list(torch.randperm(len(batch), generator=generator).tensor_split(parts)) for _ in range(epochs)]


#: where a step's proximal log-probs (pi_prox) come from:
#:   behaviour        the engine's mu (loss.proximal "behaviour"): no pass, plain PPO against the sampler
#:   update           the update's own forward, detached: one mini-batch and one epoch, so pi_prox IS the
#:                    weights being optimised, and the separate pass would only repeat that forward
#:   recompute        a no-grad pass over every row with the weights at step start
#:   first_minibatch  packed, one process: the first mini-batch runs before any optimizer step, so its
#:                    own detached forward is pi_prox for its rows (kept for later epochs); the no-grad
#:                    pass covers only the other rows
ProximalSource = Literal["behaviour", "update", "recompute", "first_minibatch"]


@dataclass(frozen=True)
class StepPlan:
    """What one training step runs, decided once from the batch and the config (`plan_step`).

    The single process runs it (`run_step`); trainer ranks split every mini-batch of the same
    plan across ranks, so both draw the same mini-batches and take pi_prox from the same place.
    """

    orders: list[list[torch.Tensor]]  # per epoch, the batch rows of each mini-batch (one optimizer step each)
    micro_batches: list[
        list[list[int]]
    ]  # per mini-batch (epochs flattened), the rows of the mini-batch per micro-batch
    proximal: ProximalSource
    single: bool  # one mini-batch of every row, one epoch: the whole batch is one optimizer step
    pack_tokens: int | None  # micro-batches packed to this many tokens; None: right-padded rows
    micro_batch_size: int  # rows per padded micro-batch

    @property
    def parts(self) -> list[torch.Tensor]:
        """The mini-batches in the order they step, epochs one after the other."""
        return [rows for epoch in self.orders for rows in epoch]


def plan_step(
    batch: TokenBatch,
    loss_config: LossConfig,
    *,
    minibatches: int = 1,
    epochs: int = 1,
    seed: int = 0,
    pack_tokens: int | None = None,
    micro_batch_size: int = 8,
    ranks: bool = False,
) -> StepPlan:
    """The step's mini-batches, micro-batches and proximal source (see `StepPlan`).

    `ranks`: the plan is for trainer ranks (rollhub.trainer.ranks), which never take
    "first_minibatch": a rank's first mini-batch forward holds only its shard of the rows, so
    the ranks take a sharded no-grad pass instead.
    """
    if minibatches < 1 or epochs < 1:
        raise ValueError("minibatches and epochs must be >= 1")
    single = minibatches == 1 and epochs == 1
    if loss_config.proximal == "behaviour":
        proximal: ProximalSource = "behaviour"
    elif single:
        proximal = "update"
    elif pack_tokens is not None and not ranks:
        proximal = "first_minibatch"
    else:
        proximal = "recompute"
    if single:
        orders = [[torch.arange(len(batch))]]
    else:
        orders = minibatch_orders(batch, minibatches=minibatches, epochs=epochs, seed=seed, pack_tokens=pack_tokens)
    lengths = sequence_lengths(batch.attention_mask)
    micro_batches = [
        micro_batch_rows([lengths[row] for row in rows.tolist()], pack_tokens, micro_batch_size)
        for epoch in orders
        for rows in epoch
    ]
    return StepPlan(orders, micro_batches, proximal, single, pack_tokens, micro_batch_size)


def proximal_logprobs(
    plan: StepPlan, batch: TokenBatch, recompute: Callable[[TokenBatch], torch.Tensor]
) -> torch.Tensor | None:
    """pi_prox of every row of `batch` from where `plan` takes it (None: the update's own forward).

    `recompute` scores rows with the weights at step start (the one process's no-grad pass, or
    the ranks' sharded one). With "first_minibatch" the first mini-batch's rows stay 0 here: its
    update fills them in (`policy_update`'s `logprobs_out`).
    """
    if plan.proximal == "behaviour":
        # the decoupled weight min(prox/mu, C) is 1 and the clip is plain PPO's
        return batch.behaviour_logprobs * batch.response_mask
    if plan.proximal == "update":
        return None
    if plan.proximal == "recompute":
        return recompute(batch)
    prox = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    rest = torch.ones(len(batch), dtype=torch.bool)
    rest[plan.parts[0]] = False
    if bool(rest.any()):
        rest_rows = rest.nonzero(as_tuple=True)[0]
        rest_prox = recompute(batch.select(rest_rows))
        prox[rest_rows, : rest_prox.shape[1]] = rest_prox
    return prox


def ppo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    loss_config: LossConfig,
    *,
    minibatches: int = 1,
    epochs: int = 1,
    max_grad_norm: float | None = 1.0,
    seed: int = 0,
    reference: Policy | None = None,
    normaliser: BatchNormaliser | Callable[[TokenBatch], BatchNormaliser] | None = None,
    pack_tokens: int | None = None,
) -> dict[str, float]:
    """PPO's inner loop: `epochs` passes over the batch in `minibatches` shuffled parts.

    Each part is one optimizer step, so one batch of rollouts buys `epochs * minibatches`
    updates for the price of one proximal pass plus `epochs` gradient passes; the clip on
    pi_theta / pi_prox is what keeps the later steps near the policy that was pushed.
    With one part and one epoch this is exactly `policy_update` without a proximal pass.
    `loss_config.proximal == "behaviour"` skips the proximal pass and clips against mu.
    The shuffle is seeded (by the caller, per step) so a resumed run draws the same parts.
    `reference` (a frozen policy, needed when loss_config.kl_coef > 0) supplies the
    log-probs of the KL term.

    `normaliser` (data parallel): a `BatchNormaliser` of the whole step over all ranks (one
    part and one epoch only), or a function that gives the normaliser of each mini-batch
    (e.g. one that all-reduces its counts); None counts each part locally.

    `pack_tokens` packs every forward pass of the step (proximal, reference, update) to that
    many tokens per micro-batch (rollhub.trainer.packing), and the mini-batches keep the rows
    of one prompt together (`prompt_split`), so a shared prompt runs once; the first
    mini-batch serves as its own proximal pass ("first_minibatch" of `ProximalSource`).
    """
    plan = plan_step(
        batch,
        loss_config,
        minibatches=minibatches,
        epochs=epochs,
        seed=seed,
        pack_tokens=pack_tokens,
        micro_batch_size=policy.micro_batch_size,
    )
    return run_step(
        policy,
        optimizer,
        batch,
        plan,
        loss_config,
        max_grad_norm=max_grad_norm,
        reference=reference,
        normaliser=normaliser,
    )


def run_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    plan: StepPlan,
    loss_config: LossConfig,
    *,
    max_grad_norm: float | None = 1.0,
    reference: Policy | None = None,
    normaliser: BatchNormaliser | Callable[[TokenBatch], BatchNormaliser] | None = None,
) -> dict[str, float]:
    """Run `plan` in this process: the reference and proximal passes, then one `policy_update` per mini-batch."""
    if isinstance(normaliser, BatchNormaliser) and not plan.single:
        raise ValueError("a fixed BatchNormaliser covers one part; pass a function of the mini-batch instead")
    if loss_config.kl_coef > 0 and reference is None:
        raise ValueError("loss.kl_coef > 0 needs a reference policy")
    pack_tokens = plan.pack_tokens
    sampled_kl = loss_config.kl_coef > 0 and loss_config.kl_estimator != "full"
    clock, timed = PhaseClock(policy.device), {"reference_s": 0.0, "prox_s": 0.0}
    ref = reference.compute_logprobs(batch, pack_tokens=pack_tokens) if sampled_kl and reference is not None else None
    clock.lap(timed, "reference_s")
    reference_s = timed["reference_s"]
    if plan.single:
        out = policy_update(
            policy,
            optimizer,
            batch,
            proximal_logprobs(plan, batch, lambda rows: policy.compute_logprobs(rows, pack_tokens=pack_tokens)),
            loss_config,
            max_grad_norm=max_grad_norm,
            reference_logprobs=ref,
            reference=reference,
            normaliser=normaliser(batch) if callable(normaliser) else normaliser,
            pack_tokens=pack_tokens,
            micro_batches=plan.micro_batches[0],
        )
        out["optimizer_steps"] = 1.0 - out["skipped_nonfinite"]
        out["split/prox_s"] = 0.0
        out["split/reference_s"] += reference_s
        return out
    clock.restart()
    prox = proximal_logprobs(plan, batch, lambda rows: policy.compute_logprobs(rows, pack_tokens=pack_tokens))
    clock.lap(timed, "prox_s")
    prox_s = timed["prox_s"]
    results = []
    for number, (rows, micro_batches) in enumerate(zip(plan.parts, plan.micro_batches)):
        part = batch.select(rows)
        own_prox = plan.proximal == "first_minibatch" and number == 0
        results.append(
            policy_update(
                policy,
                optimizer,
                part,
                None if own_prox else prox[rows],
                loss_config,
                max_grad_norm=max_grad_norm,
                reference_logprobs=None if ref is None else ref[rows],
                reference=reference,
                normaliser=normaliser(part) if callable(normaliser) else None,
                pack_tokens=pack_tokens,
                logprobs_out=prox if own_prox and len(plan.orders) > 1 else None,
                logprobs_rows=rows,
                micro_batches=micro_batches,
            )
        )
    summed = ("micro_batches", *SPLIT_KEYS)
    out = {
        key: sum(r[key] for r in results) / len(results)
        for key in results[0]
        if key != "response_tokens" and key not in summed
    }
    for key in summed:
        out[key] = sum(r.get(key, 0.0) for r in results)
    out["split/prox_s"] = prox_s
    out["split/reference_s"] += reference_s
    out["response_tokens"] = float(batch.response_mask.sum())
    out["skipped_nonfinite"] = sum(r["skipped_nonfinite"] for r in results)  # a count, not a mean
    out["optimizer_steps"] = float(len(results)) - out["skipped_nonfinite"]
    return out
