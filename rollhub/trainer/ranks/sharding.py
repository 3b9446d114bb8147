"""Splitting one step's batch across trainer ranks: pure functions of the batch and the world size.

Every rank must run the same number of forward passes (FSDP2 all-gathers parameters in each
one): shards are padded with empty rows (one token, no response) to the same row count, so
the padded micro-batch plan has the same length everywhere. Packed micro-batches
(`optim.pack_tokens`) plan by tokens, so their count differs per rank: rank 0 plans every
rank's micro-batches and pads the shorter plans with micro-batches of one empty row. The
mini-batches are those of the step's plan (`rollhub.trainer.update.plan_step`), the ones the
single process runs, and a prompt's rows stay on one rank (`split_by_prompt`), so no two ranks
run the same prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rollhub.trainer.update import StepPlan


def split_by_tokens(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Row indices for each of `parts` ranks, with about equal token sums (not equal row counts).

    Longest first, each to the rank with the fewest tokens so far (ties: the lower rank), so
    the largest rank's load is within one sequence of the mean; rows keep their batch order
    inside a part. Deterministic: every run of the same batch splits it the same way.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    loads = [0] * parts
    assigned: list[list[int]] = [[] for _ in range(parts)]
    for row in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        target = min(range(parts), key=lambda p: (loads[p], p))
        assigned[target].append(row)
        loads[target] += int(lengths[row])
    return [sorted(rows) for rows in assigned]


def split_by_prompt(batch: Any, parts: int) -> list[list[int]]:
    """Row indices for each rank with a prompt's rows kept on one rank (the packed update).

    Packing runs a prompt shared by several rows once (`packing.shared_prefixes`); split over
    two ranks, both would run it. Prompt groups are balanced by the tokens their packed forward
    runs (the prompt once, plus each row's tokens after it), longest first, as `split_by_tokens`;
    the cost is read from the lengths, since the rank's own update finds the shared prefixes.
    When whole groups cannot be balanced (fewer groups than ranks, or one group costing more
    than a rank's fair share, e.g. few prompts with many long answers), rows are split one by
    one instead: an idle rank costs more than a prompt run twice.
    """
    from rollhub.trainer.packing import prompt_groups

    groups = prompt_groups(batch.input_ids, batch.response_mask)
    lengths = batch.attention_mask.sum(-1).tolist()
    prompt = batch.response_mask.gt(0).float().argmax(-1).tolist()
    costs = [prompt[rows[0]] + sum(lengths[row] - prompt[row] for row in rows) for rows in groups]
    if len(groups) < parts or max(costs) > sum(costs) / parts:
        return split_by_tokens(lengths, parts)
    return [sorted(row for group in share for row in groups[group]) for share in split_by_tokens(costs, parts)]


def _empty_rows(count: int) -> Any:
    """`count` one-token rows with no response: they add forward passes but no loss and no gradient."""
    from rollhub.trainer.policy import TokenBatch

    width = 1
    input_ids = torch.zeros((count, width), dtype=torch.long)
    attention = torch.ones((count, width), dtype=torch.long)
    zeros = torch.zeros((count, width), dtype=torch.float32)
    versions = torch.full((count, width), -1, dtype=torch.long)
    return TokenBatch(input_ids, attention, zeros.clone(), zeros.clone(), zeros.clone(), versions)


def _pad_to_rows(part: Any, rows: int, extra: Sequence[torch.Tensor | None] = ()) -> tuple[Any, list[Any]]:
    """`part` (a TokenBatch) and its companion [rows, time] tensors padded with empty rows to `rows` rows."""
    from rollhub.trainer.policy import TokenBatch

    missing = rows - len(part)
    if missing <= 0:
        return part, list(extra)
    filler = _empty_rows(missing)
    width = max(part.input_ids.shape[1], 1)

    def widen(tensor: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value)

    pad_values = (0, 0, 0.0, 0.0, 0.0, -1)
    merged = TokenBatch(
        *(
            torch.cat([mine, widen(theirs, value).to(mine.dtype)])
            for mine, theirs, value in zip(part._tensors(), filler._tensors(), pad_values)
        )
    )
    padded_extra = [
        None if t is None else torch.cat([t, torch.zeros((missing, t.shape[1]), dtype=t.dtype)]) for t in extra
    ]
    return merged, padded_extra


@dataclass
class ShardPart:
    """One PPO mini-batch as one rank sees it."""

    batch: Any  # TokenBatch: this rank's rows, padded with empty rows to the common row count
    prox: torch.Tensor | None  # proximal log-probs of those rows (None: the update's own forward)
    reference: torch.Tensor | None  # sampled-token reference log-probs (k3 KL), or None
    normaliser: Any  # BatchNormaliser of the WHOLE mini-batch (all ranks)
    tokens: float  # this rank's response tokens (weights the metrics)
    micro_batches: list[list[int]] | None = None  # packed micro-batches, as many on every rank (pack_tokens)


def shard_parts(
    batch: Any,
    plan: StepPlan,
    world_size: int,
    *,
    prox: torch.Tensor | None,
    reference: torch.Tensor | None,
) -> list[list[ShardPart]]:
    """For each rank, its share of every mini-batch of `plan` (token-balanced, padded to equal row counts).

    With `plan.pack_tokens` each share is padded instead to an equal count of packed micro-batches.
    """
    from rollhub.trainer.losses import BatchNormaliser
    from rollhub.trainer.packing import sequence_lengths
    from rollhub.trainer.update import micro_batch_rows

    pack_tokens = plan.pack_tokens
    lengths = batch.attention_mask.sum(-1).tolist()
    out: list[list[ShardPart]] = [[] for _ in range(world_size)]
    for rows in plan.parts:
        rows = rows.tolist()
        whole = batch.select(rows)
        normaliser = BatchNormaliser.from_mask(whole.response_mask)
        if pack_tokens is None:
            split = split_by_tokens([lengths[r] for r in rows], world_size)
        else:
            split = split_by_prompt(whole, world_size)
        shares = []
        for local in split:
            picked = [rows[i] for i in local]
            if picked:
                part = batch.select(picked)
                width = part.input_ids.shape[1]
                extra = [None if t is None else t[picked, :width] for t in (prox, reference)]
            else:
                part, extra = _empty_rows(0), [None if t is None else t[:0, :1] for t in (prox, reference)]
            micro = None
            if pack_tokens is not None:
                micro = (
                    micro_batch_rows(sequence_lengths(part.attention_mask), pack_tokens, plan.micro_batch_size)
                    if picked
                    else []
                )
            shares.append((part, extra, micro))
        if pack_tokens is None:
            common = max(max(len(s) for s in split), 1)
        else:
            count = max(max(len(micro) for _, _, micro in shares), 1)
        for rank, (part, extra, micro) in enumerate(shares):
            rows_needed = common if micro is None else len(part) + count - len(micro)
            if micro is not None:  # one empty row per missing micro-batch
                micro = micro + [[len(part) + i] for i in range(count - len(micro))]
            part, (part_prox, part_ref) = _pad_to_rows(part, rows_needed, extra)
            tokens = float(part.response_mask.sum())
            out[rank].append(ShardPart(part, part_prox, part_ref, normaliser, tokens, micro))
    return out


@dataclass
class ScoringShard:
    """One rank's share of a no-grad scoring pass (proximal or reference log-probs)."""

    batch: Any  # TokenBatch: this rank's rows, padded with empty rows
    pack_tokens: int | None  # the step's packing, so every rank scores as one process does
    micro_batches: list[list[int]] | None  # packed micro-batches, as many on every rank (pack_tokens)


def shard_rows(
    batch: Any, world_size: int, *, pack_tokens: int | None = None
) -> tuple[list[list[int]], list[ScoringShard]]:
    """Rows of the whole batch per rank and each rank's `ScoringShard` (the prox and reference passes).

    Padded: token-balanced rows, padded to equal row counts. Packed: a prompt's rows on one rank
    (`split_by_prompt`, as the packed update), each plan padded to the same count of packed
    micro-batches with one empty row each."""
    from rollhub.trainer.packing import plan_packed_micro_batches, sequence_lengths

    if pack_tokens is None:
        split = split_by_tokens(batch.attention_mask.sum(-1).tolist(), world_size)
    else:
        split = split_by_prompt(batch, world_size)
    parts = [batch.select(rows) if rows else _empty_rows(0) for rows in split]
    if pack_tokens is None:
        common = max(max(len(s) for s in split), 1)
        return split, [ScoringShard(_pad_to_rows(part, common)[0], None, None) for part in parts]
    plans = [
        plan_packed_micro_batches(sequence_lengths(part.attention_mask), pack_tokens) if len(part) else []
        for part in parts
    ]
    count = max(max(len(plan) for plan in plans), 1)
    shards = []
    for part, plan in zip(parts, plans):
        missing = count - len(plan)
        plan = plan + [[len(part) + i] for i in range(missing)]
        shards.append(ScoringShard(_pad_to_rows(part, len(part) + missing)[0], pack_tokens, plan))
    return split, shards


def score_shard(model: Any, shard: ScoringShard) -> torch.Tensor:
    """`model`'s no-grad log-probs of its shard: `Policy.compute_logprobs`, the single process's own
    scoring function, with the step's packing."""
    return model.compute_logprobs(shard.batch, pack_tokens=shard.pack_tokens, micro_batches=shard.micro_batches)


def combine_results(per_rank: list[list[dict[str, float]]], response_tokens: float) -> dict[str, float]:
    """One step's metrics from every rank's per-mini-batch results, as `ppo_update` reports them.

    Per mini-batch: the loss is the sum of the ranks' shares (each is a part of the global
    mean), loss metrics are token-weighted means, the gradient norm and the skip flag are
    the same on every rank. Over mini-batches: means, except the counts and timings.
    """
    steps = []
    for index in range(len(per_rank[0])):
        results = [rank_results[index] for rank_results in per_rank]
        merged: dict[str, float] = {}
        # a rank whose share of a small mini-batch is only padding rows reports no loss metrics
        # (no response tokens): merge each name over the ranks that reported it
        for key in dict.fromkeys(k for r in results for k in r):
            if key in ("local_tokens", "response_tokens"):
                continue
            having = [r for r in results if key in r]
            tokens = sum(r.get("local_tokens", 0.0) for r in having)
            if key == "loss":
                merged[key] = sum(r[key] for r in having)
            elif key in ("grad_norm", "skipped_nonfinite") or key.startswith("split/") or key == "micro_batches":
                merged[key] = having[0][key]
            elif tokens > 0:
                merged[key] = sum(r[key] * r.get("local_tokens", 0.0) for r in having) / tokens
            else:
                merged[key] = having[0][key]
        steps.append(merged)
    summed = {"skipped_nonfinite", "micro_batches"}
    names = list(dict.fromkeys(k for step in steps for k in step))
    out = {}
    for key in names:
        values = [step[key] for step in steps if key in step]
        out[key] = sum(values) if key in summed or key.startswith("split/") else sum(values) / len(values)
    out["response_tokens"] = response_tokens
    out["optimizer_steps"] = float(len(steps)) - out.get("skipped_nonfinite", 0.0)
    return out
