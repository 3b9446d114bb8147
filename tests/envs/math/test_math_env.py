import json
import time

import numpy as np
import pytest

import rollhub.envs as envs
from rollhub.envs.math.dataset import gold_answer, load_jsonl
from rollhub.envs.math.env import MathEnv
from tests.envs.math.test_math_answers import HOSTILE_ANSWERS


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "problems.jsonl"
    rows = [
        {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "Add: $\\boxed{\\frac{3}{4}}$."},
        {"question": "A big number?", "answer": "#### 1,250"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


async def test_expert_scores_full_reward_and_wrong_scores_zero():
    env = envs.make("rollhub/Math-v0")
    for seed in range(30):
        obs, info = await env.reset(seed=seed)
        assert [m["role"] for m in obs] == ["system", "user"] and "<answer>" in obs[0]["content"]
        _, reward, terminated, truncated, info = await env.step(env.expert_action())
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
        await env.reset(seed=seed)
        wrong = f"<answer>{env.problem.answer}1</answer>"
        _, reward, terminated, _, info = await env.step(wrong)
        assert (reward, terminated, info["success"], info["action_valid"]) == (0.0, True, False, True)


async def test_boxed_and_untagged_answers_are_graded_with_format_flag():
    env = MathEnv(kinds=("arithmetic",), difficulty=1)
    await env.reset(seed=1)
    _, reward, *_, info = await env.step(f"I think it is \\boxed{{{env.problem.answer}}}")
    assert reward == 1.0 and info["format_ok"]
    await env.reset(seed=1)
    _, reward, *_, info = await env.step(f"so the result is {env.problem.answer}")
    assert reward == 1.0 and info["format_ok"] is False


async def test_no_answer_is_invalid_and_truncates_single_attempt():
    env = MathEnv()
    _, info = await env.reset(seed=2)
    obs, reward, terminated, truncated, step_info = await env.step("I do not know")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert step_info["action_valid"] is False and step_info["anchor"] == info["anchor"]
    assert "answer" in obs[0]["content"]


async def test_multiple_attempts():
    env = MathEnv(max_attempts=2)
    await env.reset(seed=3)
    obs, reward, terminated, truncated, _ = await env.step("<answer>not a number at all x y z</answer>")
    assert not terminated and not truncated and "try again" in obs[0]["content"]
    _, reward, terminated, _, info = await env.step(env.expert_action())
    assert reward == 1.0 and terminated and info["success"]


async def test_dataset_problems(jsonl):
    problems = load_jsonl(jsonl)
    assert [p.answer for p in problems] == ["7", "\\frac{3}{4}", "1,250"]
    env = MathEnv(dataset_path=str(jsonl))
    obs, _ = await env.reset(options={"index": 1})
    assert "frac{1}{2}" in obs[1]["content"]
    _, reward, *_ = await env.step("<answer>0.75</answer>")
    assert reward == 1.0
    await env.reset(options={"index": 2})
    assert (await env.step("<answer>1250</answer>"))[1] == 1.0
    seen = set()
    for seed in range(20):
        obs, _ = await env.reset(seed=seed)
        seen.add(obs[1]["content"])
    assert len(seen) == 3
    with pytest.raises(ValueError, match="out of range"):
        await env.reset(options={"index": 3})


def test_dataset_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_jsonl(bad)
    missing_keys = tmp_path / "keys.jsonl"
    missing_keys.write_text('{"q": "x", "a": "1"}\n')
    with pytest.raises(ValueError, match="question_key"):
        load_jsonl(missing_keys)
    assert load_jsonl(missing_keys, question_key="q", answer_key="a")[0].answer == "1"
    with pytest.raises(ValueError, match="not found"):
        MathEnv(dataset_path=str(tmp_path / "nope.jsonl"))
    assert gold_answer("work\n#### 12") == "12" and gold_answer("plain") == "plain"


async def test_random_action_is_well_formed():
    env = MathEnv()
    await env.reset(seed=0)
    action = env.random_action(np.random.default_rng(0))
    _, _, terminated, _, info = await env.step(action)
    assert info["format_ok"] and info["action_valid"] and terminated


def _gold_env(tmp_path, answers: list[str]) -> MathEnv:
    """A dataset env whose problem i has gold answer answers[i]."""
    path = tmp_path / "gold.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": f"#### {a}"}) + "\n" for i, a in enumerate(answers))
    )
    return MathEnv(dataset_path=str(path))


async def _timed_step(env: MathEnv, index: int, action: str) -> tuple[float, float]:
    """(reward, milliseconds) of one answer to problem `index`."""
    await env.reset(options={"index": index})
    started = time.perf_counter()
    _, reward, *_ = await env.step(action)
    return reward, (time.perf_counter() - started) * 1000


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS, ids=lambda a: a[:24])
async def test_hostile_answers_score_zero_within_100ms_through_step(tmp_path, answer):
    env = _gold_env(tmp_path, ["42", "9"])
    assert (await _timed_step(env, 0, "<answer>42</answer>"))[0] == 1.0  # warm-up, and the env does score
    for index in (0, 1):
        for action in (f"<answer>{answer}</answer>", f"\\boxed{{{answer}}}"):
            reward, elapsed = await _timed_step(env, index, action)
            assert reward == 0.0
            assert elapsed < 100, f"{action[:40]!r} took {elapsed:.0f} ms"


@pytest.mark.parametrize(
    "predicted,gold",
    [
        ("3/4", r"\frac{3}{4}"),
        (r"\frac{3}{4}", "0.75"),
        ("1/2", "0.5"),
        ("0.5", "1/2"),
        ("sqrt(2)/2", "1/sqrt(2)"),
        (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"),
        ("-3", "-3"),
        ("1,000", "1000"),
        ("1000", "1,000"),
    ],
)
async def test_ordinary_correct_answers_still_score_one(tmp_path, predicted, gold):
    env = _gold_env(tmp_path, [gold])
    reward, _ = await _timed_step(env, 0, f"<answer>{predicted}</answer>")
    assert reward == 1.0


async def test_info_keeps_only_the_start_of_a_huge_answer(tmp_path):
    env = _gold_env(tmp_path, ["42"])
    await env.reset(options={"index": 0})
    *_, info = await env.step("<answer>" + "x" * 10**6 + "</answer>")
    assert info["action_valid"] and not info["success"] and len(info["answer"]) <= 1000


def test_check_time_limit_must_be_positive():
    with pytest.raises(ValueError, match="check_time_limit_s"):
        MathEnv(check_time_limit_s=0)
