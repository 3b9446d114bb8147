"""SFT warm-start: the schedule that keeps the last steps from undoing the warm-start."""

import asyncio

import torch

import rollhub.envs as envs
from rollhub.rollout.agent import AgentConfig, run_episode
from rollhub.trainer.policy import Policy
from rollhub.trainer.sft import ExpertEngine, sft_epochs

torch.set_num_threads(1)


def _demos(tokenizer, n):
    async def collect():
        out = []
        for seed in range(n):
            env = envs.make("rollhub/Sokoban-v0", max_steps=10)
            out.append(await run_episode(env, ExpertEngine(env, tokenizer), tokenizer, AgentConfig(max_new_tokens=12), seed))
            await env.close()
        return out

    return asyncio.run(collect())


def test_sft_uses_whole_batches_and_decays_lr_to_zero(tiny_model_dir):
    policy = Policy(tiny_model_dir, micro_batch_size=8)
    demos = _demos(policy.tokenizer, 10)  # 10 sequences x 1.5 epochs = 15 -> one whole batch of 4 dropped
    history = sft_epochs(policy, demos, epochs=1.5, lr=1e-3, batch_size=4)
    assert len(history) == 3  # 15 // 4 whole batches; the partial one is not trained
    lrs = [h["sft/lr"] for h in history]  # the lr each step actually used
    assert lrs[0] == 1e-3 and all(a >= b for a, b in zip(lrs, lrs[1:])) and lrs[-1] < 0.6e-3


def test_sft_reduces_the_loss_measured_after_training(tiny_model_dir):
    policy = Policy(tiny_model_dir, micro_batch_size=8)
    demos = _demos(policy.tokenizer, 8)
    before = sft_epochs(policy, demos, epochs=1.0, lr=1e-12, batch_size=8)[0]["sft/loss"]
    sft_epochs(policy, demos, epochs=6.0, lr=2e-3, batch_size=8)
    after = sft_epochs(policy, demos, epochs=1.0, lr=1e-12, batch_size=8)[0]["sft/loss"]  # re-measured, not the logged pre-step loss
    assert after < 0.5 * before
