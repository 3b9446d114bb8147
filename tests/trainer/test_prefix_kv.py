"""A batch's shared opening runs once per step and gives the padded path's log-probs and gradient
(rollhub.trainer.prefix_kv), on real multi-turn Sokoban episodes that share their system prompt."""

import pytest
import torch

from rollhub.trainer.config import RunConfig
from rollhub.trainer.losses import LossConfig
from rollhub.trainer.policy import Policy, TokenBatch
from rollhub.trainer.prefix_kv import MIN_SHARED_TOKENS, shared_length
from rollhub.trainer.update import policy_update, ppo_update
from tests.trainer.test_packing import LOSSES, shifted_reference, sokoban_batch


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    from transformers import AutoTokenizer

    return sokoban_batch(AutoTokenizer.from_pretrained(tiny_model_dir))


def _grad(policy: Policy) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])


def _rows(*rows, response_from):
    ids = torch.tensor(rows)
    mask = torch.ones_like(ids)
    response = torch.zeros(ids.shape)
    for row, start in enumerate(response_from):
        response[row, start:] = 1
    return ids, mask, response


def test_the_shared_length_stops_at_the_first_difference_and_before_the_first_predicted_token():
    # rows differ at position 4: 4 tokens shared
    assert shared_length(*_rows([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 9, 6, 7], response_from=(6, 6))) == 4
    # identical up to 6, but a response token at 3 is predicted from position 2: only 0..2 shared
    assert shared_length(*_rows([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 8], response_from=(3, 5))) == 2
    # identical rows: every row keeps a token of its own to run
    ids, mask, response = _rows([1, 2, 3, 4], [1, 2, 3, 4], response_from=(4, 4))
    assert shared_length(ids, mask, response) == 3
    # padding: the shorter row's real length bounds it
    mask[1, 2:] = 0
    assert shared_length(ids, mask, response) == 1
    assert shared_length(*_rows([1, 2, 3, 4], response_from=(3,))) == 0  # one row shares with nobody


def test_the_episodes_share_a_long_opening(batch):
    length = shared_length(batch.input_ids, batch.attention_mask, batch.response_mask)
    first = int(batch.response_mask.gt(0).float().argmax(-1).min())
    assert MIN_SHARED_TOKENS <= length < first
    assert bool((batch.input_ids[:, :length] == batch.input_ids[:1, :length]).all())
    assert not bool((batch.input_ids[:, : length + 2] == batch.input_ids[:1, : length + 2]).all())


def test_logprobs_and_entropy_read_from_the_shared_opening_match_the_padded_forward(tiny_model_dir, batch):
    policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2, share_prefix=True)
    with torch.no_grad():
        prefix = policy.prefix_kv(batch)
        assert prefix is not None and prefix.length >= MIN_SHARED_TOKENS
        part = batch.slice(1, 4)
        shared = policy.token_logprobs(part, with_entropy=True, with_full=True, prefix=prefix)
        whole = policy.token_logprobs(part, with_entropy=True, with_full=True)
    assert float(part.response_mask.sum()) > 10
    for a, b in zip(shared, whole):
        assert a.shape == b.shape
        assert (a - b).abs().max() < 1e-4
    assert float(whole[0].abs().max()) > 0.1  # the log-probs compared are not all 0


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_update_gives_the_padded_gradient_with_the_opening_run_once(tiny_model_dir, batch, name):
    loss_config = LOSSES[name]
    reference = shifted_reference(tiny_model_dir)
    grads, results, forwards = [], [], []
    for share in (False, True):
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2, share_prefix=share)
        calls = []
        decoder = policy.model.get_decoder()
        decoder.register_forward_hook(
            lambda module, args, kwargs, out, calls=calls: calls.append(kwargs["input_ids"].numel()), with_kwargs=True
        )
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)
        ref = reference.compute_logprobs(batch) if loss_config.kl_estimator == "k3" else None
        out = policy_update(
            policy, optimizer, batch, None, loss_config, max_grad_norm=None, reference=reference, reference_logprobs=ref
        )
        grads.append(_grad(policy))
        results.append(out)
        forwards.append(sum(calls))
    scale = float(grads[0].abs().max())
    assert scale > 1e-4
    assert (grads[0] - grads[1]).abs().max() < 1e-5 * scale
    assert abs(results[0]["loss"] - results[1]["loss"]) < 1e-5
    # the opening ran once instead of once per row: fewer tokens through the decoder
    length = shared_length(batch.input_ids, batch.attention_mask, batch.response_mask)
    assert forwards[0] - forwards[1] >= (len(batch) - 1) * length - batch.input_ids.shape[1]


def test_ppo_minibatches_and_their_proximal_pass_match_the_padded_steps(tiny_model_dir, batch):
    """Two mini-batches (two optimizer steps) and a no-grad proximal pass, each reading the opening."""
    weights = []
    for share in (False, True):
        torch.manual_seed(0)
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=2, share_prefix=share)
        # SGD: the steps are the gradients (Adam would blow float rounding of near-zero entries up to lr)
        optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
        out = ppo_update(policy, optimizer, batch, LossConfig(), minibatches=2, epochs=1, seed=3)
        assert out["optimizer_steps"] == 2
        weights.append(torch.cat([p.detach().flatten() for p in policy.model.parameters()]))
    start = torch.cat([p.detach().flatten() for p in Policy(tiny_model_dir, device="cpu").model.parameters()])
    moved = float((weights[0] - start).abs().max())
    assert moved > 1e-4
    assert float((weights[0] - weights[1]).abs().max()) < 1e-4 * moved


def test_nothing_is_shared_where_it_would_not_pay(tiny_model_dir, batch):
    policy = Policy(tiny_model_dir, device="cpu", share_prefix=True)
    assert policy.prefix_kv(batch.slice(0, 1)) is None  # one row
    different = TokenBatch(*(t.clone() for t in batch._tensors()))
    different.input_ids[1, MIN_SHARED_TOKENS - 2] += 1  # the rows part before MIN_SHARED_TOKENS
    assert policy.prefix_kv(different) is None
    assert Policy(tiny_model_dir, device="cpu").prefix_kv(batch) is None  # off unless asked
    checkpointed = Policy(tiny_model_dir, device="cpu", share_prefix=True, gradient_checkpointing=True)
    assert checkpointed.prefix_kv(batch) is None


def test_the_openings_share_of_the_gradient_arrives_with_backward(tiny_model_dir, batch):
    """Without `backward` the gradient misses what flows through the opening's keys and values."""
    grads = []
    for share in (False, True):
        policy = Policy(tiny_model_dir, device="cpu", micro_batch_size=8, share_prefix=share)
        prefix = policy.prefix_kv(batch)
        logp, _ = policy.token_logprobs(batch, prefix=prefix)
        (logp * batch.advantages).sum().backward()
        if prefix is not None:
            grads.append(_grad(policy).clone())
            assert all(leaf.grad is not None for leaf in prefix.leaves)
            prefix.backward()
        grads.append(_grad(policy))
    full, before, after = grads
    scale = float(full.abs().max())
    assert float((full - before).abs().max()) > 1e-2 * scale
    assert float((full - after).abs().max()) < 1e-5 * scale


def test_share_prefix_refuses_packing_and_checkpointing():
    config = RunConfig()
    config.optim.share_prefix = True
    config.optim.pack_tokens = 2048
    with pytest.raises(ValueError, match="share_prefix"):
        config.validate()
    config.optim.pack_tokens = None
    config.model.gradient_checkpointing = True
    with pytest.raises(ValueError, match="share_prefix"):
        config.validate()


def _llama(out, max_positions: int = 256, **rope):
    import transformers

    from rollhub.inference.models import build_tokenizer

    tokenizer = build_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        **rope,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _shared_vs_whole_gap(model_dir, length: int, width: int) -> float:
    """Max |hidden state| gap between rows run on a shared opening's cache and the same rows run whole."""
    from rollhub.inference.models import load_model_and_tokenizer
    from rollhub.trainer.prefix_kv import PrefixKV

    model, _ = load_model_and_tokenizer(model_dir, dtype=torch.float32, device="cpu")
    decoder = model.get_decoder()
    ids = torch.randint(3, 200, (2, width), generator=torch.Generator().manual_seed(0))
    ids[1, :length] = ids[0, :length]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        whole = decoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, length:]
        prefix = PrefixKV.compute(decoder, ids, length)
        shared = decoder(**prefix.inputs(ids, mask)).last_hidden_state
    return float((whole - shared).abs().max())


def test_length_dependent_rope_is_refused_where_a_shared_opening_would_be_wrong(tmp_path):
    """Dynamic NTK RoPE rotates the opening (12 tokens, inside the 16-position pretraining length) with
    other frequencies than a 40-token row: the shared path is off, so share_prefix refuses it, and
    longrope too; the default RoPE gives the same hidden states and is allowed."""
    from rollhub.core.errors import UserError
    from rollhub.trainer.prefix_kv import length_dependent_rope

    plain = _llama(tmp_path / "plain", max_positions=16)
    dynamic = _llama(tmp_path / "dynamic", max_positions=16, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert _shared_vs_whole_gap(plain, 12, 40) < 1e-5
    assert _shared_vs_whole_gap(dynamic, 12, 40) > 1e-3
    Policy(plain, device="cpu", share_prefix=True)
    Policy(dynamic, device="cpu")  # without share_prefix the model runs whole: nothing to refuse
    with pytest.raises(UserError, match="optim.share_prefix: false"):
        Policy(dynamic, device="cpu", share_prefix=True)
    longrope = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
        "original_max_position_embeddings": 16,
    }
    with pytest.raises(UserError, match="'longrope'"):
        Policy(_llama(tmp_path / "longrope", max_positions=64, rope_scaling=longrope), device="cpu", share_prefix=True)
    assert length_dependent_rope({"default", "yarn", "llama3", "linear"}) is None
    assert length_dependent_rope({"default", "dynamic"}) == "dynamic"
