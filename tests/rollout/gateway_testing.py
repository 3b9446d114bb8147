"""Helpers of the gateway tests: tiny real models with known habits, an engine that records
what it sampled, and a gateway served on a loopback port."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import torch
from aiohttp import web

from rollhub.inference.engines.base import InferenceEngine
from rollhub.rollout.gateway import Gateway, build_gateway_app

#: the tool call the scripted model writes: `{"name":"add"}` tokenises into distinct tokens on
#: the reasoning tokenizer, so a model that maps each token to the next can write it
SCRIPT_CALL = '<tool_call>{"name":"add"}</tool_call>'

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers (both default to 0).",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def _qwen3(tokenizer: Any, hidden: int, seed: int) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden // 2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).eval()


def scripted_tool_model(tokenizer: Any, strength: float = 12.0, seed: int = 0) -> Any:
    """A real Qwen3 over `tokenizer` that, from the generation prompt's last token, tends to
    write `SCRIPT_CALL` and its end-of-turn token.

    Attention and MLP outputs are zeroed, so each position's hidden state is its token's
    embedding: a bigram model. The script's tokens (all distinct) embed one-hot and each
    one's logit row gives its successor `strength`; every other token embeds to zero, so the
    next token is uniform over the vocabulary (special tokens included). At temperature 1
    a step leaves the script with probability ~ vocab * exp(-strength), so some replies are
    clean calls, some garbage, some calls inside garbage: hostile output for free.
    """
    chain_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
    start = tokenizer.encode(chain_text, add_special_tokens=False)[-1]
    chain = [start, *tokenizer.encode(SCRIPT_CALL, add_special_tokens=False), tokenizer.eos_token_id]
    assert len(set(chain)) == len(chain), "the scripted call must tokenise into distinct tokens"
    hidden = 32
    model = _qwen3(tokenizer, hidden, seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        for position, (token, successor) in enumerate(zip(chain, chain[1:])):
            model.model.embed_tokens.weight[token, position] = 1.0
            model.lm_head.weight[successor, position] = strength / math.sqrt(hidden)
    return model


def random_model(tokenizer: Any, seed: int = 0) -> Any:
    """A random-init Qwen3 over `tokenizer`: random text, rarely its stop token."""
    return _qwen3(tokenizer, 32, seed)


def stop_prone_model(tokenizer: Any, seed: int = 0) -> Any:
    """A random Qwen3 over `tokenizer` that writes random text and often its end-of-turn token
    (the final norm keeps one hidden dimension, which only the stop token reads)."""
    model = _qwen3(tokenizer, 32, seed)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.eos_token_id, 0] = 8.0
    return model


class SampleLog(InferenceEngine):
    """Passes requests to the real engine and keeps each (prompt ids, sampled ids) pair as it returns."""

    def __init__(self, inner: InferenceEngine) -> None:
        self.inner = inner
        self.pairs: list[tuple[tuple[int, ...], list[int]]] = []
        self.max_positions = getattr(inner, "max_positions", 4096)

    async def generate(self, input_ids, sampling, request_id=None):
        generation = await self.inner.generate(input_ids, sampling, request_id)
        self.pairs.append((tuple(input_ids), list(generation.token_ids)))
        return generation

    def sampled_for(self, prompt: list[int]) -> list[list[int]]:
        return [output for p, output in self.pairs if p == tuple(prompt)]

    async def update_weights(self, source, version):
        await self.inner.update_weights(source, version)

    async def pause(self):
        await self.inner.pause()

    async def resume(self):
        await self.inner.resume()

    async def abort(self, request_id):
        await self.inner.abort(request_id)


@contextlib.asynccontextmanager
async def served(gateway: Gateway) -> AsyncIterator[str]:
    """`gateway` on a free loopback port; yields its root URL."""
    runner = web.AppRunner(build_gateway_app(gateway))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
