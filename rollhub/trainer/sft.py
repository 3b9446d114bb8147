"""SFT warm-start on scripted-expert demonstrations, in the exact token layout RL uses.

Demonstrations are produced by running the real agent loop (`run_episode`) with an
`ExpertEngine` in place of the model: every "generation" is the env's `expert_action()`
(a solver move for Sokoban) followed by the end-of-turn token. The resulting trajectories
therefore carry the same prompt ids, chat segments and response layout the policy will
see during RL, and SFT is plain next-token likelihood on their response tokens.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from rollhub.envs.base import Env
from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams
from rollhub.trainer.losses import BatchNormaliser, aggregate
from rollhub.trainer.policy import Policy, collate

logger = logging.getLogger(__name__)


#: finish_reason of a demo turn that played a random move: context for later turns, not a label
NOISE_TURN = "expert_noise"


class ExpertEngine(InferenceEngine):
    """An "engine" that answers with the env's scripted expert (one instance per env).

    With `noise` > 0 it plays the env's `random_action` instead, with that probability, and
    marks the turn (finish_reason NOISE_TURN) so SFT does not learn it (DART-style: the demos
    then show recoveries from off-path states).
    """

    def __init__(self, env: Env, tokenizer: Any, *, noise: float = 0.0, rng: random.Random | None = None):
        if noise > 0 and type(env.unwrapped).random_action is Env.random_action:
            raise ValueError(f"sft.noise plays the env's random_action; {type(env.unwrapped).__name__} has none")
        self.env = env
        self.tokenizer = tokenizer
        self.noise = noise
        self.rng = rng or random.Random(0)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> Generation:
        noisy = self.noise > 0 and self.rng.random() < self.noise
        if noisy:
            text = self.env.random_action(np.random.default_rng(self.rng.getrandbits(32)))
        else:
            text = self.env.expert_action()
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        ids = ids[: sampling.max_new_tokens]  # the layout RL samples: a 1-token budget keeps the move only
        return Generation(
            ids,
            [0.0] * len(ids),
            [0] * len(ids),
            NOISE_TURN if noisy else "stop",
            request_id=request_id or "",
            prompt_tokens=len(input_ids),
        )

    async def update_weights(self, source: Any, version: int) -> None:
        raise NotImplementedError("the expert engine has no weights")

    async def pause(self) -> None:
        return None

    async def resume(self) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        return None


def _label_sequences(trajectory: Any) -> list[Any]:
    """The trajectory's packed sequences, the tokens of noise turns (random moves) taken out of the loss mask."""
    noisy = {i for i, turn in enumerate(trajectory.turns) if turn.finish_reason == NOISE_TURN}
    sequences = trajectory.packed_sequences()
    if not noisy:
        return sequences
    kept = []
    for seq in sequences:
        seq.response_mask = [m and k not in noisy for m, k in zip(seq.response_mask, seq.turn_index)]
        if any(seq.response_mask):
            kept.append(seq)
    return kept


def sft_sequence_count(trajectories: Sequence[Any]) -> int:
    """The labelled sequences `sft_epochs` trains on (one per demo turn)."""
    return sum(len(_label_sequences(t)) for t in trajectories)


def sft_step_count(sequences: int, epochs: float, batch_size: int) -> int:
    """The optimizer steps of `sft_epochs`: whole batches only (a final partial batch would weigh its
    few sequences like a full batch), at least one."""
    return max(1, int(round(sequences * epochs)) // batch_size)


def sft_epochs(
    policy: Policy,
    trajectories: Sequence[Any],
    *,
    epochs: float = 1.0,
    lr: float = 1e-3,
    batch_size: int = 16,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Maximise the likelihood of the demonstrations' response tokens (token-mean NLL).

    `epochs` may be fractional: 0.5 trains on half the shuffled sequences once. Returns
    one metrics dict per optimizer step.

    The demos are fitted at temperature 1, whatever temperature RL later samples at: the
    warm-start is then the same model for every sampling temperature, and a higher RL
    temperature (more exploration) does not also make the SFT model sharper at T = 1.
    """
    sequences = [s for t in trajectories for s in _label_sequences(t)]
    if not sequences:
        raise ValueError("no demonstration sequences to train on")
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=weight_decay)
    rng = random.Random(seed)
    total = sft_step_count(len(sequences), epochs, batch_size) * batch_size
    order: list[int] = []
    while len(order) < total:
        chunk = list(range(len(sequences)))
        rng.shuffle(chunk)
        order.extend(chunk)
    order = order[:total]
    history = []
    num_steps = len(order) // batch_size
    # Warm up, then decay linearly to zero: with a constant lr the tiny model's last steps
    # can undo what it learned, unseen in the logged pre-step batch loss.
    warmup = max(1, num_steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min((i + 1) / warmup, max(0.0, (num_steps - i) / max(1, num_steps - warmup)))
    )
    policy.model.train()
    for step, start in enumerate(range(0, len(order), batch_size), start=1):
        picked = [sequences[i] for i in order[start : start + batch_size]]
        batch = collate(picked, [[0.0] * len(s.input_ids) for s in picked], policy.tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        correct = 0.0
        normaliser = BatchNormaliser.from_mask(batch.response_mask)
        for micro in range(0, len(batch), policy.micro_batch_size):
            part = batch.slice(micro, min(micro + policy.micro_batch_size, len(batch))).to(policy.device)
            with policy.at_temperature(1.0):
                logp, _ = policy.token_logprobs(part)
            loss = -aggregate(logp, part.response_mask, "token-mean", normaliser)
            loss.backward()
            loss_total += float(loss.detach())
            correct += float(((logp.detach() > -0.6931) * part.response_mask).sum())  # p > 0.5
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), max_grad_norm)
        lr_used = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        metrics = {"sft/loss": loss_total, "sft/token_p_gt_half": correct / normaliser.num_tokens, "sft/lr": lr_used}
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
    # The phase ends here: the RL phase that trains this policy next may freeze weights SFT
    # trained (optim.train_embeddings false), and a gradient left on them would be counted in
    # its gradient norm and clipping. None also frees the memory of a full set of gradients.
    optimizer.zero_grad(set_to_none=True)
    return history
