"""Token exactness with real agent frameworks: the OpenAI Agents SDK and LangChain, each through its own
OpenAI client, on three chat-template families (Qwen-style with tool roles that rewrites history,
SmolLM2's own, Llama-3-style). Every exported id must be an id the engine sampled for exactly
that prompt, every turn must extend the one before, and nothing sampled may go unexported;
LangChain's trimmed last turn must branch (a new root), never fail.

`experiments/gateway_exactness/run.py` runs the same check at 1,000 sessions per framework."""

from __future__ import annotations

import pytest
from gateway_frameworks import run_framework, template_tokenizer


@pytest.fixture(scope="module")
def tokenizers():
    return {}


@pytest.mark.parametrize("family", ["qwen", "smollm2", "llama3"])
@pytest.mark.parametrize("framework", ["agents_sdk", "langchain"])
async def test_framework_sessions_train_on_exactly_the_sampled_ids(framework, family, tokenizers):
    if family not in tokenizers:
        tokenizers[family] = template_tokenizer(family)
    report = await run_framework(framework, family, sessions=10, tokenizer=tokenizers[family])
    assert report.sessions == 10 and report.calls >= 20  # multi-turn: at least two calls a session
    assert report.mismatches == 0 and report.prefix_breaks == 0 and report.unexported_samples == 0
    assert report.turns >= report.calls  # every call is a turn of at least one exported leaf
    assert report.kinds["extend"] >= 10  # the frameworks echo the history back: calls extend
    if framework == "langchain":
        assert report.kinds["new_root"] == 10  # each trimmed history branched, and was exported too
        assert report.leaves == 20
    if family == "qwen":  # the scripted model calls the tool: tool-result messages went through the template
        assert report.calls > 2 * 10
