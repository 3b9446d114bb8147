"""The trainer ranks' no-grad scoring passes (k3 reference, proximal) are the one process's: the same
function (`Policy.compute_logprobs`) with the step's packing, each rank on its share.

Two ranks are simulated in one process: rank 0's `announce` keeps every rank's shard and `_gather`
scores the other ranks' shards as their followers do (`score_shard`), so no process group is needed.
"""

import pytest
import torch

from rollhub.trainer.losses import LossConfig
from rollhub.trainer.policy import Policy
from rollhub.trainer.ranks.group import RankContext, RankGroup
from rollhub.trainer.ranks.sharding import score_shard, shard_rows
from tests.trainer.test_packing import shifted_reference, sokoban_batch

PACK_TOKENS = 160


class TwoRanksInOneProcess(RankGroup):
    def __init__(self, policy, reference):
        self.context = RankContext(rank=0, world_size=2, local_rank=0, device="cpu", backend="gloo")
        self.policy, self.reference, self.optimizer = policy, reference, None
        self._stopped, self.control_group, self.sent = False, None, []

    def announce(self, command, per_rank=None):
        self.sent.append((command, per_rank))
        return per_rank[0] if per_rank else None

    def _gather(self, value):
        command, per_rank = self.sent[-1]
        model = self.policy if command == "prox" else self.reference
        return [value, *(score_shard(model, shard) for shard in per_rank[1:])]


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    from transformers import AutoTokenizer

    return sokoban_batch(AutoTokenizer.from_pretrained(tiny_model_dir))


def test_reference_logprobs_agree_packed_and_padded(tiny_model_dir, batch):
    reference = shifted_reference(tiny_model_dir)
    mask = batch.response_mask > 0
    with torch.no_grad():
        padded = reference.compute_logprobs(batch)
        packed = reference.compute_logprobs(batch, pack_tokens=PACK_TOKENS)
    assert int(mask.sum()) > 50
    assert (padded - packed)[mask].abs().max() < 1e-5


def test_the_rank_path_scores_the_reference_as_one_process_does(tiny_model_dir, batch, monkeypatch):
    reference = shifted_reference(tiny_model_dir)
    calls = []
    original = reference.compute_logprobs

    def recording(part, **kwargs):
        calls.append(kwargs)
        return original(part, **kwargs)

    monkeypatch.setattr(reference, "compute_logprobs", recording)
    group = TwoRanksInOneProcess(Policy(tiny_model_dir, device="cpu", micro_batch_size=3), reference)
    mask = batch.response_mask > 0
    with torch.no_grad():
        one_process = original(batch, pack_tokens=PACK_TOKENS)
        ranks = group.reference_logprobs(batch, pack_tokens=PACK_TOKENS)
    assert len(calls) == 2 and all(call["pack_tokens"] == PACK_TOKENS for call in calls)
    plans = [call["micro_batches"] for call in calls]
    assert len(plans[0]) == len(plans[1])  # as many forwards on every rank (FSDP2 gathers in each)
    assert (ranks - one_process)[mask].abs().max() < 1e-5


def test_the_rank_update_passes_the_step_packing_to_its_scoring_passes(tiny_model_dir, batch, monkeypatch):
    class Scored(Exception):
        pass

    seen = {}

    def reference_logprobs(part, *, pack_tokens=None):
        seen["reference"] = pack_tokens
        raise Scored

    policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=3)
    group = TwoRanksInOneProcess(policy, shifted_reference(tiny_model_dir))
    monkeypatch.setattr(group, "reference_logprobs", reference_logprobs)
    with pytest.raises(Scored):
        group.ppo_update(
            policy, None, batch, LossConfig(kl_coef=0.1), reference=group.reference, pack_tokens=PACK_TOKENS
        )
    assert seen["reference"] == PACK_TOKENS


def test_packed_shards_keep_every_row_once_and_pad_plans_to_one_count(batch):
    rows, shards = shard_rows(batch, 3, pack_tokens=PACK_TOKENS)
    assert sorted(r for share in rows for r in share) == list(range(len(batch)))
    counts = {len(shard.micro_batches) for shard in shards}
    assert len(counts) == 1
    for share, shard in zip(rows, shards):
        planned = sorted(r for micro in shard.micro_batches for r in micro)
        assert planned == list(range(len(shard.batch)))  # every row of the shard, the empty fillers included
        assert float(shard.batch.response_mask[len(share) :].sum()) == 0
