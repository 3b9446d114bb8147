"""Math-v0's problem-level train/test split: disjoint by content, fixed and distinct test set,
and the trainer's overlap check refusing a run whose evaluation problems training could draw."""

import re

import numpy as np
import pytest

from rollhub.core.errors import UserError
from rollhub.envs.math.env import MathEnv
from rollhub.envs.math.problems import (
    generate_problem,
    held_out_problems,
    in_test_partition,
    problem_key,
    stated_question,
)

ARITH_1 = {"kinds": ("arithmetic",), "difficulty": 1}


def _space(kinds, difficulty, draws=20_000):
    """Every question a setting produces (difficulty 1 arithmetic: all 800 within 20k draws)."""
    rng = np.random.default_rng(123)
    return {generate_problem(rng, kinds=kinds, difficulty=difficulty).question for _ in range(draws)}


def test_difficulty_one_space_holds_a_test_set_and_a_larger_train_set():
    space = _space(("arithmetic",), 1)
    assert len(space) == 800  # a +/- b, a and b in 1..20
    held_out = {q for q in space if in_test_partition(q)}
    assert 200 <= len(held_out) and len(space) - len(held_out) >= 500


async def test_train_split_never_plays_a_test_problem_checked_by_content():
    test_env = MathEnv(**ARITH_1, split="test")
    test_questions = {p.question for p in test_env.problems}
    assert len(test_questions) == 200
    train_env = MathEnv(**ARITH_1, split="train")
    seen = set()
    for seed in range(3000):  # far more than a 30-minute run draws; covers most of the train space
        obs, _ = await train_env.reset(seed=seed)
        assert obs[-1]["content"] == stated_question(train_env.problem)
        seen.add(train_env.problem.question)
    assert not seen & test_questions
    assert len(seen) > 450  # the train split is not a handful of problems
    assert not any(in_test_partition(q) for q in seen)


async def test_test_split_is_fixed_distinct_and_consecutive_seeds_play_each_once():
    a = held_out_problems(("arithmetic",), 1, "any", 200)
    assert [p.question for p in a] == [p.question for p in MathEnv(**ARITH_1, split="test").problems]
    assert len({problem_key(p.question) for p in a}) == 200
    env = MathEnv(**ARITH_1, split="test")
    played = []
    for seed in range(1_000_000, 1_000_200):  # the recipe's evaluation seeds
        obs, _ = await env.reset(seed=seed)
        played.append(env.problem.question)
    assert len(set(played)) == 200 and set(played) == {p.question for p in a}


def test_mixed_set_has_its_own_test_split_disjoint_from_training():
    env = MathEnv(split="test")  # all kinds, difficulty 1..3
    assert len(env.task_set()) == 200
    assert MathEnv(split="train").could_draw(set(env.task_set())) == set()
    assert MathEnv().could_draw(set(env.task_set())) == set(env.task_set())  # split=all could draw any


def test_a_space_too_small_for_the_test_size_is_refused():
    with pytest.raises(ValueError, match="distinct test problems"):
        MathEnv(**ARITH_1, split="test", test_size=400)
    with pytest.raises(ValueError, match="split"):
        MathEnv(split="validation")


async def test_require_format_grades_only_tagged_answers():
    env = MathEnv(**ARITH_1, require_format=True)
    await env.reset(seed=5)
    _, reward, *_, info = await env.step(f"so it is {env.problem.answer}")
    assert reward == 0.0 and info["format_ok"] is False and info["success"] is False
    await env.reset(seed=5)
    _, reward, *_, info = await env.step(f"<answer>{env.problem.answer}</answer>")
    assert reward == 1.0 and info["format_ok"]


def _config(train_kwargs, eval_kwargs):
    from rollhub.trainer.config import EvalEnvConfig, RunConfig

    config = RunConfig()
    config.env.id = "rollhub/Math-v0"
    config.env.kwargs = dict(train_kwargs)
    config.eval.env = EvalEnvConfig(kwargs=dict(eval_kwargs))
    return config


def test_trainer_refuses_evaluation_that_training_could_draw():
    from rollhub.trainer.build import check_run_envs

    check_run_envs(_config({**ARITH_1, "split": "train"}, {"split": "test"}))  # the recipe's pairing passes
    with pytest.raises(UserError, match="evaluation overlaps training: 200 of the 200"):
        check_run_envs(_config(ARITH_1, {"split": "test"}))  # split=all trains on the held-out problems too
    with pytest.raises(UserError, match="evaluation overlaps training"):
        check_run_envs(_config({**ARITH_1, "split": "test"}, {"split": "test"}))
    # a different setting's test set is still held out from this train split (same content partition)
    check_run_envs(_config({"split": "train"}, {**ARITH_1, "split": "test"}))


def test_math_recipes_evaluate_on_held_out_problems():
    from rollhub.core.config import load_config
    from rollhub.trainer.build import check_run_envs, make_eval_env_factory
    from rollhub.trainer.config import RunConfig

    config = load_config(RunConfig, "configs/math_smollm2.yaml")
    check_run_envs(config)
    env = make_eval_env_factory(config)()
    assert len(env.task_set()) >= config.eval.episodes >= 200


async def test_example_exchange_shows_the_format_before_the_problem_and_is_never_a_problem():
    from rollhub.envs.math.env import EXAMPLE_EXCHANGE

    env = MathEnv(**ARITH_1, split="test", example=True)
    obs, _ = await env.reset(seed=1_000_000)
    assert [m["role"] for m in obs] == ["system", "user", "assistant", "user"]
    assert "<answer>42</answer>" in obs[2]["content"] and obs[3]["content"] == stated_question(env.problem)
    example_question = EXAMPLE_EXCHANGE[0]["content"].split(" Give the answer")[0]
    assert example_question == "Compute 23 + 19."
    assert example_question not in _space(("arithmetic",), 1)  # no problem's answer is given away
    plain, _ = await MathEnv(**ARITH_1).reset(seed=0)
    assert [m["role"] for m in plain] == ["system", "user"]


def test_example_renders_in_smollm2_chat_template():
    from rollhub.envs.math.env import EXAMPLE_EXCHANGE, SYSTEM_PROMPT
    from tests.smollm2_testing import smollm2_tokenizer

    text = smollm2_tokenizer().apply_chat_template(
        [
            {"role": "system", "content": SYSTEM_PROMPT},
            *EXAMPLE_EXCHANGE,
            {"role": "user", "content": "Compute 1 + 2."},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.index("<answer>42</answer>") < text.index("Compute 1 + 2.") < text.rindex("assistant")


# -- the overlap check reads content, not seed ranges ---------------------------------------


def test_the_cli_refuses_evaluating_on_the_train_split_before_training(tmp_path):
    """Disjoint seed ranges, but difficulty 1 has 800 problems: the train split's evaluation seeds
    draw problems training draws too. Refused at prepare time, as a one-line error, no run dir.
    A subprocess in its own session, killed whole at the deadline: a run the check lets through
    fails the test instead of training."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "rollhub.cli", "train", "configs/math_smollm2.yaml", "--no-progress"]
    command += ["--set", "eval.env.kwargs.split=train", "--set", f"run_dir={run_dir}"]
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        _, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    elapsed = time.perf_counter() - started
    assert process.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert re.search(r"evaluation overlaps training: (\d+) of the \1 distinct tasks", err), err
    assert int(re.search(r"overlaps training: (\d+)", err).group(1)) >= 150  # 200 seeds, ~165 distinct problems
    assert not run_dir.exists() and elapsed < 90


def _overlap_count(train_kwargs, eval_kwargs, *, eval_seeds=range(1_000_000, 1_000_200), train_seeds=range(0, 2000)):
    from rollhub.envs.run_checks import check_eval_disjoint

    try:
        check_eval_disjoint(
            "rollhub/Math-v0",
            train_kwargs,
            "rollhub/Math-v0",
            eval_kwargs,
            eval_seeds=eval_seeds,
            train_seeds=train_seeds,
        )
    except UserError as error:
        return int(re.search(r"overlaps training: (\d+)", str(error)).group(1))
    return 0


def test_overlap_is_read_by_content_for_procedural_evaluation():
    # same setting, split all on both sides: most evaluation problems are training problems
    assert _overlap_count(ARITH_1, ARITH_1) > 100
    assert _overlap_count({**ARITH_1, "split": "train"}, {**ARITH_1, "split": "train"}) > 100
    assert _overlap_count({**ARITH_1, "split": "test"}, {**ARITH_1, "split": "all"}) > 30
    # the recipe's pairing, and a train split against a procedural evaluation that stays in the test partition
    assert _overlap_count({**ARITH_1, "split": "train"}, {**ARITH_1, "split": "test"}) == 0
    # without evaluation seeds the procedural side has no content to compare (the config's seed check then)
    assert _overlap_count(ARITH_1, ARITH_1, eval_seeds=None) == 0


def test_train_split_decides_by_content_not_by_seed():
    """What the train split's `could_draw` claims is what it draws: every key drawn on many seeds
    is outside the test partition, and every test-split key is refused by the train split."""
    import asyncio

    from rollhub.envs.math.problems import key_in_test_partition

    async def keys(env, seeds):
        out = set()
        for seed in seeds:
            await env.reset(seed=seed)
            out.add(env.task_key())
        return out

    train = asyncio.run(keys(MathEnv(**ARITH_1, split="train"), range(3000)))
    test = asyncio.run(keys(MathEnv(**ARITH_1, split="test"), range(200)))
    assert len(test) == 200 and not train & test
    assert not any(key_in_test_partition(k) for k in train) and all(key_in_test_partition(k) for k in test)
    assert MathEnv(**ARITH_1, split="train").could_draw(test) == set()
    assert MathEnv(**ARITH_1, split="train").could_draw(train) == train


def test_a_content_keyed_env_without_could_draw_is_checked_on_its_training_seeds():
    import numpy as np

    from rollhub.envs.base import Env
    from rollhub.envs.registry import _REGISTRY, register
    from rollhub.envs.run_checks import check_eval_disjoint

    class SmallSpaceEnv(Env):
        def __init__(self, tasks: int = 50, offset: int = 0):
            self.tasks, self.offset, self.task = tasks, offset, None

        async def reset(self, *, seed=None, options=None):
            self.task = self.offset + int(np.random.default_rng(seed).integers(self.tasks))
            return [{"role": "user", "content": f"task {self.task}"}], {"anchor": self.task, "success": False}

        async def step(self, action):
            return [{"role": "user", "content": "done"}], 0.0, True, False, {"anchor": self.task, "success": False}

        def task_key(self):
            return f"small:{self.task}"

    register("test/SmallSpace-v0", SmallSpaceEnv, gymnasium_compat=False)
    try:
        with pytest.raises(
            UserError, match=r"overlaps training: \d+ of the \d+ distinct tasks .* first training seeds"
        ):
            check_eval_disjoint(
                "test/SmallSpace-v0",
                {},
                "test/SmallSpace-v0",
                {},
                eval_seeds=range(10**6, 10**6 + 20),
                train_seeds=range(1000),
            )
        # another part of the space: the same seeds, no shared content
        check_eval_disjoint(
            "test/SmallSpace-v0",
            {},
            "test/SmallSpace-v0",
            {"offset": 1000},
            eval_seeds=range(10**6, 10**6 + 20),
            train_seeds=range(1000),
        )
    finally:
        _REGISTRY.pop("test/SmallSpace-v0", None)


def test_shipped_math_configs_pass_the_content_check():
    from rollhub.core.config import load_config
    from rollhub.trainer.build import check_run_envs
    from rollhub.trainer.config import RunConfig

    for path in ("configs/math_smollm2.yaml", "configs/math_tiny.yaml"):
        check_run_envs(load_config(RunConfig, path))
