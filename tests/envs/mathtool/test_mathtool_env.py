"""rollhub/MathTool-v0 with the embedded backend: problems, split, turns, malformed calls, rewards."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rollhub.envs.checker import check_env
from rollhub.envs.mathtool.env import MathToolEnv
from rollhub.envs.mathtool.problems import (
    KINDS,
    generate_problem,
    held_out_problems,
    in_test_partition,
    problem_key,
)
from rollhub.envs.registry import make


def call(code: str, name: str = "python", key: str = "code") -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': {key: code}})}</tool_call>"


def test_problems_are_deterministic_from_the_seed_and_integer_valued():
    for kind in KINDS:
        first = [generate_problem(np.random.default_rng(s), (kind,)) for s in range(20)]
        again = [generate_problem(np.random.default_rng(s), (kind,)) for s in range(20)]
        assert first == again
        assert len({p.question for p in first}) >= 18  # the space is large
        for problem in first:
            int(problem.answer)  # an integer answer


def test_product_answers_are_the_product_of_the_stated_numbers():
    problem = generate_problem(np.random.default_rng(3), ("product",))
    a, b = problem.question.removeprefix("Compute ").rstrip(".").split(" * ")
    assert int(problem.answer) == int(a) * int(b) and 100 <= int(b) <= 999


def test_test_list_is_fixed_distinct_and_held_out_and_train_never_draws_it():
    test = held_out_problems(KINDS, 200)
    assert len({problem_key(p.question) for p in test}) == 200
    assert all(in_test_partition(p.question) for p in test)
    assert test == held_out_problems.__wrapped__(KINDS, 200)  # deterministic (not just cached)
    env = MathToolEnv(split="train")
    keys = set(env.task_set() or {}) | {problem_key(p.question) for p in test}
    assert env.could_draw(keys) == set()
    test_env = MathToolEnv(split="test")
    assert set(test_env.task_set() or {}) == {problem_key(p.question) for p in test}


async def test_train_split_draws_no_test_problem_and_test_split_walks_the_list():
    env = MathToolEnv(split="train")
    for seed in range(300):
        await env.reset(seed=seed)
        assert not in_test_partition(env.problem.question)
    test_env = MathToolEnv(split="test", test_size=50)
    seen = set()
    for seed in range(50):
        await test_env.reset(seed=seed)
        seen.add(test_env.task_key())
    assert len(seen) == 50


async def test_registered_and_passes_the_env_checker():
    warnings = await check_env("rollhub/MathTool-v0", env_kwargs={"split": "test"})
    assert not warnings, warnings
    env = make("rollhub/MathTool-v0", split="test")
    assert env.chat_template_tools and [t["function"]["name"] for t in env.tools] == ["python"]


async def test_call_then_answer_earns_the_reward():
    env = MathToolEnv(split="test")
    obs, info = await env.reset(seed=0)
    roles = [m["role"] for m in obs]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]  # the worked example
    question = env.problem.question
    expression = question.removeprefix("Compute ").rstrip(".") if question.startswith("Compute") else None
    code = f"print({expression})" if expression else f"print({env.problem.answer})"
    reply, reward, terminated, truncated, info = await env.step(call(code))
    assert reply[0]["role"] == "tool" and reward == 0 and not (terminated or truncated)
    assert info["action_valid"] and info["tool_ok"] and info["anchor"] != (question, "")
    output = reply[0]["content"]
    if expression:
        assert output == env.problem.answer
    _, reward, terminated, _, info = await env.step(f"<answer>{env.problem.answer}</answer>")
    assert reward == 1.0 and terminated and info["success"]
    assert info["metrics"]["tool_calls"] == 1 and info["metrics"]["valid_calls"] == 1


async def test_a_wrong_or_untagged_answer_scores_zero():
    env = MathToolEnv(split="test")
    await env.reset(seed=1)
    _, reward, terminated, _, info = await env.step(f"<answer>{int(env.problem.answer) + 1}</answer>")
    assert reward == 0 and terminated and not info["success"]
    await env.reset(seed=1)
    _, reward, terminated, truncated, info = await env.step(f"The answer is {env.problem.answer}.")
    assert reward == 0 and not info["success"] and not info["format_ok"]


@pytest.mark.parametrize(
    "reply, reason",
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>', "unknown tool"),
        ('<tool_call>{"name": "python", "arguments": {"program": "1"}}</tool_call>', "needs a string argument"),
        ('<tool_call>{"name": "python", "arguments": {"code": 5}}</tool_call>', "needs a string argument"),
        ('<tool_call>{"name": "python", "arguments": {"code": "1"}}', "unterminated"),
        ("I think it is big.", "no answer found"),
    ],
)
async def test_malformed_calls_are_invalid_and_the_agent_is_told_how_to_call(reply, reason):
    env = MathToolEnv(split="test", max_turns=3)
    await env.reset(seed=2)
    obs, reward, terminated, truncated, info = await env.step(reply)
    assert not info["action_valid"] and reason in info["invalid_reason"]
    assert reward == 0 and not terminated and not truncated
    assert reason.lower() in obs[0]["content"].lower() and '<tool_call>{"name": "python"' in obs[0]["content"]
    # the hint shows a placeholder: a small model copied a concrete call (print(12 * 345)) verbatim
    assert '"print(...)"' in obs[0]["content"] and "12 * 345" not in obs[0]["content"]
    if "needs" not in reason:
        assert not info["format_ok"]
    # the episode goes on: a good call still works
    _, _, _, _, info = await env.step(call("print(2 + 2)"))
    assert info["action_valid"] and info["tool_ok"]


async def test_the_last_turn_ends_by_truncation_and_a_call_there_scores_zero():
    env = MathToolEnv(split="test", max_turns=2)
    await env.reset(seed=3)
    await env.step(call("print(1)"))
    obs, reward, terminated, truncated, info = await env.step(call(f"print({env.problem.answer})"))
    assert truncated and not terminated and reward == 0 and not info["success"]
    with pytest.raises(RuntimeError):
        await env.step("<answer>1</answer>")


async def test_a_call_wins_over_an_answer_written_in_the_same_reply():
    env = MathToolEnv(split="test")
    await env.reset(seed=4)
    obs, reward, terminated, _, _ = await env.step(call("print(1)") + f"<answer>{env.problem.answer}</answer>")
    assert obs[0]["role"] == "tool" and reward == 0 and not terminated


async def test_calculator_tool_and_no_tool_baseline_on_the_same_problems():
    calc = MathToolEnv(split="test", tools="calculator")
    none = MathToolEnv(split="test", tools="none")
    assert none.tools is None and not none.chat_template_tools
    assert calc.task_set() == none.task_set()
    await calc.reset(seed=5)
    obs, _, _, _, info = await calc.step(call("12 * 345", "calculator", "expression"))
    assert obs[0]["content"] == "4140" and info["tool_ok"]
    opening, _ = await none.reset(seed=5)
    assert "tool" not in json.dumps(opening) and opening[-1]["content"] == calc.problem.question
    # without tools a call is no answer: invalid, nothing runs
    obs, reward, _, _, info = await none.step(call("print(1)"))
    assert not info["action_valid"] and reward == 0
    _, reward, terminated, _, _ = await none.step(f"<answer>{none.problem.answer}</answer>")
    assert reward == 1 and terminated


async def test_both_tools_and_an_unknown_one():
    env = MathToolEnv(split="test", tools="both")
    assert [t["function"]["name"] for t in env.tools] == ["python", "calculator"]
    await env.reset(seed=6)
    obs, _, _, _, info = await env.step(call("7 * 6", "calculator", "expression"))
    assert obs[0]["content"] == "42"


def test_bad_kwargs_are_refused_at_construction():
    for kwargs in ({"tools": "bash"}, {"backend": "vm"}, {"max_turns": 0}, {"kinds": ["algebra"]}, {"split": "dev"}):
        with pytest.raises(ValueError):
            MathToolEnv(**kwargs)


async def test_expert_solves_every_kind():
    for kind in KINDS:
        env = MathToolEnv(kinds=kind, split="test", test_size=5)
        for seed in range(5):
            await env.reset(seed=seed)
            done, reward = False, 0.0
            while not done:
                _, reward, terminated, truncated, _ = await env.step(env.expert_action())
                done = terminated or truncated
            assert reward == 1.0
