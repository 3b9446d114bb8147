"""One optimizer step on a batch: micro-batches, gradient accumulation, clipping.

Every micro-batch's loss is normalised by the token/sequence counts of the WHOLE batch
(`BatchNormaliser`), so the accumulated gradient is exactly the full-batch gradient,
whatever the micro-batch size.
"""

from __future__ import annotations

from typing import Any

import torch

from rollhub.trainer.losses import BatchNormaliser, LossConfig, policy_loss
from rollhub.trainer.policy import Policy, TokenBatch


def policy_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    prox_logprobs: torch.Tensor,
    loss_config: LossConfig,
    *,
    max_grad_norm: float | None = 1.0,
    reference_logprobs: torch.Tensor | None = None,
) -> dict[str, float]:
    """Compute the loss over `batch` in micro-batches, accumulate gradients, step once."""
    normaliser = BatchNormaliser.from_mask(batch.response_mask)
    optimizer.zero_grad(set_to_none=True)
    total_loss = 0.0
    weighted: dict[str, float] = {}
    weights: dict[str, float] = {}
    with_entropy = loss_config.entropy_coef > 0
    for start in range(0, len(batch), policy.micro_batch_size):
        stop = min(start + policy.micro_batch_size, len(batch))
        part = batch.slice(start, stop).to(policy.device)
        width = part.input_ids.shape[1]
        prox = prox_logprobs[start:stop, :width].to(policy.device)
        reference = reference_logprobs[start:stop, :width].to(policy.device) if reference_logprobs is not None else None
        logp, entropy = policy.token_logprobs(part, with_entropy=with_entropy)
        loss, metrics = policy_loss(
            logp, prox, part.behaviour_logprobs, part.advantages, part.response_mask, loss_config,
            normaliser=normaliser, reference_logp=reference, entropy=entropy,
        )
        loss.backward()
        total_loss += float(loss.detach())
        tokens = float(part.response_mask.sum())
        for key, value in metrics.items():
            weighted[key] = weighted.get(key, 0.0) + value * tokens
            weights[key] = weights.get(key, 0.0) + tokens
    grad_norm = _clip_and_norm(policy.parameters(), max_grad_norm)
    optimizer.step()
    out: dict[str, Any] = {key: weighted[key] / max(weights[key], 1e-12) for key in weighted}
    out["loss"] = total_loss
    out["grad_norm"] = grad_norm
    out["response_tokens"] = normaliser.num_tokens
    return out


def _clip_and_norm(parameters, max_grad_norm: float | None) -> float:
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    limit = max_grad_norm if max_grad_norm is not None else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, limit))
