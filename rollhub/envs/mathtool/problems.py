"""Arithmetic that a 135M model cannot do in its head but a one-line program can.

Kinds (`KINDS`), each with an integer answer:
* `product`: a 3-4 digit number times a 3 digit number (`Compute 4821 * 377.`);
* `sum`: five to seven numbers of 3-4 digits (`Compute 4821 + 377 + 9012 + 155 + 6003.`);
* `expression`: products, sums and differences mixed (`Compute 347 * 29 - 4821 + 96 * 13.`);
* `modular`: the remainder of a product or of a power (`What is the remainder when 48213 * 377
  is divided by 97?`, `... when 7 to the power of 23 is divided by 13?`);
* `word`: a short story around a product and a sum or difference.

The answers are out of reach of mental arithmetic for a small model (SmolLM2-135M gets none of
a 3x3-digit product right without a tool) and within reach of `print(...)` of the numbers the
question states, so what a policy must learn is to call the tool and copy its output.

Train/test split by content, as `rollhub.envs.math.problems` does for Math-v0: a hash of the
question text puts every problem in the test partition (30%) or the train partition, whatever
seed drew it; `held_out_problems` lists a fixed set of distinct test problems.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from rollhub.envs.math.problems import TEST_PERMILLE, Problem

KINDS = ("product", "sum", "expression", "modular", "word")
KEY_PREFIX = "mathtool:"
# the seed of the stream that lists the test set; any fixed value works, it must never change
TEST_SET_SEED = 0x70015


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1))


def _product(rng: np.random.Generator) -> Problem:
    a, b = _int(rng, 100, 9999), _int(rng, 100, 999)
    return Problem(f"Compute {a} * {b}.", str(a * b), "product", answer_form="integer")


def _sum(rng: np.random.Generator) -> Problem:
    terms = [_int(rng, 100, 9999) for _ in range(_int(rng, 5, 7))]
    return Problem(f"Compute {' + '.join(map(str, terms))}.", str(sum(terms)), "sum", answer_form="integer")


def _expression(rng: np.random.Generator) -> Problem:
    """Two products joined by + or -, with a sum or difference of a third number between."""
    a, b, c, d, e = _int(rng, 100, 999), _int(rng, 11, 99), _int(rng, 100, 9999), _int(rng, 11, 99), _int(rng, 11, 99)
    first, second = "+-"[_int(rng, 0, 1)], "+-"[_int(rng, 0, 1)]
    value = a * b + (c if first == "+" else -c) + (d * e if second == "+" else -d * e)
    return Problem(
        f"Compute {a} * {b} {first} {c} {second} {d} * {e}.", str(value), "expression", answer_form="integer"
    )


def _modular(rng: np.random.Generator) -> Problem:
    m = _int(rng, 7, 97)
    if rng.random() < 0.5:
        a, b = _int(rng, 1000, 99999), _int(rng, 100, 999)
        question = f"What is the remainder when {a} * {b} is divided by {m}?"
        return Problem(question, str(a * b % m), "modular", answer_form="integer")
    base, power = _int(rng, 2, 19), _int(rng, 10, 40)
    question = f"What is the remainder when {base} to the power of {power} is divided by {m}?"
    return Problem(question, str(pow(base, power, m)), "modular", answer_form="integer")


_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana")


def _word(rng: np.random.Generator) -> Problem:
    name = _NAMES[_int(rng, 0, len(_NAMES) - 1)]
    a, b, c = _int(rng, 12, 99), _int(rng, 105, 999), _int(rng, 100, 999)
    template = _int(rng, 0, 2)
    if template == 0:
        question = (
            f"A warehouse has {a} shelves with {b} boxes on each. {name} ships out {c} boxes. How many boxes are left?"
        )
        answer = a * b - c
    elif template == 1:
        question = (
            f"{name} buys {a} tickets at {b} dollars each and pays {c} dollars for parking. How much is that in total?"
        )
        answer = a * b + c
    else:
        question = f"A farm packs {b} eggs a day for {a} days and sells {c} of them. How many eggs are still there?"
        answer = a * b - c
    return Problem(question, str(answer), "word", answer_form="integer")


_BUILDERS = {"product": _product, "sum": _sum, "expression": _expression, "modular": _modular, "word": _word}


def check_kinds(kinds: tuple[str, ...]) -> None:
    unknown = [k for k in kinds if k not in _BUILDERS]
    if unknown or not kinds:
        raise ValueError(f"unknown problem kinds {unknown}; choose from {', '.join(KINDS)}")


def generate_problem(rng: np.random.Generator, kinds: tuple[str, ...] = KINDS) -> Problem:
    """One problem of a kind drawn uniformly from `kinds`; the same generator state gives the same problem."""
    check_kinds(kinds)
    return _BUILDERS[kinds[_int(rng, 0, len(kinds) - 1)]](rng)


def problem_key(question: str) -> str:
    """The identity of a problem: a hash of its question with whitespace collapsed."""
    text = " ".join(question.split())
    return KEY_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def key_in_test_partition(key: str) -> bool:
    """Whether a key (`problem_key`) is held out; a key that is not ours counts as held out."""
    if not key.startswith(KEY_PREFIX):
        return True
    try:
        return int(key[len(KEY_PREFIX) :][:8], 16) % 1000 < TEST_PERMILLE
    except ValueError:
        return True


def in_test_partition(question: str) -> bool:
    return key_in_test_partition(problem_key(question))


@lru_cache(maxsize=32)
def held_out_problems(kinds: tuple[str, ...], size: int) -> tuple[Problem, ...]:
    """The fixed test set: the first `size` distinct test-partition problems of one stream
    (seeded by `TEST_SET_SEED`), so every machine evaluates on the same list."""
    if size < 1:
        raise ValueError(f"test_size must be >= 1, got {size}")
    check_kinds(kinds)
    rng = np.random.default_rng(TEST_SET_SEED)
    chosen: dict[str, Problem] = {}
    misses = 0
    while len(chosen) < size:
        problem = generate_problem(rng, kinds)
        key = problem_key(problem.question)
        if key in chosen or not key_in_test_partition(key):
            misses += 1
            if misses > 200 * size + 2000:
                raise ValueError(f"only {len(chosen)} distinct test problems exist for kinds {list(kinds)}")
            continue
        misses = 0
        chosen[key] = problem
    return tuple(chosen.values())
