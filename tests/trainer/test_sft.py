"""SFT warm-start: the schedule that keeps the last steps from undoing the warm-start."""

import asyncio

import pytest
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
            out.append(
                await run_episode(env, ExpertEngine(env, tokenizer), tokenizer, AgentConfig(max_new_tokens=12), seed)
            )
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
    after = sft_epochs(policy, demos, epochs=1.0, lr=1e-12, batch_size=8)[0][
        "sft/loss"
    ]  # re-measured, not the logged pre-step loss
    assert after < 0.5 * before


def test_noisy_demos_label_only_expert_turns_and_show_recoveries(tiny_model_dir):
    import random

    from rollhub.trainer.sft import NOISE_TURN, _label_sequences

    policy = Policy(tiny_model_dir, micro_batch_size=8)
    tokenizer = policy.tokenizer
    config = AgentConfig(max_new_tokens=12, observation_only=True)

    async def collect():
        out = []
        for seed in range(12):
            env = envs.make("rollhub/Sokoban-v0", max_steps=20)
            out.append(
                await run_episode(
                    env, ExpertEngine(env, tokenizer, noise=0.4, rng=random.Random(seed)), tokenizer, config, seed
                )
            )
            await env.close()
        return out

    demos = asyncio.run(collect())
    turns = [t for d in demos for t in d.turns]
    noisy = [t for t in turns if t.finish_reason == NOISE_TURN]
    assert 0.2 < len(noisy) / len(turns) < 0.6
    assert any(not t.action_valid for t in noisy)  # random moves do hit walls
    labelled = 0
    for demo in demos:
        sequences = _label_sequences(demo)
        for seq in sequences:
            for masked, index in zip(seq.response_mask, seq.turn_index):
                if masked:
                    assert demo.turns[index].finish_reason != NOISE_TURN
                    labelled += 1
    expert_tokens = sum(len(t.response_ids) for t in turns if t.finish_reason != NOISE_TURN)
    assert labelled == expert_tokens  # every expert token is a label, no random one is
    # some expert labels answer an "Invalid: ..." observation: the recoveries clean demos lack
    after_invalid = [
        b for d in demos for a, b in zip(d.turns, d.turns[1:]) if not a.action_valid and b.finish_reason != NOISE_TURN
    ]
    assert after_invalid and all(tokenizer.decode(t.prompt_ids).count("Invalid:") == 1 for t in after_invalid)
    history = sft_epochs(policy, demos, epochs=1.0, lr=1e-3, batch_size=4)
    assert history and all(h["sft/loss"] > 0 for h in history)


def test_noise_needs_an_env_with_a_random_action():
    import pytest

    from rollhub.envs.base import Env

    class NoRandomAction(Env):
        async def reset(self, *, seed=None, options=None):
            return [], {}

        async def step(self, action):
            return [], 0.0, True, False, {}

    with pytest.raises(ValueError, match="random_action"):
        ExpertEngine(NoRandomAction(), tokenizer=None, noise=0.1)
    ExpertEngine(NoRandomAction(), tokenizer=None)  # without noise the expert alone plays


def test_expert_demos_keep_the_response_budget_rl_samples_with(tiny_model_dir):
    """A one-token budget (bare Sokoban moves) gives one-token demo turns: the layout RL samples."""
    policy = Policy(tiny_model_dir, micro_batch_size=8)
    tokenizer = policy.tokenizer

    async def one(max_new_tokens):
        env = envs.make("rollhub/Sokoban-v0", max_steps=10, action_tag="")
        trajectory = await run_episode(
            env,
            ExpertEngine(env, tokenizer),
            tokenizer,
            AgentConfig(max_new_tokens=max_new_tokens, system_prompt=""),
            3,
        )
        await env.close()
        return trajectory

    short, full = asyncio.run(one(1)), asyncio.run(one(12))
    assert short.success and full.success
    assert all(len(t.response_ids) == 1 and t.response_text in ("up", "down", "left", "right") for t in short.turns)
    assert all(t.response_ids[-1] == tokenizer.eos_token_id and len(t.response_ids) == 2 for t in full.turns)


def test_sft_fits_demos_at_temperature_one_and_restores_the_rl_temperature(tiny_model_dir):
    """A hotter RL temperature must not change the warm-start: the demo loss is the T = 1 loss."""
    demos = _demos(Policy(tiny_model_dir).tokenizer, 4)
    losses = {}
    for temperature in (1.0, 1.7):
        policy = Policy(tiny_model_dir, micro_batch_size=8, temperature=temperature)
        losses[temperature] = sft_epochs(policy, demos, epochs=1.0, lr=1e-12, batch_size=4)[0]["sft/loss"]
        assert policy.temperature == temperature  # RL scores at its own temperature afterwards
    assert abs(losses[1.7] - losses[1.0]) < 1e-6 * max(1.0, losses[1.0])


def test_an_rl_step_after_sft_with_frozen_embeddings_has_the_gradient_norm_of_one_without(tiny_model_dir):
    """SFT trains the embeddings; an RL phase with optim.train_embeddings false must neither see
    SFT's last embedding gradients in its norm nor clip by them: the same weights and batch give
    the same gradient norm whether SFT ran in this process or the weights were loaded."""
    from rollhub.trainer.build import build_optimizer
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.losses import LossConfig
    from rollhub.trainer.policy import TokenBatch
    from rollhub.trainer.update import policy_update

    after_sft = Policy(tiny_model_dir, micro_batch_size=8)
    sft_epochs(after_sft, _demos(after_sft.tokenizer, 4), epochs=1.0, lr=1e-3, batch_size=4)
    assert all(p.grad is None for p in after_sft.model.parameters())  # the phase ends with no gradients
    loaded = Policy(tiny_model_dir, micro_batch_size=8)
    loaded.model.load_state_dict(after_sft.model.state_dict())

    rows, width = 4, 12
    input_ids = torch.randint(3, 200, (rows, width), generator=torch.Generator().manual_seed(0))
    response = torch.zeros(rows, width)
    response[:, width // 2 :] = 1.0
    advantages = torch.linspace(-1.0, 1.0, rows).unsqueeze(1) * response
    batch = TokenBatch(
        input_ids,
        torch.ones_like(input_ids),
        response,
        torch.full((rows, width), -3.0),
        advantages,
        torch.zeros_like(input_ids),
    )
    config = RunConfig()
    config.optim.train_embeddings = False
    norms = []
    for p in after_sft.model.get_input_embeddings().parameters():
        p.grad = torch.ones_like(p)  # what an earlier phase could leave: the norm must not count frozen weights
    for policy in (after_sft, loaded):
        optimizer = build_optimizer(policy, config)
        norms.append(policy_update(policy, optimizer, batch, None, LossConfig(), max_grad_norm=1.0)["grad_norm"])
    assert norms[0] > 0
    assert norms[0] == pytest.approx(norms[1], rel=1e-6)
