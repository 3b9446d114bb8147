"""Packed micro-batches give the log-probs and the gradient of padded ones (rollhub.trainer.packing).

The batch is built the way the trainer builds it: real Sokoban episodes (the env's own
observations, full history, chat template of the tiny model's tokenizer) of 1 to 9 turns (144 to 455 tokens),
merged by `Trajectory.packed_sequences` and right-padded by `collate`, so sequence lengths
differ several-fold, as multi-turn agent batches do.
"""

import asyncio
import random

import pytest
import torch

from rollhub.envs import make
from rollhub.rollout.types import Trajectory, Turn
from rollhub.trainer.losses import LossConfig
from rollhub.trainer.packing import (
    pack_rows,
    packed_model_inputs,
    plan_packed_micro_batches,
    plan_padded_micro_batches,
    prompt_split,
    shared_prefixes,
)
from rollhub.trainer.policy import Policy, TokenBatch, collate
from rollhub.trainer.update import policy_update, ppo_update

MOVES = ["up", "down", "left", "right"]


async def _episode(tokenizer, seed: int, turns: int) -> Trajectory:
    rng = random.Random(seed)
    env = make("rollhub/Sokoban-v0", max_steps=20)
    messages, _ = await env.reset(seed=seed)
    history = list(messages)
    played = []
    for _ in range(turns):
        prompt = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        answer = f"<action>{rng.choice(MOVES)}</action>"
        response_ids = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        played.append(
            Turn(
                prompt_ids=prompt_ids,
                response_ids=response_ids,
                behaviour_logprobs=[-rng.uniform(0.5, 4.0) for _ in response_ids],
                token_versions=[0] * len(response_ids),
                reward=rng.choice([0.0, 1.0]),
            )
        )
        observation, _, terminated, truncated, _ = await env.step(answer)
        history += [{"role": "assistant", "content": answer}, *observation]
        if terminated or truncated:
            break
    await env.close()
    # each prompt extends the previous one: packed_sequences merges the turns into one sequence
    return Trajectory(env_id="rollhub/Sokoban-v0", seed=seed, turns=played)


def sokoban_batch(tokenizer, turn_counts=(1, 9, 2, 5, 1, 3)) -> TokenBatch:
    async def episodes():
        return [await _episode(tokenizer, seed, n) for seed, n in enumerate(turn_counts)]

    sequences = [s for t in asyncio.run(episodes()) for s in t.packed_sequences()]
    advantages = [[(1.0 if k % 2 else -0.7) * m for m in s.response_mask] for k, s in enumerate(sequences)]
    return collate(sequences, advantages, tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    from transformers import AutoTokenizer

    return sokoban_batch(AutoTokenizer.from_pretrained(tiny_model_dir))


def _grad(policy: Policy) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])


def test_the_batch_has_very_different_lengths(batch):
    lengths = batch.attention_mask.sum(-1)
    assert lengths.max() > 3 * lengths.min()


def test_plan_respects_the_budget_and_takes_every_row_once():
    lengths = [300, 17, 120, 45, 260, 8, 75, 200, 900]
    plan = plan_packed_micro_batches(lengths, 400)
    assert sorted(row for group in plan for row in group) == list(range(len(lengths)))
    for group in plan:
        assert sum(lengths[row] for row in group) <= 400 or len(group) == 1
    assert [8] in plan  # longer than the budget: alone
    assert len(plan) < len(lengths)
    assert plan_padded_micro_batches(5, 2) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError):
        plan_packed_micro_batches(lengths, 0)


def test_packed_rows_keep_sequences_apart():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [4, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    packed = pack_rows(ids, mask)  # all in one row
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 4]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    allowed = packed.attention_mask_4d()[0, 0]
    assert allowed[3].tolist() == [False, False, False, True, False, False]  # row 2's first token: itself only
    assert allowed[2].tolist() == [True, True, True, False, False, False]
    additive = packed.attention_mask_4d(torch.float32)[0, 0]
    assert additive[3, 0] == torch.finfo(torch.float32).min and additive[3, 3] == 0
    rows = pack_rows(ids, mask, row_tokens=3)  # rows as long as the longest sequence: [5 6 7] and [8 9 4]
    assert rows.input_ids.tolist() == [[5, 6, 7], [8, 9, 4]]
    assert [t.tolist() for t in rows.packed_index(torch.tensor([1, 2]), torch.tensor([1, 0]))] == [[1, 1], [1, 2]]
    padded = pack_rows(ids[:2], mask[:2], row_tokens=3)  # [5 6 7] and [8 9 pad]: padding sees only itself
    assert padded.attention_mask_4d()[1, 0, 2].tolist() == [False, False, True]
    with pytest.raises(ValueError, match="right-padded"):
        pack_rows(ids, torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]))


def test_the_tiny_model_honours_a_4d_mask(tiny_model_dir):
    """The model's attention (SDPA) uses the 4D mask as given: a packed row equals two separate rows."""
    policy = Policy(tiny_model_dir, device="cpu")
    decoder = policy.model.get_decoder()
    assert policy.model.config._attn_implementation == "sdpa"
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    packed = pack_rows(ids, torch.ones_like(ids))
    with torch.no_grad():
        separate = decoder(input_ids=ids).last_hidden_state.reshape(6, -1)
        together = decoder(**packed_model_inputs(packed, decoder)).last_hidden_state[0]
        plain = decoder(input_ids=packed.input_ids).last_hidden_state[0]  # no mask: row 2 sees row 1
    assert torch.allclose(separate, together, atol=1e-5)
    assert not torch.allclose(separate[3:], plain[3:], atol=1e-3)


@pytest.mark.parametrize("budget", [64, 100_000])
def test_packed_logprobs_entropy_and_distributions_match_padded(tiny_model_dir, batch, budget):
    policy = Policy(tiny_model_dir, device="cpu", temperature=0.7, micro_batch_size=3)
    with torch.no_grad():
        padded = policy.token_logprobs(batch, with_entropy=True, with_full=True)
        packed = policy.token_logprobs(batch, with_entropy=True, with_full=True, packed=True)
        assert batch.response_mask.sum() > 50
        for a, b in zip(padded, packed):
            assert (a - b).abs().max() < 1e-5
        whole = policy.compute_logprobs(batch)
        planned = policy.compute_logprobs(batch, pack_tokens=budget)
    assert planned.shape == whole.shape
    assert (whole - planned).abs().max() < 1e-5


LOSSES = {
    "ppo": LossConfig(),
    "exact_kl_entropy": LossConfig(kl_coef=0.3, kl_estimator="full", entropy_coef=0.05),
    "k3_seq_mean": LossConfig(kl_coef=0.3, kl_estimator="k3", aggregation="seq-mean-token-mean"),
}


def shifted_reference(model_dir) -> Policy:
    """A reference policy that differs from the policy a little, so a KL term has a gradient."""
    reference = Policy(model_dir, device="cpu", micro_batch_size=3)
    with torch.no_grad():
        for p in reference.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return reference


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_packed_update_gives_the_padded_gradient(tiny_model_dir, batch, name):
    loss_config = LOSSES[name]
    reference = shifted_reference(tiny_model_dir)
    grads, results = [], []
    for pack_tokens in (None, 1000):
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)
        ref = reference.compute_logprobs(batch) if loss_config.kl_estimator == "k3" else None
        out = policy_update(
            policy,
            optimizer,
            batch,
            None,
            loss_config,
            max_grad_norm=None,
            reference=reference,
            reference_logprobs=ref,
            pack_tokens=pack_tokens,
        )
        grads.append(_grad(policy))
        results.append(out)
    scale = float(grads[0].abs().max())
    assert scale > 1e-4
    # 1e-5 of the largest gradient entry: float32 rounding of different matmul shapes, nothing more
    assert (grads[0] - grads[1]).abs().max() < 1e-5 * scale
    assert results[1]["micro_batches"] < results[0]["micro_batches"]
    assert abs(results[0]["loss"] - results[1]["loss"]) < 1e-5
    if loss_config.kl_coef:
        key = "kl_reference_full" if loss_config.kl_estimator == "full" else "kl_reference_k3"
        assert results[0][key] > 0 and abs(results[0][key] - results[1][key]) < 1e-6


def test_packed_ppo_epochs_share_the_proximal_pass_and_take_the_padded_steps(tiny_model_dir, batch, monkeypatch):
    """minibatches x epochs with a recomputed pi_prox: same weights after 4 steps, a smaller no-grad pass."""
    weights, prox_rows = [], []
    for pack_tokens in (None, 1000):
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=3)

        def counting(part, original=policy.compute_logprobs, **kwargs):
            prox_rows.append(len(part))
            return original(part, **kwargs)

        monkeypatch.setattr(policy, "compute_logprobs", counting)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.05)
        out = ppo_update(
            policy, optimizer, batch, LossConfig(), minibatches=2, epochs=2, seed=5, pack_tokens=pack_tokens
        )
        assert out["optimizer_steps"] == 4
        weights.append(torch.cat([p.detach().flatten() for p in policy.model.parameters()]))
    assert prox_rows == [len(batch), len(batch) - (len(batch) + 1) // 2]
    assert (weights[0] - weights[1]).abs().max() < 1e-5


def test_pack_tokens_is_range_checked():
    from rollhub.trainer.config import OptimConfig

    with pytest.raises(ValueError, match="pack_tokens"):
        OptimConfig(pack_tokens=0).validate()
    OptimConfig(pack_tokens=2048).validate()


def test_shared_prefixes_groups_rows_that_need_the_same_tokens():
    ids = torch.tensor([[1, 2, 3, 4, 0], [1, 2, 3, 5, 0], [1, 2, 9, 9, 9], [1, 2, 3, 4, 7], [6, 6, 0, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    response = torch.zeros(5, 5)
    response[0, 3] = response[1, 3] = 1  # one-token answers to the same prompt [1, 2, 3]
    response[2, 3:] = 1
    response[3, 3:] = 1  # needs [1, 2, 3, 4], which holds [1, 2, 3]
    shared = shared_prefixes(ids, attention, response)  # row 4 has no response: nothing to run
    assert shared.hosts == [2, 3]
    assert shared.host[:4] == [3, 3, 2, 3]
    assert shared.needed == [4, 4]


def _one_token_answers(batch: TokenBatch) -> TokenBatch:
    """Three prompts of `batch`, four one-token answers each (the recipe's Markov layout)."""
    rows = []
    for row in range(3):  # three prompts, four one-token answers each
        n = int(batch.attention_mask[row].sum()) - 1
        for answer in (11, 12, 13, 11):
            rows.append(batch.input_ids[row, :n].tolist() + [answer])
    width = max(len(r) for r in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    response = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r)
        attention[i, : len(r)] = 1
        response[i, len(r) - 1] = 1
    advantages = response * torch.linspace(-1, 1, len(rows)).unsqueeze(1)
    return TokenBatch(input_ids, attention, response, -2.0 * response, advantages, torch.zeros_like(input_ids))


def test_one_token_answers_to_one_prompt_share_the_forward_exactly(tiny_model_dir, batch):
    """Group samples of one board: packed runs the prompt once, same log-probs and gradient as
    padded rows that each run it."""
    shared_batch = _one_token_answers(batch)
    input_ids, attention, response = shared_batch.input_ids, shared_batch.attention_mask, shared_batch.response_mask
    assert len(shared_prefixes(input_ids, attention, response).hosts) == 3
    grads, logps = [], []
    for pack_tokens in (None, 4096):
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=4)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)
        logps.append(policy.compute_logprobs(shared_batch, pack_tokens=pack_tokens))
        policy_update(policy, optimizer, shared_batch, None, LossConfig(), max_grad_norm=None, pack_tokens=pack_tokens)
        grads.append(_grad(policy))
    assert (logps[0] - logps[1]).abs().max() < 1e-5
    assert (grads[0] - grads[1]).abs().max() < 1e-5 * float(grads[0].abs().max())


def test_prompt_split_keeps_a_prompts_rows_together_and_balances_the_parts():
    generator = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, 4, (60, 2))  # 16 possible prompts, repeated
    input_ids = torch.cat([prompts, torch.randint(0, 9, (60, 1))], dim=1)
    response = torch.zeros(60, 3)
    response[:, 2] = 1
    groups = {tuple(row[:2].tolist()) for row in input_ids}
    for parts in (1, 4, 7):
        split = prompt_split(input_ids, response, parts, generator)
        assert len(split) == min(parts, len(groups))
        assert sorted(torch.cat(split).tolist()) == list(range(60))  # every row once
        owner = {}
        for number, rows in enumerate(split):
            for row in rows.tolist():
                assert owner.setdefault(tuple(input_ids[row, :2].tolist()), number) == number
        sizes = [len(rows) for rows in split]
        assert max(sizes) - min(sizes) <= 2 * max(
            sum(1 for r in input_ids if tuple(r[:2].tolist()) == g) for g in groups
        )

    def draw(generator: torch.Generator) -> list[list[int]]:
        return [rows.tolist() for rows in prompt_split(input_ids, response, 4, generator)]

    seeded = torch.Generator().manual_seed(9)
    first = draw(seeded)
    assert first == draw(torch.Generator().manual_seed(9))  # a resumed run draws the same parts
    assert draw(seeded) != first  # and each epoch its own


def test_packed_mini_batches_forward_each_prompt_once_per_step(tiny_model_dir, batch, monkeypatch):
    """3 prompts x 4 answers in 3 mini-batches: a random row split would forward most prompts in
    several mini-batches; the prompt split forwards each once."""
    import rollhub.trainer.packing as packing

    shared_batch = _one_token_answers(batch)
    hosts = []

    def counting(*args, original=packing.shared_prefixes):
        result = original(*args)
        hosts.append(len(result.hosts))
        return result

    monkeypatch.setattr(packing, "shared_prefixes", counting)
    policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=4)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.01)
    out = ppo_update(
        policy, optimizer, shared_batch, LossConfig(proximal="behaviour"), minibatches=3, seed=1, pack_tokens=4096
    )
    assert out["optimizer_steps"] == 3
    assert hosts == [1, 1, 1]
