"""Packed micro-batches under flash-attention run as one row: transformers finds the packed
sequences from restarting position ids only at batch size 1 (with more rows it would attend
across the sequences of a row). flash_attn cannot run here, so the decoder's input is read by a
hook that stops the forward before the kernel would be called."""

import pytest
import torch

from rollhub.rollout.types import PackedSequence
from rollhub.trainer.policy import Policy, collate


class _Stop(Exception):
    pass


def _batch():
    rows = []
    for prompt, answer in (([5, 6, 7, 8, 11, 12, 13], [9, 10]), ([21, 22, 23], [24, 25]), ([31, 32, 33, 34], [35])):
        seq = PackedSequence()
        seq.extend(prompt, mask=False, turn_index=-1)
        seq.extend(answer, mask=True, turn_index=0, logprobs=[-1.0] * len(answer), versions=[0] * len(answer))
        rows.append(seq)
    return collate(rows, [[0.0] * len(s.input_ids) for s in rows], 0)


def _decoder_rows(policy: Policy, batch) -> tuple[int, ...]:
    seen = []

    def stop(_module, args, kwargs):
        seen.append(tuple(kwargs["input_ids"].shape))
        raise _Stop

    handle = policy.model.get_decoder().register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with torch.no_grad(), pytest.raises(_Stop):
            policy.token_logprobs(batch, packed=True)
    finally:
        handle.remove()
    return seen[0]


def test_flash_attention_packs_into_one_row(tiny_model_dir):
    policy = Policy(tiny_model_dir, device="cpu")
    batch = _batch()
    assert _decoder_rows(policy, batch)[0] > 1  # SDPA: rows as long as the longest sequence
    policy.model.config._attn_implementation = "flash_attention_2"
    rows, width = _decoder_rows(policy, batch)
    assert rows == 1 and width == int(batch.attention_mask.sum()) - 3  # the last token of each is not needed
