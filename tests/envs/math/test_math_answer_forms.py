"""Answers must be answers: a literal of the form the problem states, never an expression.

Copying the question's expression into `<answer>` used to score 1 on most procedural problems of
Math-v0 and MathTool (the checker evaluated it). These tests play every problem kind of both envs
over 200 seeds with agents that echo the question in many shapes, and check that the gold answer
in the stated form, and the harmless variants a real model writes, still score 1.
"""

from __future__ import annotations

import json
import re

import pytest

from rollhub.envs.math.answer_forms import FORM_STATEMENTS, answer_is_correct, infer_form, read_literal
from rollhub.envs.math.env import MathEnv
from rollhub.envs.math.problems import KINDS as MATH_KINDS
from rollhub.envs.mathtool.env import MathToolEnv
from rollhub.envs.mathtool.problems import KINDS as MATHTOOL_KINDS

SEEDS = range(200)


def echoes(question: str) -> list[str]:
    """What an agent that does no work writes: the question's expression, reshaped."""
    expressions = []
    for pattern in (r"Compute (.*)\. Give", r"Compute (.*)\.$", r"Solve for x: (.*)\.$"):
        match = re.match(pattern, question)
        if match:
            expressions.append(match.group(1))
            break
    match = re.match(r"What is the remainder when (.*) is divided by (\d+)\?$", question)
    if match:
        left, modulus = match.groups()
        power = re.fullmatch(r"(\d+) to the power of (\d+)", left)
        if power:
            base, exponent = power.groups()
            expressions += [f"{base}**{exponent} % {modulus}", f"pow({base}, {exponent}, {modulus})"]
        else:
            expressions += [f"{left} % {modulus}", f"({left}) mod {modulus}"]
    if not expressions:  # a word problem: the question itself and its numbers in the story's arithmetic
        a, b, c = (re.findall(r"\d+", question) + ["1", "1", "1"])[:3]
        expressions += [question, f"{a} * {b} - {c}", f"{a} * {b} + {c}", f"{a} + {b} * {c} - {int(a) // 2}"]
    shapes = []
    for e in expressions:
        shapes += [e, e.replace(" ", ""), f"({e})", f"{e} =", f"{e}=", f"int({e})", f"print({e})", e.replace("^", "**")]
    return shapes


async def _score(env, seed: int, reply: str) -> float:
    await env.reset(seed=seed)
    return (await env.step(reply))[1]


ENVS = [(MathEnv, kind) for kind in MATH_KINDS] + [(MathToolEnv, kind) for kind in MATHTOOL_KINDS]


@pytest.mark.parametrize("env_class,kind", ENVS, ids=[f"{c.__name__}-{k}" for c, k in ENVS])
async def test_echoing_the_question_scores_zero_and_the_gold_scores_one(env_class, kind):
    env = env_class(kinds=(kind,))
    for seed in SEEDS:
        obs, _ = await env.reset(seed=seed)
        problem = env.problem
        if env_class is MathEnv:  # the form is stated: after the question, or in MathTool's system prompt
            assert FORM_STATEMENTS[problem.answer_form] in obs[-1]["content"]
        else:
            assert problem.answer_form == "integer" and "as an integer" in obs[0]["content"]
        for reply in echoes(problem.question):
            assert await _score(env, seed, f"<answer>{reply}</answer>") == 0.0, (problem.question, reply)
        assert await _score(env, seed, f"<answer>{problem.answer}</answer>") == 1.0, problem


async def test_an_untagged_restated_equation_is_no_answer():
    env = MathEnv(kinds=("linear_equation",))  # require_format is off: the untagged reply is read
    for seed in SEEDS:
        await env.reset(seed=seed)
        equation = env.problem.question.removeprefix("Solve for x: ")
        assert await _score(env, seed, equation) == 0.0
        assert await _score(env, seed, f"So x = {env.problem.answer}.") == 1.0


def _honest(gold: str, unknown: str = "") -> list[str]:
    typeset = gold.replace("-", "\u2212")
    variants = [gold, f"  {gold}\n", f"{gold}.", f"${gold}$", f"**{gold}**", f"\\({gold}\\)", typeset]
    if unknown:
        variants += [f"x = {gold}", f"x={gold}", f"$x = {gold}$"]
    return variants


@pytest.mark.parametrize("env_class,kind", ENVS, ids=[f"{c.__name__}-{k}" for c, k in ENVS])
async def test_harmless_variants_of_the_gold_still_score_one(env_class, kind):
    env = env_class(kinds=(kind,))
    for seed in range(40):
        await env.reset(seed=seed)
        problem = env.problem
        for reply in _honest(problem.answer, problem.unknown):
            assert await _score(env, seed, f"<answer>{reply}</answer>") == 1.0, (problem, reply)
        assert await _score(env, seed, f"<answer>\\boxed{{{problem.answer}}}</answer>") == 1.0


@pytest.mark.parametrize(
    "answer,gold,form,unknown,expected",
    [
        ("1,817,517", "1817517", "integer", "", True),  # thousands separators, grouped by three
        ("1817,517", "1817517", "integer", "", False),  # a wrong grouping: two numbers
        ("5,6", "56", "integer", "", False),  # two answers
        ("5, 6", "5", "integer", "", False),
        ("5 or 6", "5", "integer", "", False),
        ("5 6", "56", "integer", "", False),
        ("", "0", "integer", "", False),
        ("   ", "0", "integer", "", False),
        ("\uff14\uff12", "42", "integer", "", False),  # fullwidth digits
        ("\u0664\u0662", "42", "integer", "", False),  # Arabic-Indic digits
        ("\U0001d7d2\U0001d7d0", "42", "integer", "", False),  # mathematical bold digits
        ("4\u00b2", "42", "integer", "", False),  # a superscript two
        ("\u221242", "-42", "integer", "", True),  # the typeset minus sign
        ("42.0", "42", "integer", "", False),  # the problem asked for an integer
        ("+42", "42", "integer", "", False),
        ("(42)", "42", "integer", "", False),
        ("42 apples", "42", "integer", "", False),
        ("x = 42", "42", "integer", "", False),  # no unknown was asked for
        ("$12", "12", "integer", "", True),  # a price
        ("$12 + $3", "15", "integer", "", False),
        ("12 dollars", "12", "integer", "", False),
        ("y = 5", "5", "integer", "x", False),
        ("x = 5", "5", "integer", "x", True),
        ("x = 2 + 3", "5", "integer", "x", False),
        ("3/4", "3/4", "fraction", "", True),
        ("-3/4", "-3/4", "fraction", "", True),
        ("\\frac{3}{4}", "3/4", "fraction", "", True),
        ("-\\dfrac{3}{4}", "-3/4", "fraction", "", True),
        ("6/8", "3/4", "fraction", "", False),  # not reduced
        ("0.75", "3/4", "fraction", "", False),  # not a fraction
        ("3/-4", "-3/4", "fraction", "", False),
        ("2", "2", "fraction", "", True),  # a whole number is its own reduced fraction
        ("2/1", "2", "fraction", "", True),
        ("3/0", "3/4", "fraction", "", False),
        ("0.750", "0.75", "decimal", "", True),
        ("3/4", "0.75", "decimal", "", False),
        ("3/4", "0.75", "number", "", True),  # a dataset gold: any plain number of the same value
        ("6/8", "\\frac{3}{4}", "number", "", True),
        ("1,250", "1250", "number", "", True),
        ("1000 + 250", "1250", "number", "", False),
        ("9" * 200, "9" * 200, "integer", "", False),  # over the literal length cap
    ],
)
def test_the_literal_reader(answer, gold, form, unknown, expected):
    assert answer_is_correct(answer, gold, form, unknown) is expected


def test_forms_of_dataset_golds_are_inferred():
    assert [infer_form(g) for g in ("72", "1,250", "-0.5", "\\frac{3}{4}", "2\\sqrt{2}", "(1, 2)")] == [
        "number",
        "number",
        "number",
        "number",
        "expression",
        "expression",
    ]
    assert read_literal(None, "integer") is None and read_literal("5", "no such form") is None


async def test_a_gsm8k_file_still_scores_honest_answers(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    rows = [
        {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "A big number?", "answer": "#### 1,250"},
        {"problem": "Simplify $\\sqrt{8}$.", "solution": "$\\boxed{2\\sqrt{2}}$"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = MathEnv(dataset_path=str(path))
    cases = [
        (0, "<answer>7</answer>", 1.0),
        (0, "The answer is 7.", 1.0),
        (0, "<answer>3 + 4</answer>", 0.0),  # a number gold takes a number
        (1, "<answer>1250</answer>", 1.0),
        (1, "<answer>1,250</answer>", 1.0),
        (1, "<answer>1000 + 250</answer>", 0.0),
        (2, "<answer>2 \\sqrt{2}</answer>", 1.0),  # an expression gold keeps the evaluating checker
        (2, "<answer>\\sqrt{8}</answer>", 0.0),  # but restating the question's own math is no answer
    ]
    for index, reply, reward in cases:
        await env.reset(options={"index": index})
        assert (await env.step(reply))[1] == reward, reply


@pytest.mark.parametrize("kind", MATH_KINDS)
async def test_hard_and_long_math_problems_too(kind):
    length = "any" if kind == "linear_equation" else "long"  # a root has at most 4 characters
    env = MathEnv(kinds=(kind,), difficulty=5, answer_length=length)
    for seed in range(60):
        await env.reset(seed=seed)
        problem = env.problem
        for reply in echoes(problem.question):
            assert await _score(env, seed, f"<answer>{reply}</answer>") == 0.0, (problem.question, reply)
        assert await _score(env, seed, f"<answer>{problem.answer}</answer>") == 1.0, problem


MATH_STYLE = [
    {"problem": "Simplify $\\sqrt{50}$.", "solution": "$\\sqrt{50}=\\boxed{5\\sqrt{2}}$"},
    {"problem": "Expand $(x+1)(x+2)$.", "solution": "\\boxed{x^2+3x+2}"},
    {"problem": "Rationalize $\\frac{1}{\\sqrt{2}}$.", "solution": "\\boxed{\\frac{\\sqrt{2}}{2}}"},
]


async def test_a_dataset_expression_answer_may_not_restate_the_questions_math(tmp_path):
    """MATH-style golds are expressions, checked by evaluation; a 'simplify' question equals its answer by
    construction, so restating the question's math must score 0 (and be flagged), the gold still 1."""
    import json

    from rollhub.envs import make

    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in MATH_STYLE))
    echoes = ["\\sqrt{50}", "(x+1)(x+2)", "\\frac{1}{\\sqrt{2}}"]
    golds = ["5\\sqrt{2}", "x^2 + 3x + 2", "\\frac{\\sqrt{2}}{2}"]
    env = make("rollhub/Math-v0", dataset_path=str(path))
    seen = set()
    for seed in range(40):
        obs, _ = await env.reset(seed=seed)
        row = next(i for i, r in enumerate(MATH_STYLE) if r["problem"] in obs[-1]["content"])
        if row in seen:
            continue
        seen.add(row)
        _, reward, _, _, info = await env.step(f"<answer>${echoes[row]}$</answer>")
        assert reward == 0.0 and info["exploit_signals"]["echo_answer"], echoes[row]
        await env.reset(seed=seed)
        _, reward, _, _, _ = await env.step(f"<answer>{golds[row]}</answer>")
        assert reward == 1.0, golds[row]
    assert seen == {0, 1, 2}


def test_an_answer_phrase_inside_the_tag_is_harmless_wrapping():
    """Untagged prose 'The answer is 42.' is read; the same inside the tag must be too, or the tag costs."""
    for text in ("The answer is 42.", "Answer: 42", "the final answer is 42", "ANSWER IS: 42"):
        assert read_literal(text, "integer") == 42, text
    for text in ("The answer is 40 + 2", "answer 42", "The answer is 42 apples"):
        assert read_literal(text, "integer") is None, text
