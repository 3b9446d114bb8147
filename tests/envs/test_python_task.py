"""Tasks as plain Python (`python:PATH.py:FUNCTION`, `from_function`): episodes and one-line errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rollhub.core.errors import UserError
from rollhub.envs import from_function, make
from rollhub.envs.checker import check_env
from rollhub.envs.registry import _REGISTRY

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python_task"


def _write(folder: Path, code: str, rows: list[dict] | None = None) -> Path:
    (folder / "task.py").write_text(code)
    rows = rows if rows is not None else [{"prompt": "Say 7.", "answer": "7"}, {"prompt": "Say 3.", "answer": "3"}]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "task.py"


def test_single_turn_reward_function_scores_the_reply(tmp_path):
    path = _write(tmp_path, "def reward(completion, row):\n    return float(completion.strip() == row['answer'])\n")
    env = make(f"python:{path}:reward", dataset="data.jsonl")  # found next to the .py file
    obs, info = asyncio.run(env.reset(seed=1))
    assert obs == [{"role": "user", "content": "Say 3."}]
    _, reward, terminated, truncated, info = asyncio.run(env.step(" 3 "))
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    asyncio.run(env.reset(seed=0))
    assert asyncio.run(env.step("3"))[1] == 0.0


def test_multi_turn_step_function_gives_feedback_until_done():
    env = make(
        f"python:{EXAMPLES / 'guess.py'}:step", dataset=[{"prompt": "Guess.", "secret": 5}], system_prompt="Game."
    )
    obs, _ = asyncio.run(env.reset(seed=0))
    assert [m["role"] for m in obs] == ["system", "user"]
    obs, reward, terminated, truncated, info = asyncio.run(env.step("no idea"))  # unreadable: reward None
    assert info["action_valid"] is False and info["anchor"] == asyncio.run(env.reset(seed=0))[1]["anchor"]
    assert obs[0]["content"] == "Reply with one number from 1 to 8." and (reward, terminated) == (0.0, False)
    obs, reward, terminated, truncated, _ = asyncio.run(env.step("2"))
    assert obs == [{"role": "user", "content": "Higher."}] and (reward, terminated, truncated) == (0.0, False, False)
    _, reward, terminated, _, info = asyncio.run(env.step("I say 5"))
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    asyncio.run(env.reset(seed=0))
    for _ in range(env.max_steps - 1):
        assert not asyncio.run(env.step("1"))[3]
    assert asyncio.run(env.step("1"))[3]  # truncated at max_steps (8)


def test_the_examples_pass_the_env_checker():
    # check_env raises on any breach of the contract; what it returns are warnings only
    for env_id, dataset in (("task.py:reward", "prompts.jsonl"), ("guess.py:step", "guess_prompts.jsonl")):
        warnings = asyncio.run(check_env(f"python:{EXAMPLES / env_id}", env_kwargs={"dataset": dataset}))
        assert all("no random_action()" in w for w in warnings), warnings


@pytest.mark.parametrize(
    ("env_id", "kwargs", "message"),
    [
        ("python:{dir}/missing.py:reward", {"dataset": "data.jsonl"}, "no file"),
        ("python:{dir}/task.py", {"dataset": "data.jsonl"}, "must look like python:PATH/TO/task.py:FUNCTION"),
        ("python:{dir}/task.py:score", {"dataset": "data.jsonl"}, "has no function 'score' (its functions: reward"),
        ("python:{dir}/task.py:reward", {"dataset": "nope.jsonl"}, "dataset: no file 'nope.jsonl'"),
        ("python:{dir}/task.py:reward", {}, "no dataset: set env.kwargs.dataset"),
        ("python:{dir}/task.py:reward", {"dataset": "bad.jsonl"}, "row 1 needs a 'prompt' string"),
        (
            "python:{dir}/three.py:reward",
            {"dataset": "data.jsonl"},
            "takes (completion, row, extra); a reward function",
        ),
        ("python:{dir}/broken.py:reward", {"dataset": "data.jsonl"}, "importing"),
        ("python:{dir}/syntax.py:reward", {"dataset": "data.jsonl"}, "failed: SyntaxError"),
    ],
)
def test_user_mistakes_are_one_line_errors(tmp_path, env_id, kwargs, message):
    _write(tmp_path, "def reward(completion, row):\n    return 0.0\n")
    (tmp_path / "three.py").write_text("def reward(completion, row, extra):\n    return 0.0\n")
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    (tmp_path / "syntax.py").write_text("def reward(completion:\n    return 0\n")
    (tmp_path / "bad.jsonl").write_text('{"question": "no prompt"}\n')
    with pytest.raises(UserError) as error:
        make(env_id.format(dir=tmp_path), **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_reward_that_is_not_a_number_is_named(tmp_path):
    path = _write(tmp_path, "def reward(completion):\n    return 'yes'\n")
    env = make(f"python:{path}:reward", dataset=str(tmp_path / "data.jsonl"))
    asyncio.run(env.reset(seed=0))
    with pytest.raises(TypeError, match="finite number as the reward, got 'yes'"):
        asyncio.run(env.step("7"))


def test_from_function_registers_an_env_id():
    def score(completion: str, row: dict) -> float:
        return float(row["answer"] in completion)

    try:
        env_id = from_function(reward=score, dataset=[{"prompt": "Say 7.", "answer": "7"}], name="SayNumber")
        assert env_id == "python/SayNumber-v0"
        env = make(env_id)
        asyncio.run(env.reset(seed=0))
        assert asyncio.run(env.step("7"))[1] == 1.0
        with pytest.raises(UserError, match="exactly one of reward= .* or step="):
            from_function(dataset=[{"prompt": "x"}])
        with pytest.raises(UserError, match="first parameter is named history"):
            from_function(step=score, dataset=[{"prompt": "x"}])
    finally:
        _REGISTRY.pop("python/SayNumber-v0", None)
