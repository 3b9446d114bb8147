"""The math reward against answers a policy finds when it is paid for them: words around a number
that change or hedge it, appended factors that turn an exact check approximate, and values that
under- or overflow floating point. Every one must score 0 (never raise), and honest answers 1."""

import json
import time

import numpy as np
import pytest

from rollhub.envs.math.answers import extract_answer, is_equivalent, stated_number
from rollhub.envs.math.env import MathEnv
from rollhub.envs.math.problems import KINDS, generate_problem, held_out_problems

# (answer text, gold values none of which it may be credited with)
AMBIGUOUS = [
    ("not 5", ["5"]),
    ("Not 5.", ["5"]),
    ("isn't 5", ["5"]),
    ("isn’t 5", ["5"]),
    ("The answer is not 5", ["5"]),
    ("it is never 5", ["5"]),
    ("no, 5", ["5"]),
    ("5 minus one", ["5", "4"]),
    ("5 minus 1", ["5", "1", "4"]),
    ("5 plus one", ["5"]),
    ("5 times two", ["5"]),
    ("5 squared", ["5"]),
    ("5!", ["5"]),
    ("5 !", ["5"]),
    ("5 or 6", ["5", "6"]),
    ("5 or six", ["5"]),
    ("either 5 or six", ["5"]),
    ("either six or 5", ["5"]),
    ("six or 5", ["5"]),
    ("between 5 and 7", ["5", "7"]),
    ("from 5 to 7", ["5", "7"]),
    ("5 to 7", ["5", "7"]),
    ("5 and 6", ["5", "6"]),
    ("5 6", ["5", "6"]),
    ("5 (or maybe 6)", ["5", "6"]),
    ("5 (maybe)", ["5"]),
    ("maybe 5", ["5"]),
    ("probably 5", ["5"]),
    ("5?", ["5"]),
    ("5 ?", ["5"]),
    ("~5", ["5"]),
    ("≈5", ["5"]),
    ("approximately 5", ["5"]),
    ("about 5", ["5"]),
    ("around 5", ["5"]),
    ("roughly 5", ["5"]),
    ("at least 5", ["5"]),
    ("at most 5", ["5"]),
    ("more than 5", ["5"]),
    ("less than 5", ["5"]),
    ("5 or so", ["5"]),
    ("5 ish", ["5"]),
    ("5ish", ["5"]),
    ("> 5", ["5"]),
    ("< 5", ["5"]),
    ("5 ± 1", ["5"]),
    ("5 +/- 1", ["5", "1"]),
    ("negative 5", ["5", "-5"]),
    ("twice 5", ["5"]),
    ("half of 10", ["10", "5"]),
    ("5 hundred", ["5", "500"]),
    ("5 thousand", ["5", "5000"]),
    ("5k", ["5", "5000"]),
    ("5 dozen", ["5"]),
    ("5 and a half", ["5"]),
    ("sqrt 25", ["25"]),  # sqrt(25) in the grammar: 5, never 25
    ("log 5", ["5"]),
    ("The answer is five or 5", ["5"]),
    ("It is 4 or 5.", ["4", "5"]),
    ("6, or 5", ["5", "6"]),
    ("It is 6. 5", ["5", "6"]),
    ("4; 5", ["4", "5"]),
    ("x = 4 or x = 5", ["4", "5"]),
    ("x = 4, y = 5", ["4", "5"]),
    ("x != 5", ["5"]),
    ("x ≠ 5", ["5"]),
    ("x <= 5", ["5"]),
    ("5-1", ["5", "-1", "1"]),  # 4, never 5 or its last token
    ("five", ["5"]),
    ("٥", ["5"]),  # Arabic-Indic five
    ("５", ["5"]),  # fullwidth five
    ("𝟓", ["5"]),  # mathematical bold five
    ("nоt 5", ["5"]),  # Cyrillic о: a look-alike is no escape
    ("5\u200b", ["5"]),
    ("The answer is 5. Or maybe not.", ["5"]),
    ("5. No wait, 6", ["5", "6"]),
    ("the answer is 5 or 6 apples", ["5", "6"]),
]


@pytest.mark.parametrize("text,golds", AMBIGUOUS, ids=[t for t, _ in AMBIGUOUS])
def test_prose_that_negates_hedges_or_changes_the_number_scores_zero(text, golds):
    for gold in golds:
        assert not is_equivalent(text, gold), f"{text!r} credited as {gold}"
        untagged, _ = extract_answer(f"Let me think.\n{text}")
        assert untagged is None or not is_equivalent(untagged, gold), f"untagged {text!r} -> {untagged!r}"


@pytest.mark.parametrize(
    "text,number",
    [
        ("The answer is 17.", "17"),
        ("The answer is 17", "17"),
        ("17 apples", "17"),
        ("17 apples.", "17"),
        ("It is 17", "17"),
        ("Answer: 17", "17"),
        ("answer: -17", "-17"),
        ("So, the final answer is 17.", "17"),
        ("**17**", "17"),
        ("The answer is **17**.", "17"),
        ("23 + 19 = 42", "42"),
        ("So 23 + 19 = 42.", "42"),
        ("x = -3", "-3"),
        ("The total is 1,250 dollars.", "1,250"),
        ("3/4", "3/4"),
        ("It costs $12", "12"),
        ("It is not 4. It is 5.", "5"),
        ("17", "17"),
    ],
)
def test_honest_prose_still_states_its_number(text, number):
    assert stated_number(text) == number
    assert extract_answer(f"Let me think step by step.\n{text}") == (number, False)


async def test_untagged_negation_through_step_scores_zero():
    env = MathEnv(kinds=("arithmetic",), difficulty=1)
    for seed in range(5):
        await env.reset(seed=seed)
        answer = env.problem.answer
        for reply in (f"The answer is not {answer}", f"either {answer} or six", f"{answer}!", f"maybe {answer}"):
            _, reward, *_ = await env.step(reply)
            assert reward == 0.0, reply
            await env.reset(seed=seed)
        _, reward, *_ = await env.step(f"The answer is {answer}.")
        assert reward == 1.0


# -- exact golds are compared exactly -------------------------------------------------------

APPENDED = ["*pi/pi", "*sqrt(2)/sqrt(2)", "*exp(0)", "*cos(0)", "/1.0", "*1.0", "+0.0", "e0", "*(1+1e-12)", "+1e-12"]


@pytest.mark.parametrize("suffix", APPENDED)
def test_appending_an_approximate_factor_never_makes_a_wrong_answer_right(suffix):
    for wrong, gold in (("123456789012", "123456789013"), ("1000000001", "1000000000"), ("1/2", "0.5000000001")):
        assert not is_equivalent(f"({wrong}){suffix}", gold), f"({wrong}){suffix} vs {gold}"
    assert not is_equivalent("(1/2 + 10^-12)*pi/pi", "1/2")
    assert not is_equivalent("x*(1+1e-12)", "x") and not is_equivalent("x*pi/pi + 10^-11", "x")


def test_exact_values_written_exactly_still_match():
    for predicted, gold in (
        ("123456789013*1.0", "123456789013"),
        ("123456789013e0", "123456789013"),
        ("123456789013+0.0", "123456789013"),
        ("4^(1/2)", "2"),
        ("8^(2/3)", "4"),
        ("(1/4)^(-1/2)", "2"),
        ("(x+1)^2", "x^2+2x+1"),
        ("(x-1)(x+1)", "x^2-1"),
        ("sqrt(2)/2", "1/sqrt(2)"),
    ):
        assert is_equivalent(predicted, gold), (predicted, gold)


def test_an_approximate_gold_keeps_its_own_tolerance():
    assert is_equivalent("2*sqrt(2)", r"\sqrt{8}")
    assert not is_equivalent("1414213562000", "10^12*sqrt(2)")  # 10 digits right: not the value
    assert not is_equivalent("1414213562000*pi/pi", "10^12*sqrt(2)")
    assert not is_equivalent("3141592*pi/pi", "1000000*pi")


# -- nothing raises, nothing is slow -------------------------------------------------------

HOSTILE = [
    "x/10^-400",
    "x/10^(-400)",
    "pi/10^-400",
    "pi*10^-400",
    "1/(pi*10^-400)",
    "sqrt(10^-400)",
    "x/exp(-1000)",
    "1/exp(-10000)",
    "x*10^300*10^300*pi",
    "(10^300)^20",
    "10^-4000",
    "2^-4096",
    "x^4096",
    "x^(10^-400)",
    "x^x^x^x^x^x^x",
    "E^E^E^E^E^E",
    "exp(exp(exp(10)))",
    "sin(10^300)",
    "tan(pi/2)",
    "log(0)",
    "0^0",
    "0^-1",
    "(-1)^(1/2)",
    "(-8)^(1/3)",
    "I^I",
    "nan",
    "NaN",
    "inf",
    "-inf",
    r"\infty",
    r"-\infty",
    r"\frac{1}{0}",
    r"\frac{x}{10^{-400}}",
    r"\frac{1}{10^{-400}}",
    "\\frac{" * 300 + "1",
    "\\frac{1}{" * 150 + "2" + "}" * 150,
    "\\sqrt{" * 200 + "2" + "}" * 200,
    "(" * 19 + "1" + ")" * 19 + "/" + "10^-400",
    "1" * 1000,
    "1" * 10**6,
    "9" * 99 + "e" + "9" * 99,
    "٥",
    "５",
    "𝟓",
    "5\u0000",
    "\u202e5",
    "1e-320*x/1e-320",
    "1/(1-1)",
    "1/(1e-400)",
    "(1e-200)*(1e-200)*x",
    "x/(x-x)",
]


@pytest.mark.parametrize("answer", HOSTILE, ids=lambda a: ascii(a[:24]))
def test_hostile_answers_score_zero_never_raise_and_stay_fast(answer):
    is_equivalent("1/2", "0.5")  # warm-up
    for gold in ("5", "x", "0", "1", "pi"):
        started = time.perf_counter()
        assert is_equivalent(answer, gold) is False
        assert (time.perf_counter() - started) < 0.2, f"{answer[:30]!r} vs {gold} too slow"


@pytest.mark.parametrize("answer", HOSTILE, ids=lambda a: ascii(a[:24]))
async def test_hostile_answers_through_step_score_zero(tmp_path, answer):
    path = tmp_path / "gold.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": f"#### {g}"}) + "\n" for i, g in enumerate("5x"))
    )
    env = MathEnv(dataset_path=str(path))
    for index in (0, 1):
        for action in (f"<answer>{answer}</answer>", f"\\boxed{{{answer}}}", answer):
            await env.reset(options={"index": index})
            _, reward, *_ = await env.step(action)
            assert reward == 0.0


# -- honest answers: every generated gold still scores 1 in each gold format ---------------


def _golds() -> list[str]:
    rng = np.random.default_rng(7)
    answers = set()
    for kind in KINDS:
        for difficulty in range(1, 6):
            for length in ("any", "long"):
                for _ in range(25):
                    try:
                        problem = generate_problem(rng, kinds=(kind,), difficulty=difficulty, answer_length=length)
                    except ValueError:  # no long answer at this level
                        break
                    answers.add(problem.answer)
    answers |= {p.answer for p in held_out_problems(("arithmetic",), 1, "any", 200)}
    answers |= {p.answer for p in held_out_problems(KINDS, None, "any", 200)}
    return sorted(answers)


async def test_every_generated_gold_scores_one_in_every_gold_format():
    golds = _golds()
    assert len(golds) > 500
    failures = []
    for gold in golds:
        for reply in (
            f"<answer>{gold}</answer>",
            f"\\boxed{{{gold}}}",
            f"<answer>\\boxed{{{gold}}}</answer>",
            f"Work... The answer is {gold}.",
            f"<answer>The answer is {gold}</answer>",
        ):
            answer, _ = extract_answer(reply)
            if not is_equivalent(answer, gold):
                failures.append((gold, reply))
    assert not failures, failures[:10]
