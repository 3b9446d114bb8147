"""Trainer ranks (rollhub.trainer.ranks) on CPU with gloo: the data-parallel step is the
single-process step, token balancing, per-layer activation checkpointing.

The 2-rank runs are real processes joined by torch.distributed (gloo), each with an
FSDP2-sharded policy and KL reference (rank 1 receives its shards from rank 0); what they
must equal is the plain single-process `ppo_update` on the same batch, in the test process.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from rollhub.trainer.ranks.sharding import split_by_tokens

STEP_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    torch.set_num_threads(1)
    from rollhub.trainer.ranks.group import RankGroup, init_ranks
    from rollhub.trainer.ranks.launch import end_follower_process
    from rollhub.trainer.losses import LossConfig
    from rollhub.trainer.policy import Policy
    sys.path.insert(0, sys.argv[3])
    from test_distributed import make_batch

    model_dir, case = sys.argv[1], json.loads(sys.argv[2])
    context = init_ranks("gloo", timeout_s=300)
    group = RankGroup(context)

    def build(_payload):
        policy = Policy(model_dir, device="cpu", micro_batch_size=case["micro"], fsdp=True)
        optimizer = torch.optim.AdamW(list(policy.parameters()), lr=case["lr"])
        reference = Policy(model_dir, device="cpu", micro_batch_size=case["micro"], fsdp=True) if case["kl"] else None
        return policy, optimizer, reference

    if not context.is_leader:
        group.serve(build)
        torch.distributed.destroy_process_group()  # as rollhub's ranks end: no collective thread left,
        end_follower_process(0)  # and no interpreter teardown of gloo's objects
    policy, optimizer, reference = build(None)
    group.start({})  # as `build_run` does: the followers build theirs, then every rank attaches
    group.attach(policy, optimizer, reference)
    loss = LossConfig(kl_coef=case["kl"], kl_estimator=case.get("estimator", "full"), aggregation=case["aggregation"])
    metrics = group.ppo_update(policy, optimizer, make_batch(samples=case.get("samples", 1)), loss,
                               minibatches=case["minibatches"], seed=3,
                               reference=reference, pack_tokens=case.get("pack"))
    state = policy.engine_state_dict()
    group.stop()
    torch.distributed.destroy_process_group()
    torch.save({"state": state, "metrics": metrics}, case["out"])
    """
)


def make_batch(rows: int = 7, seed: int = 0, samples: int = 1):
    """Sequences of very different lengths (prompt + response), advantages of both signs.

    `samples` > 1: each prompt is answered that many times in a row (a group's samples).
    """
    from rollhub.rollout.types import PackedSequence
    from rollhub.trainer.policy import collate

    rng = random.Random(seed)
    sequences, advantages = [], []
    for row in range(rows):
        if row % samples == 0:
            prompt = [rng.randrange(3, 200) for _ in range(rng.randrange(2, 30))]
        response = [rng.randrange(3, 200) for _ in range(rng.randrange(1, 6))]
        seq = PackedSequence()
        seq.extend(prompt, mask=False, turn_index=-1)
        seq.extend(response, mask=True, turn_index=0, logprobs=[-5.0] * len(response), versions=[0] * len(response))
        sequences.append(seq)
        value = rng.uniform(-1, 1)
        advantages.append([0.0] * len(prompt) + [value] * len(response))
    return collate(sequences, advantages, 0)


def _two_rank_step(model_dir, tmp_path, case: dict) -> dict:
    import json

    from rollhub.trainer.ranks.launch import free_port

    script = tmp_path / "step.py"
    script.write_text(STEP_SCRIPT)
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        args = [sys.executable, str(script), str(model_dir), json.dumps(case), os.path.dirname(__file__)]
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    return torch.load(case["out"], weights_only=True)


def _one_process_step(model_dir, case: dict) -> tuple[dict, dict]:
    from rollhub.trainer.losses import LossConfig
    from rollhub.trainer.policy import Policy
    from rollhub.trainer.update import ppo_update

    policy = Policy(model_dir, device="cpu", micro_batch_size=case["micro"])
    optimizer = torch.optim.AdamW(list(policy.parameters()), lr=case["lr"])
    reference = Policy(model_dir, device="cpu", micro_batch_size=case["micro"]) if case["kl"] else None
    loss = LossConfig(kl_coef=case["kl"], kl_estimator=case.get("estimator", "full"), aggregation=case["aggregation"])
    metrics = ppo_update(
        policy,
        optimizer,
        make_batch(samples=case.get("samples", 1)),
        loss,
        minibatches=case["minibatches"],
        seed=3,
        reference=reference,
        pack_tokens=case.get("pack"),
    )
    return policy.engine_state_dict(), metrics


@pytest.mark.parametrize(
    "case",
    [
        # Adam's first step moves each weight by about lr * sign(g): a weight whose gradient is near 0
        # turns float summation order into up to 1.3e-5 on some CPUs (also before the ranks moved);
        # a lost or doubled shard moves weights by ~lr = 1e-3, far above 5e-5
        {"minibatches": 1, "kl": 0.0, "aggregation": "token-mean", "micro": 2, "lr": 1e-3, "atol": 5e-5},
        # two Adam steps amplify float summation order: one process alone moves its weights by
        # 2.8e-5 when only micro_batch_size changes (3 -> 1) on this batch, hence 1e-4 here
        pytest.param(
            {"minibatches": 2, "kl": 0.1, "aggregation": "seq-mean-token-mean", "micro": 3, "lr": 1e-3, "atol": 1e-4},
            marks=pytest.mark.slow,
        ),
        # packed micro-batches of <= 40 tokens: the ranks' plans differ in length (one rank's share
        # of the second mini-batch is empty) and the shorter is padded, or FSDP2 would hang
        {
            "minibatches": 2,
            "kl": 0.1,
            "aggregation": "seq-mean-token-mean",
            "micro": 2,
            "lr": 1e-3,
            "atol": 1e-4,
            "pack": 40,
            "samples": 2,  # prompts answered twice: each prompt's rows go to one rank
        },
        # the k3 reference and the proximal pass scored packed on the ranks, as one process packs them
        pytest.param(
            {
                "minibatches": 2,
                "kl": 0.1,
                "estimator": "k3",
                "aggregation": "seq-mean-token-mean",
                "micro": 2,
                "lr": 1e-3,
                "atol": 1e-4,
                "pack": 40,
                "samples": 2,
            },
            marks=pytest.mark.slow,
        ),
    ],
    ids=["one-step", "two-minibatches-prox-kl", "packed-two-minibatches-kl", "packed-k3-reference"],
)
def test_two_ranks_give_the_parameters_of_one_process(tiny_model_dir, tmp_path, case):
    case = {**case, "out": str(tmp_path / "two_ranks.pt")}
    two = _two_rank_step(tiny_model_dir, tmp_path, case)
    one_state, one_metrics = _one_process_step(tiny_model_dir, case)
    from rollhub.inference.models import load_model_and_tokenizer

    start = load_model_and_tokenizer(tiny_model_dir)[0].state_dict()
    moved = max(float((one_state[k] - start[k]).abs().max()) for k in one_state)
    assert moved > 1e-4  # the step really changed the weights (so equality below means something)
    assert set(two["state"]) == set(one_state)
    worst = max(float((two["state"][k] - one_state[k]).abs().max()) for k in one_state)
    assert worst < case["atol"], worst
    metrics = two["metrics"]
    assert metrics["loss"] == pytest.approx(one_metrics["loss"], abs=1e-5)
    assert metrics["grad_norm"] == pytest.approx(one_metrics["grad_norm"], rel=1e-4)
    assert metrics["response_tokens"] == one_metrics["response_tokens"]
    assert metrics["optimizer_steps"] == one_metrics["optimizer_steps"] == case["minibatches"]


def test_split_by_tokens_balances_tokens_not_rows():
    lengths = [100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10]
    parts = split_by_tokens(lengths, 2)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert loads == [100, 100]  # one long row alone, ten short ones together
    assert split_by_tokens(lengths, 2) == parts  # deterministic
    assert split_by_tokens([5, 5], 3)[2] == []  # more ranks than rows: an empty share


def test_activation_checkpointing_recomputes_layers_and_keeps_less(tiny_model_dir):
    """Per-layer checkpointing really runs: each layer runs twice per step, fewer bytes are kept for
    backward (the activation memory), and the gradients are the same."""
    from rollhub.trainer.policy import Policy

    batch = make_batch(rows=4)

    def step(checkpointing: bool) -> tuple[int, int, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        policy = Policy(tiny_model_dir, device="cpu", gradient_checkpointing=checkpointing)
        calls = []
        # a module inside the layer: called by the forward and again by the backward's recomputation
        policy.model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        kept = []

        def pack(tensor):
            kept.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, _ = policy.token_logprobs(batch)
            loss = -(logp * batch.advantages).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        return len(calls), sum(kept), grads

    plain_calls, plain_bytes, plain_grads = step(False)
    ckpt_calls, ckpt_bytes, ckpt_grads = step(True)
    assert plain_calls == 1 and ckpt_calls == 2  # the layer really is recomputed in backward
    assert ckpt_bytes < 0.7 * plain_bytes, (ckpt_bytes, plain_bytes)
    for name, grad in plain_grads.items():
        assert torch.allclose(ckpt_grads[name], grad, atol=1e-6), name


@pytest.mark.slow
def test_torchrun_two_ranks_trains_the_sokoban_recipe(tiny_model_dir, tmp_path):
    """`torchrun --nproc-per-node 2 -m rollhub train configs/sokoban_tiny.yaml` with a small budget."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    settings = {
        "run_dir": run_dir,
        "model.path": tiny_model_dir,
        "model.threads": 1,
        "train.steps": 3,
        "sft.episodes": 4,
        "sft.epochs": 1,
        "eval.episodes": 2,
        "eval.samples_per_seed": 1,
        "eval.select.episodes": 0,
        "rollout.groups_per_batch": 2,
    }
    from rollhub.trainer.ranks.launch import free_port

    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port())]
    args += ["-m", "rollhub", "train", str(repo / "configs" / "sokoban_tiny.yaml"), "--no-progress"]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "3 RL steps" in done.stdout
    import json

    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s > 0][:3] == [1, 2, 3]
    assert (run_dir / "sft_done.json").is_file() and (run_dir / "final_model" / "config.json").is_file()


def test_shards_cover_every_row_once_with_equal_row_counts_and_the_global_normaliser():
    from rollhub.trainer.losses import BatchNormaliser, LossConfig
    from rollhub.trainer.ranks.sharding import shard_parts
    from rollhub.trainer.update import plan_step

    batch = make_batch(rows=7)
    plan = plan_step(batch, LossConfig(), minibatches=2, epochs=2, seed=1, ranks=True)
    parts = plan.parts
    assert len(parts) == 4 and sorted(torch.cat(parts[:2]).tolist()) == list(range(7))
    assert plan.proximal == "recompute"  # the ranks' sharded no-grad pass
    shards = shard_parts(batch, plan, 3, prox=None, reference=None)
    for index, rows in enumerate(parts):
        mine = [shards[rank][index] for rank in range(3)]
        assert len({len(part.batch) for part in mine}) == 1  # same row count: same number of forward passes
        whole = BatchNormaliser.from_mask(batch.select(rows.tolist()).response_mask)
        assert all(part.normaliser == whole for part in mine)
        assert sum(part.tokens for part in mine) == whole.num_tokens  # padding rows carry no response token
        real = sum(int((part.batch.attention_mask.sum(-1) > 1).sum()) for part in mine)
        assert real == len(rows)


def prompts(batch) -> list[tuple[int, ...]]:
    """Each real row's prompt (tokens before its first response token); padding rows left out."""
    first = batch.response_mask.gt(0).float().argmax(-1).tolist()
    real = batch.attention_mask.sum(-1).gt(1).tolist()
    return [tuple(batch.input_ids[r, :start].tolist()) for r, start in enumerate(first) if real[r]]


def test_packed_shards_keep_each_prompts_rows_on_one_rank():
    """Packing runs a prompt shared by a group's samples once; split over two ranks, both would run it."""
    from rollhub.trainer.losses import LossConfig
    from rollhub.trainer.ranks.sharding import shard_parts
    from rollhub.trainer.update import plan_step

    batch = make_batch(rows=24, samples=4)
    plan = plan_step(batch, LossConfig(), minibatches=2, epochs=2, seed=5, pack_tokens=64, ranks=True)
    assert plan.proximal == "recompute"  # one process would serve the first mini-batch's rows from its forward
    shards = shard_parts(batch, plan, 2, prox=None, reference=None)
    for index, rows in enumerate(plan.parts):
        mine = [prompts(shards[rank][index].batch) for rank in range(2)]
        assert not set(mine[0]) & set(mine[1])  # no prompt on both ranks
        assert sorted(mine[0] + mine[1]) == sorted(prompts(batch.select(rows.tolist())))  # every row once
        assert mine[0] and mine[1]  # both ranks got work
        assert len(shards[0][index].micro_batches) == len(shards[1][index].micro_batches)  # as many forwards per rank


def test_packed_shards_split_a_prompt_rather_than_leave_a_rank_idle():
    """One prompt answered 6 times and two ranks: both ranks get rows (an idle rank costs more)."""
    from rollhub.trainer.ranks.sharding import split_by_prompt

    batch = make_batch(rows=6, samples=6)
    shares = split_by_prompt(batch, 2)
    assert all(shares) and sorted(shares[0] + shares[1]) == list(range(6))
    balanced = make_batch(rows=8, samples=2)  # four prompts of similar cost: whole prompts per rank
    keys = prompts(balanced)
    ranks_of = {}
    for rank, rows in enumerate(split_by_prompt(balanced, 2)):
        for row in rows:
            ranks_of.setdefault(keys[row], set()).add(rank)
    assert all(len(ranks) == 1 for ranks in ranks_of.values())


def test_metrics_merge_when_a_rank_held_only_padding_rows():
    """A small mini-batch can leave one rank only padding rows: it reports no loss metrics, and
    the merge must take each name from the ranks that reported it (it raised KeyError)."""
    from rollhub.trainer.ranks.sharding import combine_results

    full = {"loss": 0.25, "grad_norm": 2.0, "skipped_nonfinite": 0.0, "local_tokens": 10.0, "offpolicy/w": 0.5}
    padding = {"loss": 0.0, "grad_norm": 2.0, "skipped_nonfinite": 0.0, "local_tokens": 0.0}
    other = {"loss": 0.5, "grad_norm": 3.0, "skipped_nonfinite": 0.0, "local_tokens": 30.0, "offpolicy/w": 1.5}
    out = combine_results([[full, other], [padding, dict(other, local_tokens=10.0, **{"offpolicy/w": 0.5})]], 60.0)
    assert out["offpolicy/w"] == pytest.approx((0.5 + (1.5 * 30 + 0.5 * 10) / 40) / 2)
    assert out["loss"] == pytest.approx((0.25 + 1.0) / 2)
    assert out["optimizer_steps"] == 2.0
