"""Packed micro-batches: sequences laid end to end up to a token budget, kept apart by the mask.

Multi-turn agent sequences differ a lot in length; right-padded micro-batches spend the
decoder's compute on padding up to the longest row. Packing instead groups the batch's
sequences into micro-batches of at most `pack_tokens` real tokens (first-fit decreasing; a
sequence longer than the budget goes alone). Inside a micro-batch the sequences are laid
end to end in rows as long as its longest sequence (so a row's attention costs what one
padded row costs, and the padding is filled with other sequences), with position ids that
restart at 0 for each sequence and an attention mask that lets a token see only the earlier
tokens of its own sequence (block-diagonal causal). Sequences whose needed tokens another
sequence of the micro-batch already holds (group samples of one prompt with one-token
answers) run once: `SharedPrefixes`.

Only the forward pass is packed. Log-probs, entropy and the full next-token distributions
come back in the padded [rows, time] layout of the micro-batch (`TokenBatch`), so the loss
code, the response masks and the `BatchNormaliser` are exactly those of padded
micro-batches: the accumulated gradient is still the full-batch gradient.

Attention: with SDPA or eager attention (CPU, and GPU without flash-attn) the mask is a 4D
[rows, 1, T, T] tensor handed to the transformers model, which uses a 4D mask as given
(transformers 5.x `masking_utils`). A dense mask still costs T^2 work per row, whence rows
no longer than the longest sequence. Where the model runs flash-attention
(`attn_implementation="flash_attention_2"`, `flash_attn` importable) no mask is built: the
restarting position ids alone delimit the sequences and transformers calls the
variable-length kernel. That path is written but not tested on this CPU machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def sequence_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Real tokens per row of a right-padded [rows, time] 0/1 mask."""
    return [int(n) for n in attention_mask.sum(-1).tolist()]


def plan_packed_micro_batches(lengths: Sequence[int], pack_tokens: int) -> list[list[int]]:
    """Row indices of each micro-batch: at most `pack_tokens` tokens per group (first-fit decreasing).

    A row longer than the budget is a group of its own. Rows keep their batch order inside a
    group and groups are ordered by their first row, so the plan is deterministic.
    """
    if pack_tokens < 1:
        raise ValueError(f"pack_tokens must be >= 1, got {pack_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    room: list[int] = []
    for row in order:
        need = max(int(lengths[row]), 1)
        for g, free in enumerate(room):
            if need <= free:
                groups[g].append(row)
                room[g] -= need
                break
        else:
            groups.append([row])
            room.append(max(pack_tokens - need, 0))
    for group in groups:
        group.sort()
    groups.sort(key=lambda group: group[0])
    return groups


def plan_padded_micro_batches(rows: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive rows, `micro_batch_size` at a time (the right-padded layout)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return [list(range(start, min(start + micro_batch_size, rows))) for start in range(0, rows, micro_batch_size)]


@dataclass
class PackedRows:
    """The sequences of a micro-batch laid end to end in rows of at most `row_tokens` tokens.

    Rows are right-padded to the longest row; a padding token is its own one-token
    sequence (it attends to itself only, so no attention row is empty and no real token
    sees it).
    """

    input_ids: torch.Tensor  # [rows, T]
    position_ids: torch.Tensor  # [rows, T], 0 at the start of each sequence (and on padding)
    sequence_ids: torch.Tensor  # [rows, T], the sequence each token belongs to (unique per token on padding)
    row_of: torch.Tensor  # [sequences], the packed row each sequence sits in
    offsets: torch.Tensor  # [sequences], where its first token sits in that row

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    def packed_index(self, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed row, position) of token `cols` of sequence `rows`."""
        return self.row_of[rows], self.offsets[rows] + cols

    def attention_mask_4d(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """[rows, 1, T, T] block-diagonal causal mask: True where query i may attend key j.

        With `dtype` (eager attention adds the mask to the scores) the mask is additive:
        0 where allowed, the dtype's minimum elsewhere.
        """
        length = self.length
        same = self.sequence_ids.unsqueeze(2) == self.sequence_ids.unsqueeze(1)
        causal = torch.ones(length, length, dtype=torch.bool, device=same.device).tril()
        allowed = (same & causal).unsqueeze(1)
        if dtype is None:
            return allowed
        additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return additive.masked_fill(~allowed, torch.finfo(dtype).min)


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, row_tokens: int | None = None) -> PackedRows:
    """Lay the real (unpadded) tokens of each sequence of a right-padded micro-batch end to end.

    Sequences are binned into rows of at most `row_tokens` tokens (first-fit decreasing; a
    longer sequence gets a row of its own); None puts them all in one row.
    """
    lengths = attention_mask.sum(-1).to(torch.long)
    if bool((lengths < 1).any()):
        raise ValueError("every packed sequence needs at least one token")
    device = input_ids.device
    prefix = torch.arange(attention_mask.shape[1], device=device).unsqueeze(0) < lengths.unsqueeze(1)
    if not bool(torch.equal(prefix, attention_mask.bool())):
        raise ValueError("packing needs right-padded rows (real tokens first, then padding)")
    length_list = lengths.tolist()
    bins = plan_packed_micro_batches(length_list, row_tokens) if row_tokens else [list(range(len(length_list)))]
    width = max(sum(length_list[i] for i in group) for group in bins)
    count = len(length_list)
    ids = torch.zeros(len(bins), width, dtype=input_ids.dtype, device=device)
    positions = torch.zeros(len(bins), width, dtype=torch.long, device=device)
    # padding: ids count + position, so each padding token is a sequence of its own
    sequences = count + torch.arange(len(bins) * width, device=device).reshape(len(bins), width)
    row_of = torch.zeros(count, dtype=torch.long, device=device)
    offsets = torch.zeros(count, dtype=torch.long, device=device)
    for row, group in enumerate(bins):
        at = 0
        for sequence in group:
            n = length_list[sequence]
            ids[row, at : at + n] = input_ids[sequence, :n]
            positions[row, at : at + n] = torch.arange(n, device=device)
            sequences[row, at : at + n] = sequence
            row_of[sequence], offsets[sequence] = row, at
            at += n
    return PackedRows(ids, positions, sequences, row_of, offsets)


def uses_flash_attention(model: torch.nn.Module) -> bool:
    """The model runs flash-attention (its varlen kernels read sequence starts from position ids)."""
    return _attention_implementation(model).startswith("flash_attention")


def _attention_implementation(model: torch.nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "sdpa")


def packed_model_inputs(packed: PackedRows, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Keyword arguments for a transformers decoder (or causal LM) on packed rows.

    flash-attention: no mask, transformers finds the sequences from the restarting position
    ids and calls the varlen kernel (GPU with `flash_attn`; not exercised on CPU). SDPA: a
    boolean 4D mask. Eager and other implementations add the mask to the scores: additive.
    """
    inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
    implementation = _attention_implementation(model)
    if implementation.startswith("flash_attention"):
        return inputs
    if implementation == "sdpa":
        inputs["attention_mask"] = packed.attention_mask_4d()
    else:
        inputs["attention_mask"] = packed.attention_mask_4d(next(model.parameters()).dtype)
    return inputs


@dataclass
class SharedPrefixes:
    """Which rows' forward passes are the same: `host[r]` is the row whose tokens stand in for row r.

    A row's log-probs need hidden states only at the positions that predict its response
    tokens, i.e. up to one before its last response token, and a causal model's hidden state
    at position t depends on tokens 0..t alone. So a row whose needed tokens equal, or are a
    prefix of, another row's needed tokens can read its hidden states from that row. A group's
    samples of one prompt whose answers are one token each (one move per sample of a board)
    are such rows. Sharing is exact: the same tensors, and autograd sums both rows'
    gradients through the one forward.
    """

    hosts: list[int]  # rows that run, in batch order
    host: list[int]  # for every row, the row it reads from (itself when it runs)
    needed: list[int]  # tokens each host row must run (>= 1)


def shared_prefixes(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor
) -> SharedPrefixes:
    """Group the rows of a right-padded micro-batch by needed prefix (see `SharedPrefixes`)."""
    lengths = attention_mask.sum(-1).tolist()
    has_response = response_mask[:, 1:].gt(0)
    # hidden states are needed at positions 0 .. last predicting position (token t is predicted at t - 1)
    if has_response.shape[1] == 0:  # one-token rows (a trainer rank's empty padding): nothing predicted
        last = [-1] * len(lengths)
    else:
        last = torch.where(
            has_response.any(-1), has_response.shape[1] - 1 - has_response.flip(-1).float().argmax(-1), -1
        ).tolist()
    keys = []
    for row, (stop, length) in enumerate(zip(last, lengths)):
        needed = min(stop + 1, int(length)) if stop >= 0 else 0
        keys.append(tuple(input_ids[row, :needed].tolist()))
    order = sorted(range(len(keys)), key=lambda r: (keys[r], r))
    host = list(range(len(keys)))
    # in lexicographic order a key that is a prefix of any other key is a prefix of the next one
    for position in range(len(order) - 2, -1, -1):
        row, following = order[position], order[position + 1]
        key, next_key = keys[row], keys[following]
        if key and next_key[: len(key)] == key:
            host[row] = host[following]
    hosts = sorted({host[row] for row, key in enumerate(keys) if key})
    if not hosts:  # no response token anywhere: run the first row's first token so the graph exists
        hosts, keys[0], host[0] = [0], keys[0] or tuple(input_ids[0, :1].tolist()), 0
    return SharedPrefixes(hosts=hosts, host=host, needed=[len(keys[row]) for row in hosts])


def prompt_groups(input_ids: torch.Tensor, response_mask: torch.Tensor) -> list[list[int]]:
    """Rows that share a prompt (their tokens before the first response token), in first-row order."""
    first = response_mask.gt(0).float().argmax(-1).tolist()
    members: dict[tuple[int, ...], list[int]] = {}
    for row, start in enumerate(first):
        members.setdefault(tuple(input_ids[row, :start].tolist()), []).append(row)
    return list(members.values())


def prompt_split(
    input_ids: torch.Tensor, response_mask: torch.Tensor, parts: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """Rows split into at most `parts` shuffled mini-batches, rows with the same prompt kept together.

    The prompt of a row is its tokens before its first response token. Packing runs a prompt
    shared by several rows once per micro-batch (`SharedPrefixes`), so a random row split that
    scatters a board's samples over the mini-batches forwards that board once per mini-batch;
    kept together it is forwarded once per step. Groups are shuffled (by `generator`, so a
    resumed run draws the same parts) and cut at group boundaries into parts of about equal rows.
    """
    groups = prompt_groups(input_ids, response_mask)
    order = torch.randperm(len(groups), generator=generator).tolist()
    parts = max(1, min(parts, len(groups)))
    target = len(input_ids) / parts
    split: list[list[int]] = [[]]
    placed = 0
    for position, index in enumerate(order):
        parts_left = parts - len(split)
        full = placed >= len(split) * target or len(order) - position <= parts_left
        if split[-1] and parts_left > 0 and full:
            split.append([])
        split[-1].extend(groups[index])
        placed += len(groups[index])
    return [torch.as_tensor(rows, dtype=torch.long) for rows in split]
