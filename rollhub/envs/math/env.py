"""`rollhub/Math-v0`: single-turn verifiable math (RLVR).

The model answers inside `<answer>...</answer>` (a `\\boxed{}` inside the tag is fine); an
untagged reply is still graded by its last `\\boxed{}` or final number, with
`info["format_ok"] = False` so the trainer can penalise the format if it wants to.
Reward: 1 for a correct answer, 0 otherwise. A reply with no answer at all is an invalid
action (state unchanged); with the default single attempt it ends the episode by truncation.

The answer is graded inline on the event loop, which is safe because `is_equivalent` has a
bounded cost and a deadline (`check_time_limit_s`): a hostile answer such as `9^9^9` scores
0 within milliseconds instead of freezing every other trajectory (see `answers.py`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rollhub.envs.base import Env, Observation, StepResult, invalid_step_info, wrap_action
from rollhub.envs.math.answers import CHECK_TIME_LIMIT_S, MAX_ANSWER_CHARS, extract_answer, is_equivalent
from rollhub.envs.math.dataset import load_jsonl
from rollhub.envs.math.problems import KINDS, AnswerLength, Problem, generate_problem

SYSTEM_PROMPT = (
    "Solve the problem. Put only the final answer inside <answer></answer>, for example <answer>42</answer>."
)


class MathEnv(Env):
    """One problem per episode, procedural or from a jsonl file.

    Args:
        dataset_path: GSM8K/MATH-style jsonl; None = procedural problems.
        kinds, difficulty, answer_length: procedural problem choice (see `rollhub.envs.math.problems`).
        max_attempts: answers allowed per problem; a wrong one gets "Incorrect." back.
        correct_reward, wrong_reward, invalid_reward: reward values.
        check_time_limit_s: deadline of one answer check; a check that runs out scores as wrong.
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
    ):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if not 0 < check_time_limit_s <= 10:
            raise ValueError(f"check_time_limit_s must be in (0, 10] seconds, got {check_time_limit_s}")
        self.check_time_limit_s = check_time_limit_s
        self.kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        self.difficulty = difficulty
        self.answer_length = answer_length
        self.max_steps = max_attempts
        self.correct_reward, self.wrong_reward, self.invalid_reward = correct_reward, wrong_reward, invalid_reward
        self.problems = (
            load_jsonl(dataset_path, question_key=question_key, answer_key=answer_key) if dataset_path else None
        )
        if self.problems is None:  # fail at construction, not at the first reset
            generate_problem(
                np.random.default_rng(0), kinds=self.kinds, difficulty=difficulty, answer_length=answer_length
            )
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
            if index is None:
                index = int(self._rng.integers(len(self.problems)))
            if not 0 <= index < len(self.problems):
                raise ValueError(f"problem index {index} out of range 0..{len(self.problems) - 1}")
            self._problem = self.problems[index]
        else:
            self._problem = generate_problem(
                self._rng, kinds=self.kinds, difficulty=self.difficulty, answer_length=self.answer_length
            )
        self._steps = 0
        self._done = False
        obs: Observation = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self._problem.question},
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
            obs: Observation = [
                {"role": "user", "content": "No answer found. Put the final answer inside <answer></answer>."}
            ]
            return obs, float(self.invalid_reward), False, out_of_attempts, info
        correct = is_equivalent(answer, problem.answer, time_limit_s=self.check_time_limit_s)
        terminated = correct or out_of_attempts
        self._done = terminated
        info = {
            "anchor": problem.question,
            "success": correct,
            "action_valid": True,
            "format_ok": format_ok,
            "answer": answer[:MAX_ANSWER_CHARS],  # a hostile megabyte answer stays out of the logs
        }
        reply = "Correct." if correct else "Incorrect." if terminated else "Incorrect, try again."
        reward = self.correct_reward if correct else self.wrong_reward
        return [{"role": "user", "content": reply}], float(reward), terminated, False, info

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
