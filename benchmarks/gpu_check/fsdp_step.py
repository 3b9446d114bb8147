"""One trainer step the way a GPU run takes it: FSDP2 over the ranks torchrun started, bf16
compute, fp32 master weights (parameters, gradients and Adam state), on a synthetic batch whose
advantages are never all zero (so the update really runs). Prints the step's time split and
fails when a dtype is not what the recipe promises.

    python -m torch.distributed.run --standalone --nproc-per-node N benchmarks/gpu_check/fsdp_step.py MODEL DEVICE
"""

from __future__ import annotations

import json
import random
import sys
import time

import torch
import torch.distributed as dist


def synthetic_batch(rows: int, seed: int = 0):
    from rollhub.rollout.types import PackedSequence
    from rollhub.trainer.policy import collate

    rng = random.Random(seed)
    sequences, advantages = [], []
    for row in range(rows):
        prompt = [rng.randrange(3, 200) for _ in range(rng.randrange(8, 64))]
        response = [rng.randrange(3, 200) for _ in range(rng.randrange(4, 32))]
        sequence = PackedSequence()
        sequence.extend(prompt, mask=False, turn_index=-1)
        sequence.extend(
            response, mask=True, turn_index=0, logprobs=[-5.0] * len(response), versions=[0] * len(response)
        )
        sequences.append(sequence)
        value = 1.0 if row % 2 == 0 else -1.0
        advantages.append([0.0] * len(prompt) + [value] * len(response))
    return collate(sequences, advantages, 0)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    from rollhub.trainer.losses import LossConfig
    from rollhub.trainer.policy import Policy
    from rollhub.trainer.ranks.group import RankGroup, init_ranks

    model_dir, device = sys.argv[1], sys.argv[2]
    context = init_ranks("auto", 600.0, device)
    group = RankGroup(context)
    policy = Policy(model_dir, device=context.device, micro_batch_size=4, fsdp=True, dtype="bfloat16")
    optimizer = torch.optim.AdamW(list(policy.parameters()), lr=1e-5)
    if not context.is_leader:
        group.attach(policy, optimizer)
        group.serve(lambda payload: (policy, optimizer, None))
        dist.destroy_process_group()
        return
    group.attach(policy, optimizer)
    group.start({})
    batch = synthetic_batch(8)
    timings = {}
    sync(context.device)
    started = time.perf_counter()
    metrics = group.ppo_update(policy, optimizer, batch, LossConfig(), minibatches=1, seed=0)
    sync(context.device)
    timings["update_s"] = time.perf_counter() - started
    started = time.perf_counter()
    state = policy.engine_state_dict()
    sync(context.device)
    timings["gather_s"] = time.perf_counter() - started
    params = {p.dtype for p in policy.parameters()}
    states = {v.dtype for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.ndim > 0}
    problems = []
    if params != {torch.float32}:
        problems.append(f"master weights are {params}, not float32")
    if states and states != {torch.float32}:
        problems.append(f"Adam state is {states}, not float32")
    if policy.dtype != torch.bfloat16:
        problems.append(f"compute dtype is {policy.dtype}, not bfloat16")
    if "train/loss" not in metrics and "loss" not in json.dumps(list(metrics)):
        problems.append(f"no loss in the step's metrics: {sorted(metrics)[:10]}")
    group.stop()
    dist.destroy_process_group()
    print(
        f"fsdp step: {context.world_size} rank(s) on {context.device} ({context.backend}), bf16 compute, "
        f"fp32 master: update {timings['update_s']:.2f} s, full-state gather {timings['gather_s']:.2f} s, "
        f"{len(state)} tensors"
    )
    if problems:
        sys.exit("gpu_check: " + "; ".join(problems))


if __name__ == "__main__":
    main()
