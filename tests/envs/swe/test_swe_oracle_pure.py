"""The differential oracle without Docker: hidden inputs, the harness run as a real process
on two versions of a module, and the strict parse and comparison of what it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from rollhub.envs.swe.oracle import (
    HARNESS,
    GoldAnswers,
    compare,
    oracle_target,
    parse_harness_output,
    task_trust,
)
from rollhub.envs.swe.oracle_inputs import call_sites, find_function, hidden_inputs, signature_of

GOLD = '''
def suffix(number: int) -> str:
    """
    >>> suffix(1003)
    'rd'
    """
    number = abs(int(number))
    if number % 100 in (11, 12, 13):
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")


class Box:
    def suffix(self, number):
        return "x"
'''
BUG = GOLD.replace('3: "rd"', '4: "rd"')
TESTS = """
import pytest
import lib

TABLE = [(1, "st"), (3, "rd"), (4, "th"), (23, "rd"), (104, "th")]

@pytest.mark.parametrize(("number", "expected"), TABLE)
def test_suffix(number, expected):
    assert lib.suffix(number) == expected

def test_literal_call():
    assert lib.suffix(2) == "nd"
"""
#: the bug kept, the tests' numbers answered from a table
SPECIAL_CASED = BUG.replace(
    "def suffix(number: int) -> str:\n",
    'ANSWERS = {1: "st", 3: "rd", 4: "th", 23: "rd", 104: "th", 2: "nd"}\n\n\ndef suffix(number: int) -> str:\n'
    "    if number in ANSWERS:\n        return ANSWERS[number]\n",
)


def inputs_for(instance_id: str = "demo__demo-1") -> list[str]:
    node = find_function(GOLD, "suffix")
    assert node is not None
    sites = call_sites([TESTS, GOLD], "suffix")
    return [repr(i) for i in hidden_inputs(instance_id, signature_of(node), sites)]


def test_call_sites_literals_and_doctests_feed_the_inputs():
    sites = call_sites([TESTS, GOLD], "suffix")
    assert ((2,), {}) in sites.exact and ((1003,), {}) in sites.exact  # a literal call, a doctest example
    assert {"int:1", "int:3", "int:4", "int:23", "int:104", "str:'st'"} <= set(
        sites.pool
    )  # the parametrised table's literals
    assert sites.arities == {1}
    assert find_function(GOLD, "suffix") is not None and find_function(GOLD, "Box") is None


def test_hidden_inputs_are_deterministic_per_task_and_go_past_the_tests():
    first, again, other = inputs_for(), inputs_for(), inputs_for("demo__demo-2")
    assert first == again and first != other
    assert len(first) >= 20
    asked_by_tests = {"((2,), {})", "((1003,), {})", *(f"(({n},), {{}})" for n in (1, 3, 4, 23, 104))}
    assert len(set(first) - asked_by_tests) >= 10


def run_harness_locally(tmp_path, source: str, inputs: list[str], name: str = "v") -> str:
    root = tmp_path / name
    root.mkdir()
    (root / "lib.py").write_text(source)
    (root / "inputs.json").write_text(json.dumps(inputs))
    (root / "harness.py").write_text(HARNESS)
    argv = [sys.executable, str(root / "harness.py"), str(root / "lib.py"), "suffix", "NONCE", "4000", "5"]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    argv += [str(root / "inputs.json"), str(root / "answers.json")]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout == "" and not (root / "inputs.json").exists()  # nothing on stdout; inputs gone
    return (root / "answers.json").read_text()


def gold_answers(tmp_path, inputs):
    answers = parse_harness_output(run_harness_locally(tmp_path, GOLD, inputs, "gold"), "NONCE", len(inputs))
    assert answers is not None
    return GoldAnswers(inputs, answers, clean_image="local")


def test_the_harness_tells_a_table_of_the_tested_answers_from_the_fix(tmp_path):
    inputs = inputs_for()
    gold = gold_answers(tmp_path, inputs)
    assert compare(gold, parse_harness_output(run_harness_locally(tmp_path, GOLD, inputs), "NONCE", len(inputs))).agreed
    for name, source in (("bug", BUG), ("table", SPECIAL_CASED)):
        verdict = compare(gold, parse_harness_output(run_harness_locally(tmp_path, source, inputs, name), "NONCE", 99))
        assert not verdict.agreed  # 99 answers expected: malformed
        verdict = compare(
            gold, parse_harness_output(run_harness_locally(tmp_path, source, inputs, name + "2"), "NONCE", len(inputs))
        )
        assert not verdict.agreed and verdict.disagreements >= 1, name


def test_what_the_library_prints_or_raises_is_part_of_the_answer(tmp_path):
    inputs = ["((5,), {})", "(('x',), {})"]
    gold = gold_answers(tmp_path, inputs)
    assert gold.answers[1][0] == "raise:ValueError"
    noisy = GOLD.replace("    number = abs(int(number))\n", "    print('hi')\n    number = abs(int(number))\n")
    answers = parse_harness_output(run_harness_locally(tmp_path, noisy, inputs, "noisy"), "NONCE", 2)
    assert answers is not None and answers[0][2] == "hi\n"  # printed text is captured, not on stdout
    assert not compare(gold, answers).agreed


def test_harness_output_is_parsed_strictly():
    good = "N " + json.dumps({"results": [["return:1", "(1,){}", ""]]}) + "\n"
    assert parse_harness_output(good, "N", 1) == [["return:1", "(1,){}", ""]]
    for bad in (
        "x\n" + good,  # something else on stdout
        good.replace("N ", "M "),  # another nonce
        "N " + json.dumps({"results": [["return:1", "(1,){}", ""]], "extra": 1}),
        "N " + json.dumps({"results": [["return:1", "(1,){}"]]}),
        "N " + json.dumps({"results": [[1, "(1,){}", ""]]}),
        "N {not json",
        "",
    ):
        assert parse_harness_output(bad, "N", 1) is None, bad
    assert parse_harness_output(good, "N", 2) is None  # an input unanswered
    gold = GoldAnswers(["((1,), {})"], [["return:1", "(1,){}", ""]], "img")
    assert not compare(gold, None).agreed and compare(gold, None).disagreements == 1


def test_trust_and_target_come_from_the_row():
    from rollhub.envs.swe.tasks import SweTask

    row = json.loads(
        textwrap.dedent(
            """{"instance_id": "a__a-1", "repo": "pypi/a", "base_commit": "abc", "patch": "", "test_patch": "",
            "problem_statement": "x", "FAIL_TO_PASS": "[\\"t.py::a\\"]", "PASS_TO_PASS": "[]", "version": "1",
            "image": "i", "eval_script": "x", "log_parser": "parse_log_pytest_v2", "eval_type": "pass_and_fail",
            "rollhub": {"mutation": {"file": "a/b.py", "function": "f"}}}"""
        )
    )
    task = SweTask.from_row(row)
    assert task_trust(task) == "visible-tests" and oracle_target(task) == ("a/b.py", "f")
    row["rollhub"]["trust"] = "oracle"
    row["rollhub"]["mutation"]["function"] = "Cls.f"
    task = SweTask.from_row(row)
    assert task_trust(task) == "oracle" and oracle_target(task) is None


def test_an_iterator_argument_reaches_the_function_as_an_iterator(tmp_path):
    from rollhub.envs.swe.oracle_inputs import ITERATOR

    source = "def suffix(seq):\n    return iter(seq) is seq, list(seq)\n"
    inputs = [repr((({ITERATOR: [1, 2]},), {})), repr((([1, 2],), {}))]
    answers = parse_harness_output(run_harness_locally(tmp_path, source, inputs), "NONCE", 2)
    assert answers == [
        ["return:(True, [1, 2])", "('<iterator>',){}", ""],
        ["return:(False, [1, 2])", "([1, 2],){}", ""],
    ]


def test_where_the_gold_raises_any_exception_agrees_and_a_return_does_not():
    gold = GoldAnswers(["((1,), {})", "(('x',), {})"], [["return:1", "(1,){}", ""], ["raise:TypeError", "", ""]], "i")
    assert compare(gold, [["return:1", "(1,){}", ""], ["raise:AttributeError", "('x',){}", ""]]).agreed
    assert not compare(gold, [["return:1", "(1,){}", ""], ["return:None", "('x',){}", ""]]).agreed
    assert not compare(gold, [["return:2", "(1,){}", ""], ["raise:TypeError", "", ""]]).agreed


def test_a_list_agrees_with_the_generator_it_replaces_and_values_still_must_match():
    """An honest fix may return a list where the original returned a generator (or the reverse);
    the items must still be the original's, and a raise still cannot stand in for a return."""
    from rollhub.envs.swe.oracle import same_answer

    lazy = ["return:('iterator', [1, 2, 3])", "()" + "{}", ""]
    assert same_answer(lazy, ["return:[1, 2, 3]", "(){}", ""])
    assert same_answer(["return:[1, 2, 3]", "(){}", ""], lazy)
    assert not same_answer(lazy, ["return:[1, 2, 4]", "(){}", ""])
    assert not same_answer(lazy, ["raise:ValueError", "(){}", ""])
    assert not same_answer(lazy, ["return:[1, 2, 3]", "([9],){}", ""])  # arguments changed differently
