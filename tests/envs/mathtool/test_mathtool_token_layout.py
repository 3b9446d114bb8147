"""The exact token layout of MathTool-v0 episodes on SmolLM2-135M-Instruct's real tokenizer and template.

A scripted engine stands in for the model (no weights needed) and answers with fixed ids, one of
them a tokenisation the tokenizer would never produce itself, so re-tokenising the history would
show. What is pinned: the tool schema reaches the prompt as the system block (SmolLM2's template
ignores `tools=`), the tool result is appended as `<|im_start|>tool\\n...<|im_end|>\\n` ids after the
generated ids, the second prompt is the first prompt + the generated ids + the template's close +
the reply + the generation prompt, a call cut by the context budget ends as truncation, and a
malformed call comes back as an error message the next prompt shows.
"""

from __future__ import annotations

from typing import Any

import pytest

from rollhub.envs.mathtool.env import MathToolEnv
from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams
from rollhub.rollout.agent import AgentConfig, run_episode
from rollhub.rollout.types import TrajectoryStatus
from rollhub.trainer.evaluate import tool_use_rates
from tests.smollm2_testing import smollm2_tokenizer

CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6599 * 675)"}}</tool_call>'
# the head of seed 1,000,000 of the test split (test problem 0), as SmolLM2's template renders it
HEAD = (
    "<|im_start|>system\n"
    "You are bad at arithmetic. To solve a problem, first call the python tool with code that prints the result; "
    "when its output comes back, copy it into <answer></answer> as an integer, for example <answer>42</answer>.\n\n"
    "Functions you may call, as JSON schemas:\n<tools>\n"
    '{"function": {"description": "Run a short Python program and return what it prints.", "name": "python", '
    '"parameters": {"properties": {"code": {"description": "the program; print the result", "type": "string"}}, '
    '"required": ["code"], "type": "object"}}, "type": "function"}\n</tools>\n'
    'To call a function, write <tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>; '
    "its result comes back in the next message.<|im_end|>\n"
    "<|im_start|>user\nCompute 12 * 345.<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>{"name": "python", "arguments": {"code": "print(12 * 345)"}}</tool_call><|im_end|>\n'
    "<|im_start|>tool\n4140<|im_end|>\n"
    "<|im_start|>assistant\n<answer>4140</answer><|im_end|>\n"
    "<|im_start|>user\nCompute 6599 * 675. Use the python tool.<|im_end|>\n"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return smollm2_tokenizer()


class ScriptedEngine(InferenceEngine):
    """Answers each request with the next scripted ids (cut at the request's max_new_tokens)."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    async def generate(self, input_ids, sampling: SamplingParams, request_id=None) -> Generation:
        self.prompts.append(list(input_ids))
        ids = self.replies.pop(0)
        finish = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        return Generation(ids, [-0.5] * len(ids), [0] * len(ids), finish, request_id=request_id or "")

    async def update_weights(self, source, version):  # pragma: no cover - not used
        raise NotImplementedError

    async def pause(self):  # pragma: no cover
        pass

    async def resume(self):  # pragma: no cover
        pass

    async def abort(self, request_id):  # pragma: no cover
        pass


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


async def test_two_turn_episode_token_layout_is_pinned(tokenizer):
    im_start, im_end = tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (im_start, im_end) == (1, 2)
    # turn 1: the call, with "print" spelled one character per token (never the canonical ids)
    before, after = CALL.split("print", 1)
    odd = encode(tokenizer, before) + [encode(tokenizer, c)[0] for c in "print"] + encode(tokenizer, after)
    assert odd != encode(tokenizer, CALL)
    first = odd + [im_end]
    second = encode(tokenizer, "<answer>4454325</answer>") + [im_end]
    engine = ScriptedEngine([first, second])
    env = MathToolEnv(split="test")
    config = AgentConfig(max_new_tokens=64, max_context_tokens=1024, temperature=0.0)
    trajectory = await run_episode(env, engine, tokenizer, config, seed=1_000_000, env_id="rollhub/MathTool-v0")

    assert trajectory.status == TrajectoryStatus.COMPLETED and trajectory.success
    assert trajectory.info["tool_calls"] == 1 and trajectory.info["tool_call_errors"] == 0
    assert trajectory.info["env_metrics"]["valid_calls"] == 1  # the env's own count, kept by the agent
    assert tool_use_rates([trajectory]) == (1.0, 1.0)
    assert [t.reward for t in trajectory.turns] == [0.0, 1.0]
    head = encode(tokenizer, HEAD)
    generation_prompt = encode(tokenizer, "<|im_start|>assistant\n")
    close = encode(tokenizer, "\n")  # after the generated <|im_end|>
    reply = encode(tokenizer, "<|im_start|>tool\n4454325<|im_end|>\n")
    assert generation_prompt == [im_start, 520, 9531, 198] and close == [198]
    assert reply == [im_start, 19324, 198, 36, 36, 37, 36, 35, 34, 37, im_end, 198]  # one id per digit
    assert engine.prompts[0] == head + generation_prompt
    assert len(head) == 293  # 289 before the system prompt stated the answer form (" as an integer")
    assert engine.prompts[1] == head + generation_prompt + first + close + reply + generation_prompt
    assert trajectory.turns[0].response_ids == first and trajectory.turns[1].response_ids == second
    assert trajectory.turns[1].prompt_ids == engine.prompts[1]
    # the whole episode as text, exactly
    full = engine.prompts[1] + second
    assert tokenizer.decode(full) == (
        HEAD + "<|im_start|>assistant\n" + CALL + "<|im_end|>\n<|im_start|>tool\n4454325<|im_end|>\n"
        "<|im_start|>assistant\n<answer>4454325</answer><|im_end|>"
    )


async def test_a_turn_cut_by_the_context_budget_ends_as_truncation(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = encode(tokenizer, CALL) + [im_end]
    engine = ScriptedEngine([call, call])
    env = MathToolEnv(split="test")
    # room for the first turn, but the tool's reply leaves less than min_new_tokens for the second
    config = AgentConfig(max_new_tokens=64, min_new_tokens=16, max_context_tokens=289 + 4 + len(call) + 20)
    trajectory = await run_episode(env, engine, tokenizer, config, seed=1_000_000)
    assert trajectory.status == TrajectoryStatus.TRUNCATED
    assert trajectory.info["truncated_reason"] == "context" and not trajectory.success
    assert len(trajectory.turns) == 1 and trajectory.total_reward == 0

    # a call cut mid-way by max_new_tokens is an unterminated call: a format error the agent is told about
    engine = ScriptedEngine([call, encode(tokenizer, "<answer>0</answer>") + [im_end]])
    config = AgentConfig(max_new_tokens=12, max_context_tokens=1024)
    trajectory = await run_episode(env, engine, tokenizer, config, seed=1_000_000)
    assert trajectory.turns[0].finish_reason == "length" and not trajectory.turns[0].format_ok
    assert trajectory.info["tool_call_errors"] == 1 and trajectory.info["format_errors"] == 1
    told = tokenizer.decode(engine.prompts[1][len(engine.prompts[0]) :])
    assert "<|im_start|>user\nTool call error: unterminated <tool_call>" in told


async def test_a_malformed_call_is_a_format_error_the_next_prompt_shows(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    bad = encode(tokenizer, '<tool_call>{"name": "python", "arguments": {"code": "print(1)"</tool_call>') + [im_end]
    unknown = encode(tokenizer, '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>') + [im_end]
    answer = encode(tokenizer, "<answer>1</answer>") + [im_end]
    engine = ScriptedEngine([bad, unknown, answer])
    env = MathToolEnv(split="test")
    trajectory = await run_episode(env, engine, tokenizer, AgentConfig(max_context_tokens=1024), seed=1_000_000)
    assert [t.format_ok for t in trajectory.turns] == [False, False, True]
    assert [t.action_valid for t in trajectory.turns] == [False, False, True]
    assert trajectory.info["tool_call_errors"] == 2 and trajectory.info["format_errors"] == 2
    # neither reply held a readable call of a tool the agent has: no call, and none ran
    assert tool_use_rates([trajectory]) == (0.0, 0.0)
    second = tokenizer.decode(engine.prompts[1][len(engine.prompts[0]) :])
    third = tokenizer.decode(engine.prompts[2][len(engine.prompts[1]) :])
    assert "Tool call error: tool call is not valid JSON" in second
    assert "Tool call error: unknown tool 'bash'" in third
    assert trajectory.status == TrajectoryStatus.COMPLETED and not trajectory.success


async def test_a_lone_surrogate_printed_by_the_tool_ends_nothing(tokenizer):
    """A program can print a lone surrogate ('\\ud800'), which the tokenizer refuses: the episode must
    go on (a crash here was an infra failure the policy could use to redraw a failed episode)."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    code = '<tool_call>{"name": "python", "arguments": {"code": "print(\'\\\\ud800\')"}}</tool_call>'
    call = encode(tokenizer, code) + [im_end]
    answer = encode(tokenizer, "<answer>0</answer>") + [im_end]
    engine = ScriptedEngine([call, answer])
    env = MathToolEnv(split="test")
    trajectory = await run_episode(env, engine, tokenizer, AgentConfig(max_context_tokens=1024), seed=1_000_000)
    assert trajectory.status == TrajectoryStatus.COMPLETED and len(trajectory.turns) == 2
    assert tool_use_rates([trajectory]) == (1.0, 1.0)  # the call ran; its output reached the next prompt
    assert "?" in tokenizer.decode(engine.prompts[1][len(engine.prompts[0]) :])
