"""One MathTool training step with and without `optim.share_prefix`, interleaved in one process.

    python -m experiments.mathtool.prefix_kv_speed [--episodes experiments/mathtool/data/episodes16.jsonl]
        [--rounds 3] [--micro-batch-size 2] [--out experiments/mathtool/results/prefix_kv_speed.json]

The batch is real: MathTool episodes a run of `configs/mathtool_smollm2.yaml` played and logged
(`trajectories.jsonl`, token ids as the engine saw them), merged into sequences by
`Trajectory.packed_sequences` and padded by `collate`, as the trainer does; advantages +1/-1 by
episode. Each round runs the recipe's update (`policy_update`: PPO, seq-mean-token-mean, the recipe's
micro-batch size) once per mode on SmolLM2-135M-Instruct from the same weights, one thread. The
record holds each mode's median seconds, the speed-up, the tokens each mode ran through the decoder
and the largest gradient difference between the modes (relative to the largest entry).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

MODEL = "runs/models/smollm2-135m-instruct"


def load_batch(path: Path, pad_token_id: int) -> Any:
    """The episodes' merged sequences, right-padded, with advantage +1 / -1 by episode."""
    from rollhub.rollout.trajectory_log import read_trajectories
    from rollhub.trainer.policy import collate

    sequences, advantages = [], []
    for number, trajectory in enumerate(read_trajectories(path)):
        sign = 1.0 if number % 2 else -1.0
        for sequence in trajectory.packed_sequences():
            sequences.append(sequence)
            advantages.append([sign * m for m in sequence.response_mask])
    return collate(sequences, advantages, pad_token_id)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=Path, default=Path("experiments/mathtool/data/episodes16.jsonl"))
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("experiments/mathtool/results/prefix_kv_speed.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from rollhub.trainer.losses import LossConfig
    from rollhub.trainer.policy import Policy
    from rollhub.trainer.prefix_kv import shared_length
    from rollhub.trainer.update import policy_update

    modes = {"padded": False, "share_prefix": True}
    policies = {
        name: Policy(args.model, device="cpu", micro_batch_size=args.micro_batch_size, share_prefix=share)
        for name, share in modes.items()
    }
    batch = load_batch(args.episodes, policies["padded"].tokenizer.pad_token_id)
    loss = LossConfig(aggregation="seq-mean-token-mean")
    seconds: dict[str, list[float]] = {name: [] for name in modes}
    tokens: dict[str, int] = {}
    grads: dict[str, torch.Tensor] = {}
    for round_ in range(args.rounds):
        for name, policy in policies.items():
            ran: list[int] = []
            hook = policy.model.get_decoder().register_forward_hook(
                lambda module, inputs, kwargs, out, ran=ran: ran.append(kwargs["input_ids"].numel()), with_kwargs=True
            )
            optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)  # weights stay: every round alike
            start = time.perf_counter()
            policy_update(policy, optimizer, batch, None, loss, max_grad_norm=None)
            seconds[name].append(time.perf_counter() - start)
            hook.remove()
            tokens[name] = sum(ran)
            grads[name] = torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])
            print(f"round {round_ + 1} {name}: {seconds[name][-1]:.1f} s", flush=True)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    scale = float(grads["padded"].abs().max())
    record = {
        "episodes": str(args.episodes),
        "sequences": len(batch),
        "real_tokens": int(batch.attention_mask.sum()),
        "shared_tokens": shared_length(batch.input_ids, batch.attention_mask, batch.response_mask),
        "micro_batch_size": args.micro_batch_size,
        "seconds": seconds,
        "median_s": median,
        "speed_up": median["padded"] / median["share_prefix"],
        "decoder_tokens": tokens,
        "max_grad_difference_relative": float((grads["padded"] - grads["share_prefix"]).abs().max()) / scale,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "seconds"}, indent=2))


if __name__ == "__main__":
    main()
