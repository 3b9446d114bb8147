"""`rollhub/Math-v0`: single-turn verifiable math (RLVR).

The model answers inside `<answer>...</answer>` (a `\\boxed{}` inside the tag is fine); an
untagged reply is still graded by its last `\\boxed{}` or the number its final sentence plainly
states (`answers.stated_number`: `not 5` or `5 or 6` state none), with `info["format_ok"] = False`
so the trainer can penalise the format if it wants to.
Reward: 1 for a correct answer, 0 otherwise. Correct means a literal of the form the problem
states (`answer_forms.py`: an integer, a reduced fraction), never an expression to evaluate:
otherwise copying the question's expression into the tag would be paid. A reply with no answer at all is an invalid
action (state unchanged); with the default single attempt it ends the episode by truncation.

Train/test split (`split=`): `test` plays a fixed list of `test_size` distinct held-out problems
(`problems.held_out_problems`; a seed picks entry `seed % test_size`, so consecutive evaluation
seeds play distinct problems), `train` never produces a problem of the test partition (a draw
that lands there is redrawn), `all` (the default) is the whole space. Membership is decided by
a hash of the question text, so the sets are disjoint by content whatever the seeds; the trainer
checks it before a run (`task_set`, `could_draw`, `rollhub.envs.run_checks.check_eval_disjoint`).

The answer is graded inline on the event loop, which is safe because `is_equivalent` has a
bounded cost and a deadline (`check_time_limit_s`): a hostile answer such as `9^9^9` scores
0 within milliseconds instead of freezing every other trajectory (see `answers.py`).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from rollhub.envs.base import Env, Observation, StepResult, invalid_step_info, wrap_action
from rollhub.envs.hack_battery import echoes_question
from rollhub.envs.math.answer_forms import answer_is_correct, restates_question_math
from rollhub.envs.math.answers import CHECK_TIME_LIMIT_S, MAX_ANSWER_CHARS, extract_answer
from rollhub.envs.math.dataset import load_jsonl
from rollhub.envs.math.problems import (
    KINDS,
    AnswerLength,
    Problem,
    generate_problem,
    held_out_problems,
    in_test_partition,
    key_in_test_partition,
    problem_key,
    stated_question,
)

Split = Literal["all", "train", "test"]
SPLITS = ("all", "train", "test")
#: redraws allowed for a train-split problem that lands in the test partition (30% of draws)
TRAIN_REDRAWS = 200

SYSTEM_PROMPT = (
    "Solve the problem. Put only the final answer inside <answer></answer>, for example <answer>42</answer>."
)

# `example=True`: one worked exchange before the problem, showing the format by doing it. Small
# instruct models (SmolLM2-135M) mostly ignore the instruction alone and follow it after one
# example. Its problem lies outside difficulty 1's space. It states the answer's form as every
# problem does: with the sentence on the problem alone SmolLM2-135M's greedy accuracy on 64 test
# problems fell from 35.9% to 28.1%; on both, 37.5%.
EXAMPLE_EXCHANGE = (
    {"role": "user", "content": "Compute 23 + 19. Give the answer as an integer."},
    {"role": "assistant", "content": "23 + 19 = 42. <answer>42</answer>"},
)


class ContentSplit:
    """Train/test membership by a hash of the problem text, for envs with `problems` (a fixed
    list or None), `split` and `_problem`; `problem_key` and `key_in_test_partition` name the
    env's own key functions (Math-v0's and MathTool's keys differ in prefix and share)."""

    problems: list[Problem] | None
    split: str
    _problem: Problem | None
    problem_key = staticmethod(problem_key)
    key_in_test_partition = staticmethod(key_in_test_partition)

    def task_set(self) -> dict[str, str] | None:
        """The problems this env plays, keyed by content (`problem_key`) -> question, when the list
        is fixed (the test split, or a file); None for procedural problems, which have no list.

        The trainer compares the evaluation env's set with what training could draw
        (`could_draw`) and refuses a run where they meet.
        """
        if self.problems is None:
            return None
        return {self.problem_key(p.question): p.question for p in self.problems}

    def could_draw(self, keys: list[str] | set[str]) -> set[str]:
        """The problem keys among `keys` this env might ever play (conservative: a procedural
        `all` split might play any of them; a `train` split none of the test partition)."""
        listed = self.task_set()
        if listed is not None:
            return {key for key in keys if key in listed}
        if self.split == "train":
            return {key for key in keys if not self.key_in_test_partition(key)}
        return set(keys)

    def task_key(self) -> str | None:
        """The content key (`problem_key`) of the problem the last reset drew: the same problem
        text is the same task whichever seed drew it (difficulty 1 has only 800 problems)."""
        return None if self._problem is None else self.problem_key(self._problem.question)


class MathEnv(ContentSplit, Env):
    """One problem per episode, procedural or from a jsonl file.

    Args:
        dataset_path: GSM8K/MATH-style jsonl; None = procedural problems.
        kinds, difficulty, answer_length: procedural problem choice (see `rollhub.envs.math.problems`).
        max_attempts: answers allowed per problem; a wrong one gets "Incorrect." back.
        correct_reward, wrong_reward, invalid_reward: reward values.
        check_time_limit_s: deadline of one answer check; a check that runs out scores as wrong.
        split: `all`, `train` (never a held-out problem) or `test` (the fixed held-out list).
        test_size: distinct problems in the test split (procedural problems only).
        require_format: grade only answers inside the tag (or a `\\boxed{}`); an untagged
            reply then scores `wrong_reward` with `format_ok` False. Off by default: the last
            number of an untagged reply is graded.
        example: show one worked exchange in the answer format before the problem
            (`EXAMPLE_EXCHANGE`), so a small model can follow the format from the start.
    Options of reset: {"index": i} picks dataset problem i instead of a random one.
    """

    action_tag = "answer"

    def __init__(
        self,
        dataset_path: str | None = None,
        question_key: str | None = None,
        answer_key: str | None = None,
        kinds: str | tuple[str, ...] | list[str] = KINDS,
        difficulty: int | None = None,
        answer_length: AnswerLength = "any",
        max_attempts: int = 1,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        invalid_reward: float = 0.0,
        check_time_limit_s: float = CHECK_TIME_LIMIT_S,
        split: Split = "all",
        test_size: int = 200,
        require_format: bool = False,
        example: bool = False,
    ):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if not 0 < check_time_limit_s <= 10:
            raise ValueError(f"check_time_limit_s must be in (0, 10] seconds, got {check_time_limit_s}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if not 1 <= test_size <= 100_000:
            raise ValueError(f"test_size must be in 1..100000, got {test_size}")
        self.check_time_limit_s = check_time_limit_s
        self.split = split
        self.test_size = test_size
        self.require_format = require_format
        self.example = example
        self.kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        self.difficulty = difficulty
        self.answer_length = answer_length
        self.max_steps = max_attempts
        self.correct_reward, self.wrong_reward, self.invalid_reward = correct_reward, wrong_reward, invalid_reward
        self.problems = (
            load_jsonl(dataset_path, question_key=question_key, answer_key=answer_key) if dataset_path else None
        )
        if self.problems is not None and split != "all":  # a file is split by the same content hash
            self.problems = [p for p in self.problems if in_test_partition(p.question) == (split == "test")]
            if not self.problems:
                raise ValueError(f"no problem of {dataset_path} falls in the {split} split")
        if self.problems is None and split == "test":  # the fixed list; fails here if the space is too small
            self.problems = list(held_out_problems(self.kinds, difficulty, answer_length, test_size))
        if self.problems is None:  # fail at construction, not at the first reset
            self._draw(np.random.default_rng(0))
        self._rng = np.random.default_rng()
        self._problem: Problem | None = None
        self._steps = 0
        self._done = False

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        index = (options or {}).get("index")
        if self.problems is not None:
            if index is None and seed is not None and self.split == "test":
                index = seed % len(self.problems)  # consecutive seeds: distinct problems
            if index is None:
                index = int(self._rng.integers(len(self.problems)))
            if not 0 <= index < len(self.problems):
                raise ValueError(f"problem index {index} out of range 0..{len(self.problems) - 1}")
            self._problem = self.problems[index]
        else:
            self._problem = self._draw(self._rng)
        self._steps = 0
        self._done = False
        obs: Observation = [
            {"role": "system", "content": SYSTEM_PROMPT},
            *([dict(m) for m in EXAMPLE_EXCHANGE] if self.example else []),
            {"role": "user", "content": stated_question(self._problem)},
        ]
        return obs, {"anchor": self._problem.question, "success": False, "kind": self._problem.kind}

    async def step(self, action: str) -> StepResult:
        problem = self._require_problem()
        if self._done:
            raise RuntimeError("episode is over; call reset() first")
        self._steps += 1
        out_of_attempts = self._steps >= self.max_steps
        answer, format_ok = extract_answer(action, self.action_tag)
        if answer is None or not answer.strip():
            self._done = out_of_attempts
            info = invalid_step_info(
                problem.question, "no answer found; put it inside <answer></answer>", format_ok=format_ok
            )
            info["exploit_signals"] = {"echo_answer": False}
            obs: Observation = [
                {"role": "user", "content": "No answer found. Put the final answer inside <answer></answer>."}
            ]
            return obs, float(self.invalid_reward), False, out_of_attempts, info
        graded = format_ok or not self.require_format
        correct = graded and answer_is_correct(
            answer,
            problem.answer,
            problem.answer_form,
            problem.unknown,
            time_limit_s=self.check_time_limit_s,
            question=problem.question,
        )
        terminated = correct or out_of_attempts
        self._done = terminated
        info = {
            "anchor": problem.question,
            "success": correct,
            "action_valid": True,
            "format_ok": format_ok,
            "answer": answer[:MAX_ANSWER_CHARS],  # a hostile megabyte answer stays out of the logs
            "exploit_signals": {
                "echo_answer": echoes_question(answer[:MAX_ANSWER_CHARS], problem.question)
                or restates_question_math(answer[:MAX_ANSWER_CHARS], problem.question)
            },
        }
        reply = "Correct." if correct else "Incorrect." if terminated else "Incorrect, try again."
        reward = self.correct_reward if correct else self.wrong_reward
        return [{"role": "user", "content": reply}], float(reward), terminated, False, info

    def _draw(self, rng: np.random.Generator) -> Problem:
        """A procedural problem; the train split redraws problems of the test partition."""
        for _ in range(TRAIN_REDRAWS):
            problem = generate_problem(
                rng, kinds=self.kinds, difficulty=self.difficulty, answer_length=self.answer_length
            )
            if self.split != "train" or not in_test_partition(problem.question):
                return problem
        raise ValueError(f"no train-split problem in {TRAIN_REDRAWS} draws for kinds {list(self.kinds)}")

    def expert_action(self) -> str:
        return wrap_action(self._require_problem().answer, self.action_tag)

    def random_action(self, rng: np.random.Generator) -> str:
        return wrap_action(str(int(rng.integers(-20, 101))), self.action_tag)

    def render_text(self) -> str:
        return self._problem.question if self._problem else ""

    async def close(self) -> None:
        self._done = True

    @property
    def problem(self) -> Problem:
        return self._require_problem()

    def _require_problem(self) -> Problem:
        if self._problem is None:
            raise RuntimeError("call reset() before using the env")
        return self._problem
