"""One optimizer step on a batch: micro-batches, gradient accumulation, clipping.

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
from typing import Any

import torch

from rollhub.trainer.losses import BatchNormaliser, LossConfig, full_kl, policy_loss
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
) -> dict[str, float]:
    """Compute the loss over `batch` in micro-batches, accumulate gradients, step once.

    With loss_config.kl_estimator "full", `reference` (a frozen policy) gives its whole
    next-token distribution at each response position of each micro-batch, and the KL
    term is exact; "k3" uses the precomputed sampled-token `reference_logprobs`.

    `prox_logprobs=None` means the proximal policy IS the current weights (one optimizer
    step per batch): the update's own forward pass, detached, serves as pi_prox, which
    saves the separate no-grad pass over the batch (a third of the trainer's compute).
    """
    normaliser = BatchNormaliser.from_mask(batch.response_mask)
    optimizer.zero_grad(set_to_none=True)
    total_loss = 0.0
    weighted: dict[str, float] = {}
    weights: dict[str, float] = {}
    with_entropy = loss_config.entropy_coef > 0
    exact_kl = loss_config.kl_coef > 0 and loss_config.kl_estimator == "full"
    if exact_kl and reference is None:
        raise ValueError("loss.kl_estimator 'full' needs the reference policy")
    for start in range(0, len(batch), policy.micro_batch_size):
        stop = min(start + policy.micro_batch_size, len(batch))
        part = batch.slice(start, stop).to(policy.device)
        width = part.input_ids.shape[1]
        reference_part = (
            reference_logprobs[start:stop, :width].to(policy.device) if reference_logprobs is not None else None
        )
        kl_tokens = None
        if exact_kl:
            with torch.no_grad():
                reference_full = reference.token_logprobs(part, with_full=True)[2]
            logp, entropy, full = policy.token_logprobs(part, with_entropy=with_entropy, with_full=True)
            rows, cols = response_positions(part)
            kl_tokens = torch.zeros_like(logp).index_put((rows, cols + 1), full_kl(full, reference_full))
        else:
            logp, entropy = policy.token_logprobs(part, with_entropy=with_entropy)
        prox = logp.detach() if prox_logprobs is None else prox_logprobs[start:stop, :width].to(policy.device)
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
        loss.backward()
        total_loss += float(loss.detach())
        tokens = float(part.response_mask.sum())
        for key, value in metrics.items():
            weighted[key] = weighted.get(key, 0.0) + value * tokens
            weights[key] = weights.get(key, 0.0) + tokens
    grad_norm = _clip_and_norm(policy.parameters(), max_grad_norm)
    skipped = _step_if_finite(optimizer, total_loss, grad_norm, policy.device)
    out: dict[str, Any] = {key: weighted[key] / max(weights[key], 1e-12) for key in weighted}
    out["loss"] = total_loss
    out["grad_norm"] = grad_norm
    out["response_tokens"] = normaliser.num_tokens
    out["skipped_nonfinite"] = float(skipped)
    return out


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
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    limit = max_grad_norm if max_grad_norm is not None else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, limit))


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
    """
    if minibatches < 1 or epochs < 1:
        raise ValueError("minibatches and epochs must be >= 1")
    if loss_config.kl_coef > 0 and reference is None:
        raise ValueError("loss.kl_coef > 0 needs a reference policy")
    sampled_kl = loss_config.kl_coef > 0 and loss_config.kl_estimator == "k3"
    ref = reference.compute_logprobs(batch) if sampled_kl and reference is not None else None
    behaviour = batch.behaviour_logprobs * batch.response_mask if loss_config.proximal == "behaviour" else None
    if minibatches == 1 and epochs == 1:
        out = policy_update(
            policy,
            optimizer,
            batch,
            behaviour,
            loss_config,
            max_grad_norm=max_grad_norm,
            reference_logprobs=ref,
            reference=reference,
        )
        out["optimizer_steps"] = 1.0 - out["skipped_nonfinite"]
        return out
    # with "behaviour" the decoupled weight min(prox/mu, C) is 1 and the clip is plain PPO's
    prox = behaviour if behaviour is not None else policy.compute_logprobs(batch)
    generator = torch.Generator().manual_seed(seed)
    results = []
    for _ in range(epochs):
        order = torch.randperm(len(batch), generator=generator)
        for rows in order.tensor_split(min(minibatches, len(batch))):
            part = batch.select(rows)
            results.append(
                policy_update(
                    policy,
                    optimizer,
                    part,
                    prox[rows],
                    loss_config,
                    max_grad_norm=max_grad_norm,
                    reference_logprobs=None if ref is None else ref[rows],
                    reference=reference,
                )
            )
    out = {key: sum(r[key] for r in results) / len(results) for key in results[0] if key != "response_tokens"}
    out["response_tokens"] = float(batch.response_mask.sum())
    out["skipped_nonfinite"] = sum(r["skipped_nonfinite"] for r in results)  # a count, not a mean
    out["optimizer_steps"] = float(len(results)) - out["skipped_nonfinite"]
    return out
