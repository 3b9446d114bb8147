"""Procedural math problems with exact answers, for RLVR without any dataset.

Kinds: `arithmetic` (integer expressions, more and larger operands with difficulty),
`linear_equation` (one unknown, integer root; x on both sides from difficulty 3),
`fraction` (sums/differences/products of fractions; the answer is a reduced fraction),
`word` (short multi-step stories in the style of GSM8K). Difficulty runs 1..5.
`answer_length` picks short answers (at most 3 characters) or long ones (at least 5),
which changes how many tokens the reward depends on.

Train/test split by content: every problem falls in the test or the train partition by a hash
of its question text (`problem_key`, `in_test_partition`), so a problem is held out whatever
seed, kinds or difficulty produced it. `held_out_problems` lists a fixed, deterministic set of
distinct test-partition problems; the train split redraws any problem of the test partition
(`rollhub.envs.math.env.MathEnv`, `split=`). Difficulty 1 arithmetic (a +/- b, a and b in
1..20) has 800 problems: about 240 in the test partition, about 560 left for training.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Literal

import numpy as np

from rollhub.envs.math.answer_forms import FORM_STATEMENTS

KINDS = ("arithmetic", "linear_equation", "fraction", "word")
AnswerLength = Literal["any", "short", "long"]
MAX_DIFFICULTY = 5
# share of the content-hash space held out for testing, per mille: 30% of any problem space
TEST_PERMILLE = 300
# the seed of the stream that lists the test set; any fixed value works, it must never change
TEST_SET_SEED = 0x7E57


@dataclass(frozen=True)
class Problem:
    """One problem. `answer_form` is the form its answer must take (`answer_forms.FORMS`; "" for a
    dataset problem: inferred from the gold), `unknown` the variable it asks for (`x`), if any."""

    question: str
    answer: str
    kind: str = "dataset"
    difficulty: int = 0
    answer_form: str = ""
    unknown: str = ""


def stated_question(problem: Problem) -> str:
    """The question as the model reads it: with the sentence that states the answer's form.

    Shown, not stored: the question text alone stays the problem's identity (`problem_key`), so
    stating the form moved no problem between the train and test partitions."""
    statement = FORM_STATEMENTS.get(problem.answer_form)
    if statement is None or statement in problem.question:
        return problem.question
    return f"{problem.question} {statement}"


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1))


def _arithmetic(rng: np.random.Generator, difficulty: int, scale: int) -> Problem:
    # difficulty 1 spans 1..20 (800 problems), not 1..10 (200): enough for a held-out test set of
    # 200 and a disjoint training set at the same level (SmolLM2-135M's greedy accuracy is alike)
    high = (20 if difficulty == 1 else 10 ** min(difficulty, 3)) * scale
    first = _int(rng, 1, high)
    # value = finished terms + the running product term, so "*" binds tighter than + and -
    text, finished, term = str(first), 0, first
    for _ in range(difficulty):
        op = "+-*"[_int(rng, 0, 2 if difficulty > 1 else 1)]
        operand = _int(rng, 1, high if op != "*" else max(9, high // 10))
        if op == "*" and difficulty >= 3 and rng.random() < 0.5:
            text, finished, term = f"({text}) * {operand}", 0, (finished + term) * operand
        elif op == "*":
            text, term = f"{text} * {operand}", term * operand
        else:
            text, finished, term = f"{text} {op} {operand}", finished + term, operand if op == "+" else -operand
    return Problem(f"Compute {text}.", str(finished + term), "arithmetic", difficulty, "integer")


def _linear_equation(rng: np.random.Generator, difficulty: int, scale: int) -> Problem:
    span = 5 * difficulty * scale
    x = _int(rng, -span, span)
    a = _int(rng, 1, 3 * difficulty) * (1 if rng.random() < 0.7 else -1)
    b = _int(rng, -10 * difficulty, 10 * difficulty)
    if a == 1 and b == 0:  # "x = 5" would state its own answer; no extra draw keeps the stream
        b = 1
    if difficulty >= 3:
        c = a
        while c == a:
            c = _int(rng, -3 * difficulty, 3 * difficulty)
        e = a * x + b - c * x
        question = f"Solve for x: {_linear(a, b)} = {_linear(c, e)}."
    else:
        question = f"Solve for x: {_linear(a, b)} = {a * x + b}."
    return Problem(question, str(x), "linear_equation", difficulty, "integer", "x")


def _linear(a: int, b: int) -> str:
    head = {1: "x", -1: "-x", 0: "0"}.get(a, f"{a}x")
    if b == 0:
        return head
    return f"{head} {'+' if b > 0 else '-'} {abs(b)}"


def _fraction(rng: np.random.Generator, difficulty: int, scale: int) -> Problem:
    def pick() -> Fraction:
        return Fraction(_int(rng, 1, 4 * difficulty * scale), _int(rng, 2, 3 + 3 * difficulty))

    value = pick()
    text = _show(value)
    for _ in range(1 + difficulty // 2):
        op, operand = "+-*"[_int(rng, 0, 2)], pick()
        left = f"({text})" if op == "*" and " " in text else text
        text = f"{left} {op} {_show(operand)}"
        value = value * operand if op == "*" else value + operand if op == "+" else value - operand
    question = f"Compute {text}. Give the answer as a reduced fraction."
    return Problem(question, _show(value), "fraction", difficulty, "fraction")


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _word(rng: np.random.Generator, difficulty: int, scale: int) -> Problem:
    names = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana")
    name = names[_int(rng, 0, len(names) - 1)]
    high = 10 * difficulty * scale
    a, b, c = _int(rng, 2, high), _int(rng, 2, 9 + difficulty), _int(rng, 1, high)
    template = _int(rng, 0, 2)
    if template == 0:
        question = (
            f"{name} has {a} stickers, buys {b} packs of {c} stickers and gives away {a // 2}. "
            f"How many stickers does {name} have now?"
        )
        answer = a + b * c - a // 2
    elif template == 1:
        question = (
            f"A shop sells pens at {b} dollars each. {name} buys {a} pens and pays with {a * b + c} dollars. "
            f"How much change does {name} get?"
        )
        answer = c
    else:
        question = (
            f"{name} reads {a} pages a day for {b} days, then {c} pages on the last day. "
            "How many pages is that in total?"
        )
        answer = a * b + c
    return Problem(question, str(answer), "word", difficulty, "integer")


_BUILDERS = {"arithmetic": _arithmetic, "linear_equation": _linear_equation, "fraction": _fraction, "word": _word}


def generate_problem(
    rng: np.random.Generator,
    *,
    kinds: tuple[str, ...] = KINDS,
    difficulty: int | None = None,
    answer_length: AnswerLength = "any",
    tries: int = 200,
) -> Problem:
    """One problem. `difficulty=None` draws 1..3; `answer_length` filters by answer size."""
    unknown = [k for k in kinds if k not in _BUILDERS]
    if unknown or not kinds:
        raise ValueError(f"unknown problem kinds {unknown}; choose from {', '.join(KINDS)}")
    if difficulty is not None and not 1 <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"difficulty must be 1..{MAX_DIFFICULTY}, got {difficulty}")
    if answer_length not in ("any", "short", "long"):
        raise ValueError(f"answer_length must be 'any', 'short' or 'long', got {answer_length!r}")
    scale = 30 if answer_length == "long" else 1
    for _ in range(tries):
        kind = kinds[_int(rng, 0, len(kinds) - 1)]
        level = difficulty if difficulty is not None else _int(rng, 1, 3)
        problem = _BUILDERS[kind](rng, level, scale)
        size = len(problem.answer)
        if (
            answer_length == "any"
            or (answer_length == "short" and size <= 3)
            or (answer_length == "long" and size >= 5)
        ):
            return problem
    raise ValueError(f"no {answer_length} answer for kinds {kinds} at difficulty {difficulty} in {tries} tries")


def problem_key(question: str) -> str:
    """The identity of a problem: a hash of its question with whitespace collapsed.

    The same text is the same problem whichever seed, kind or difficulty setting produced it,
    so overlap between a train and a test set is checked by content, never by seed.
    """
    text = " ".join(question.split())
    return "math:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def key_in_test_partition(key: str) -> bool:
    """Whether a problem key (`problem_key`) belongs to the held-out test partition."""
    digest = key.removeprefix("math:")
    try:
        return int(digest[:8], 16) % 1000 < TEST_PERMILLE
    except ValueError:  # not one of our keys: it cannot be told apart, so treat it as held out
        return True


def in_test_partition(question: str) -> bool:
    """Whether a problem is held out for testing (the train split never produces it)."""
    return key_in_test_partition(problem_key(question))


@lru_cache(maxsize=64)
def held_out_problems(
    kinds: tuple[str, ...], difficulty: int | None, answer_length: AnswerLength, size: int
) -> tuple[Problem, ...]:
    """The fixed test set: the first `size` distinct test-partition problems of one stream.

    Deterministic (the stream's seed is `TEST_SET_SEED`), distinct by `problem_key`, and all in
    the test partition, so no train split of any setting can draw one. Raises ValueError when the
    setting's problem space holds fewer than `size` test problems.
    """
    if size < 1:
        raise ValueError(f"test_size must be >= 1, got {size}")
    rng = np.random.default_rng(TEST_SET_SEED)
    chosen: dict[str, Problem] = {}
    misses = 0
    while len(chosen) < size:
        problem = generate_problem(rng, kinds=kinds, difficulty=difficulty, answer_length=answer_length)
        key = problem_key(problem.question)
        if key in chosen or not key_in_test_partition(key):
            misses += 1
            if misses > 200 * size + 2000:  # the space is exhausted (each miss is a repeat or a train problem)
                raise ValueError(
                    f"only {len(chosen)} distinct test problems exist for kinds {list(kinds)}, difficulty "
                    f"{difficulty}, answer_length {answer_length}; lower test_size or widen the setting"
                )
            continue
        misses = 0
        chosen[key] = problem
    return tuple(chosen.values())
