import re
from fractions import Fraction

import numpy as np
import pytest
import sympy

from rollhub.envs.math.problems import KINDS, generate_problem


def evaluate_expression(text: str) -> Fraction:
    """Independent evaluation with sympy (exact rationals)."""
    return Fraction(str(sympy.nsimplify(sympy.sympify(text, rational=True))))


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_arithmetic_and_fraction_answers_are_exact(difficulty):
    rng = np.random.default_rng(difficulty)
    for _ in range(60):
        p = generate_problem(rng, kinds=("arithmetic",), difficulty=difficulty)
        assert evaluate_expression(p.question.removeprefix("Compute ").removesuffix(".")) == Fraction(p.answer)
        f = generate_problem(rng, kinds=("fraction",), difficulty=difficulty)
        expression = f.question.removeprefix("Compute ").split(". Give")[0]
        assert evaluate_expression(expression) == Fraction(f.answer)
        assert Fraction(f.answer).denominator == int(f.answer.split("/")[1]) if "/" in f.answer else True


@pytest.mark.parametrize("difficulty", [1, 3, 5])
def test_linear_equation_roots_satisfy_the_equation(difficulty):
    rng = np.random.default_rng(10 + difficulty)
    x = sympy.Symbol("x")
    for _ in range(60):
        p = generate_problem(rng, kinds=("linear_equation",), difficulty=difficulty)
        left, right = p.question.removeprefix("Solve for x: ").removesuffix(".").split(" = ")
        to_expr = lambda s: sympy.sympify(re.sub(r"(\d)x", r"\1*x", s))  # noqa: E731
        assert sympy.solve(sympy.Eq(to_expr(left), to_expr(right)), x) == [int(p.answer)]


def test_answer_length_and_kinds():
    rng = np.random.default_rng(0)
    short = [generate_problem(rng, answer_length="short") for _ in range(50)]
    long = [generate_problem(rng, answer_length="long") for _ in range(50)]
    assert all(len(p.answer) <= 3 for p in short)
    assert all(len(p.answer) >= 5 for p in long)
    assert {p.kind for p in short + long} <= set(KINDS)
    assert len({p.kind for p in short + long}) >= 3


def test_seeded_generation_is_deterministic():
    a = [generate_problem(np.random.default_rng(4)) for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_bad_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="difficulty"):
        generate_problem(rng, difficulty=0)
    with pytest.raises(ValueError, match="kinds"):
        generate_problem(rng, kinds=("calculus",))
    with pytest.raises(ValueError, match="answer_length"):
        generate_problem(rng, answer_length="medium")
