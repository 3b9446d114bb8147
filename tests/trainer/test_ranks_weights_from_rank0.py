"""Sharded trainer ranks get their weights from rank 0, and score the reference policy in shards.

One real 2-rank gloo run (two processes, the tiny model) serves every test here. Rank 1 is
given a model folder WITHOUT weight files, so it can only work if it never reads the
checkpoint; a dispatch mode records the largest tensor storage each rank allocates while it
builds and receives its shards (before any forward pass, which all-gathers weights by design).
The policy and the reference are built by the product's builders (`build_policy`,
`build_reference` on the sharded config, as `rollhub train` with ranks builds them). The
single-process results come from the same builders, unsharded, in the test process.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

RANK_SCRIPT = textwrap.dedent(
    """
    import pickle, resource, sys, torch
    torch.set_num_threads(1)
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from rollhub.trainer.build import build_optimizer, build_policy, build_reference, sharded_config
    from rollhub.trainer.ranks.group import RankGroup, init_ranks
    from rollhub.trainer.ranks.launch import end_follower_process
    sys.path.insert(0, sys.argv[4])
    from test_distributed import make_batch

    class LargestStorage(TorchDispatchMode):
        # the largest storage an op creates (a DTensor's: its local shard's), meta tensors aside
        def __init__(self):
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    local = getattr(leaf, "_local_tensor", leaf)
                    if local.device.type != "meta":
                        self.bytes = max(self.bytes, local.untyped_storage().nbytes())
            return out

    config, model_dir, out = pickle.load(open(sys.argv[1], "rb")), sys.argv[2], sys.argv[3]
    context = init_ranks("gloo", timeout_s=300)
    group = RankGroup(context)
    sharded = sharded_config(config)
    recorder = LargestStorage()
    with recorder:
        policy = build_policy(sharded, model_dir)
        optimizer = build_optimizer(policy, config)
        reference = build_reference(sharded, model_dir, policy)
        group.attach(policy, optimizer, reference)  # rank 0 sends the shards
    report = {
        "largest_bytes": recorder.bytes,
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "buffers": {name: b.clone() for name, b in policy.model.named_buffers()},
        "reference_buffers": {name: b.clone() for name, b in reference.model.named_buffers()},
        "reference_sharded": all(type(p).__name__ == "DTensor" for p in reference.model.parameters()),
        "reference_frozen": not any(p.requires_grad for p in reference.model.parameters()),
        "tied": policy.model.get_output_embeddings().weight is policy.model.get_input_embeddings().weight,
        "reference_scored": [],
    }
    scored = reference.compute_logprobs
    def recording(batch, **kwargs):
        report["reference_scored"].append((len(batch), float(batch.response_mask.sum())))
        return scored(batch, **kwargs)
    reference.compute_logprobs = recording

    if not context.is_leader:
        group.serve(lambda _payload: (policy, optimizer, reference))  # attached already: no second share
        torch.save(report, out)
        torch.distributed.destroy_process_group()
        end_follower_process(0)
    group.start({})
    batch = make_batch()
    report["reference_logprobs"] = group.reference_logprobs(batch)
    report["policy_logprobs"] = group.proximal_logprobs(batch)
    report["metrics"] = group.ppo_update(
        policy, optimizer, batch, config.loss, minibatches=1, seed=3, reference=reference
    )
    report["state"] = policy.engine_state_dict()
    group.stop()
    torch.distributed.destroy_process_group()
    torch.save(report, out)
    """
)


def _config(model_dir):
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.losses import LossConfig

    config = RunConfig()
    config.model = dataclasses.replace(config.model, path=str(model_dir), init_tiny=None, device="cpu")
    config.optim = dataclasses.replace(config.optim, lr=1e-3, micro_batch_size=2)
    config.loss = LossConfig(kl_coef=0.1, kl_estimator="k3")
    return config


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    """Both ranks' reports; rank 1 reads a folder with the config and tokenizer but no weights."""
    from rollhub.trainer.ranks.launch import free_port

    tmp = tmp_path_factory.mktemp("weights_from_rank0")
    skeleton = tmp / "no_weights"
    shutil.copytree(tiny_model_dir, skeleton, ignore=shutil.ignore_patterns("*.safetensors*", "*.bin"))
    config_path = tmp / "config.pkl"
    config_path.write_bytes(pickle.dumps(_config(tiny_model_dir)))
    script = tmp / "rank.py"
    script.write_text(RANK_SCRIPT)
    port, procs = free_port(), []
    for rank, model_dir in enumerate((tiny_model_dir, skeleton)):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        args = [sys.executable, str(script), str(config_path), str(model_dir), str(tmp / f"rank{rank}.pt")]
        args.append(os.path.dirname(__file__))
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    return [torch.load(tmp / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.fixture(scope="module")
def one_process(tiny_model_dir):
    """The same builders and calls in one process, unsharded."""
    from test_distributed import make_batch

    from rollhub.trainer.build import build_optimizer, build_policy, build_reference
    from rollhub.trainer.update import ppo_update

    config = _config(tiny_model_dir)
    policy = build_policy(config, tiny_model_dir)
    optimizer = build_optimizer(policy, config)
    reference = build_reference(config, tiny_model_dir, policy)
    batch = make_batch()
    out = {
        "reference_logprobs": reference.compute_logprobs(batch),
        "policy_logprobs": policy.compute_logprobs(batch),
        "buffers": {name: b.clone() for name, b in policy.model.named_buffers()},
    }
    out["metrics"] = ppo_update(policy, optimizer, batch, config.loss, minibatches=1, seed=3, reference=reference)
    out["state"] = policy.engine_state_dict()
    out["batch"] = batch
    return out


def test_rank1_never_allocates_a_whole_weight(two_ranks, tiny_model_dir):
    from rollhub.inference.models import load_model_and_tokenizer

    model = load_model_and_tokenizer(tiny_model_dir)[0]
    largest = max(p.numel() * p.element_size() for p in model.parameters())  # the (tied) embedding
    leader, follower = two_ranks
    assert leader["largest_bytes"] >= largest  # the recorder sees whole weights where they exist
    # rank 1's largest allocation is its half of the embedding (FSDP2 chunks dim 0), never all of it
    assert follower["largest_bytes"] <= largest // 2 + largest // 100, (follower["largest_bytes"], largest)
    print(f"peak RSS after build+attach: rank0 {leader['peak_rss_kb']} kB, rank1 {follower['peak_rss_kb']} kB")


def test_followers_rebuild_the_buffers_no_state_dict_holds(two_ranks, one_process):
    """The rotary inv_freq is a non-persistent buffer: built on the meta device, it must come from rank 0."""
    expected = one_process["buffers"]
    assert any("inv_freq" in name for name in expected)
    for report in two_ranks:
        for buffers in (report["buffers"], report["reference_buffers"]):
            assert set(buffers) == set(expected)
            for name, value in expected.items():
                assert torch.equal(buffers[name], value), name
        assert report["tied"]  # the tied head is still the embedding after the meta build


def test_sharded_ranks_score_and_step_like_one_process(two_ranks, one_process):
    leader = two_ranks[0]
    assert torch.allclose(leader["policy_logprobs"], one_process["policy_logprobs"], atol=1e-5)
    one_state, two_state = one_process["state"], leader["state"]
    assert set(two_state) == set(one_state)
    worst = max(float((two_state[k] - one_state[k]).abs().max()) for k in one_state)
    assert worst < 5e-5, worst  # a lost or wrong shard moves weights by ~lr = 1e-3
    metrics, expected = leader["metrics"], one_process["metrics"]
    assert metrics["loss"] == pytest.approx(expected["loss"], abs=1e-5)
    assert metrics["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)


def test_reference_is_sharded_and_each_rank_scores_only_its_rows(two_ranks, one_process):
    batch = one_process["batch"]
    reference = two_ranks[0]["reference_logprobs"]
    assert torch.allclose(reference, one_process["reference_logprobs"], atol=1e-5)
    kl = [key for key in one_process["metrics"] if "kl" in key]
    assert kl
    for key in kl:  # the KL term the step used
        assert two_ranks[0]["metrics"][key] == pytest.approx(one_process["metrics"][key], abs=1e-6), key
    tokens = float(batch.response_mask.sum())
    scored = [report["reference_scored"] for report in two_ranks]
    for report, calls in zip(two_ranks, scored):
        assert report["reference_sharded"] and report["reference_frozen"]
        # the explicit reference pass and the one inside the step: each rank scores its share, not the batch
        assert len(calls) == 2 and all(rows < len(batch) and got < tokens for rows, got in calls)
    for call in range(2):  # together the ranks scored every response token once
        assert sum(calls[call][1] for calls in scored) == tokens
