"""The differential oracle without Docker: hidden inputs, the harness run as a real process
on two versions of a module, and the strict parse and comparison of what it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from rollhub.envs.swe.grading.oracle import (
    HARNESS,
    GoldAnswers,
    compare,
    oracle_target,
    parse_harness_output,
    task_trust,
)
from rollhub.envs.swe.grading.oracle_inputs import call_sites, find_function, hidden_inputs, signature_of

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


def run_harness_locally(
    tmp_path, source: str, inputs: list[str], name: str = "v", timing: str = "5/60", function: str = "suffix"
) -> str:
    root = tmp_path / name
    root.mkdir()
    (root / "lib.py").write_text(source)
    (root / "inputs.json").write_text(json.dumps(inputs))
    (root / "harness.py").write_text(HARNESS)
    argv = [sys.executable, str(root / "harness.py"), str(root / "lib.py"), function, "NONCE", "4000", timing]
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
    assert gold.answers[1][0] == "raise:builtins.ValueError<builtins.Exception<builtins.BaseException"
    noisy = GOLD.replace("    number = abs(int(number))\n", "    print('hi')\n    number = abs(int(number))\n")
    answers = parse_harness_output(run_harness_locally(tmp_path, noisy, inputs, "noisy"), "NONCE", 2)
    assert answers is not None and answers[0][2] == "hi\n"  # printed text is captured, not on stdout
    assert not compare(gold, answers).agreed


#: wrong only on 23, an input the parametrised table shows (`-23` still answers "rd")
BUG_ONLY_VISIBLE = GOLD.replace(
    "def suffix(number: int) -> str:\n", 'def suffix(number: int) -> str:\n    if number == 23:\n        return "th"\n'
)
TABLE_ON_BUG_ONLY_VISIBLE = BUG_ONLY_VISIBLE.replace(
    "def suffix(number: int) -> str:\n",
    'ANSWERS = {1: "st", 3: "rd", 4: "th", 23: "rd", 104: "th", 2: "nd"}\n\n\ndef suffix(number: int) -> str:\n'
    "    if number in ANSWERS:\n        return ANSWERS[number]\n",
)


def oracle_for(tmp_path, bug: str, name: str) -> GoldAnswers:
    """What `gold_answers` builds, with the harness run locally: the inputs, which are visible,
    the gold's answers and where the bug disagrees."""
    from rollhub.envs.swe.grading.oracle import mark_bug
    from rollhub.envs.swe.grading.oracle_inputs import is_visible

    node = find_function(GOLD, "suffix")
    sites = call_sites([TESTS], "suffix", sources=[GOLD])
    chosen = hidden_inputs("demo__demo-1", signature_of(node), sites)
    inputs = [repr(i) for i in chosen]
    (tmp_path / name).mkdir()
    gold = gold_answers(tmp_path / name, inputs)
    gold.visible = [is_visible(*i, sites) for i in chosen]
    bug_answers = parse_harness_output(run_harness_locally(tmp_path / name, bug, inputs, "bug"), "NONCE", len(inputs))
    return mark_bug(gold, bug_answers)


def test_a_bug_only_the_visible_inputs_expose_is_not_trusted(tmp_path):
    """A bug wrong only on inputs the tests show: a table of the visible answers keeps it and
    agrees with the gold on every hidden input, so the task must not count as `oracle`."""
    from rollhub.envs.swe.grading.oracle import effective_trust

    gold = oracle_for(tmp_path, BUG_ONLY_VISIBLE, "only_visible")
    assert sum(gold.bug_disagrees) >= 1  # what the old survey asked: the bug is told from the gold...
    assert gold.exposing_hidden == 0  # ...but only on inputs the tests show
    table = parse_harness_output(
        run_harness_locally(tmp_path, TABLE_ON_BUG_ONLY_VISIBLE, gold.inputs, "table"), "NONCE", len(gold.inputs)
    )
    assert compare(gold, table).agreed  # the forgery the oracle cannot see: hence not trusted
    trust, why = effective_trust(gold)
    assert trust == "visible-tests" and "do not show" in why

    honest = oracle_for(tmp_path, BUG, "hidden")  # `4: "rd"`: wrong on 33, 53, ... too
    assert honest.exposing_hidden >= 1 and effective_trust(honest) == ("oracle", "")


def test_visible_means_a_literal_the_tests_or_doctests_show():
    from rollhub.envs.swe.grading.oracle_inputs import ITERATOR, is_visible

    sites = call_sites([TESTS], "suffix", sources=[GOLD])
    for args in ((23,), (1003,), (23.0,), (True,), ("st",)):  # table, doctest, equal numbers, a literal
        assert is_visible(args, {}, sites), args
    for args in ((33,), (11,), (24,), (1004,)):  # 11 is a literal of the module's code, not of its docs
        assert not is_visible(args, {}, sites), args
    sites = call_sites(["f([3, 1], key='a')"], "f")
    assert is_visible(({ITERATOR: [3, 1]},), {"key": "a"}, sites) and is_visible(((3, 1),), {}, sites)
    assert not is_visible(([1, 3],), {"key": "a"}, sites) and not is_visible(([3, 1],), {"key": "b"}, sites)


def test_most_hidden_inputs_are_not_visible_and_optional_parameters_are_asked():
    from rollhub.envs.swe.grading.oracle_inputs import is_visible

    sites = call_sites([TESTS], "suffix", sources=[GOLD])
    chosen = hidden_inputs("demo__demo-1", signature_of(find_function(GOLD, "suffix")), sites)
    hidden = [i for i in chosen if not is_visible(*i, sites)]
    assert len(chosen) >= 40 and len(hidden) >= 30
    source = "def g(text, sep=None, *, upper=False, width=3):\n    return text\n"
    tests = "def test():\n    assert g('a-b') == 'a-b'\n    assert g('x y', '-') == 'x y'\n"
    chosen = hidden_inputs("demo__demo-3", signature_of(find_function(source, "g")), call_sites([tests], "g"))
    assert any("upper" in kw for _, kw in chosen) and any("width" in kw for _, kw in chosen)
    assert any(kw.get("sep", 0) is None for _, kw in chosen)


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
    from rollhub.envs.swe.grading.oracle_inputs import ITERATOR

    source = "def suffix(seq):\n    return iter(seq) is seq, list(seq)\n"
    inputs = [repr((({ITERATOR: [1, 2]},), {})), repr((([1, 2],), {}))]
    answers = parse_harness_output(run_harness_locally(tmp_path, source, inputs), "NONCE", 2)
    assert answers == [
        ["return:(True, [1, 2])", "(('<iterator>',), {})", ""],
        ["return:(False, [1, 2])", "(([1, 2],), {})", ""],
    ]


def test_where_the_gold_raises_the_candidate_must_raise_the_same_class_or_a_subclass(tmp_path):
    """A fix raising ValueError where the gold raises TypeError is another function; a library
    error deriving from the gold's class still satisfies every `except Gold:`; one class made to
    derive from everything (several bases) does not stand in for the gold's."""
    gold_source = "def f(x):\n    if x == 1:\n        raise TypeError('no')\n    return x\n"
    inputs = ["((1,), {})", "((2,), {})"]

    def answers(source: str, name: str) -> list[list[str]] | None:
        return parse_harness_output(run_harness_locally(tmp_path, source, inputs, name, function="f"), "NONCE", 2)

    gold = GoldAnswers(inputs, answers(gold_source, "gold"), "local")
    assert gold.answers[0][0].startswith("raise:builtins.TypeError<")
    subclass = "class Bad(TypeError):\n    pass\n\n" + gold_source.replace("TypeError('no')", "Bad('no')")
    several = "class Bad(ValueError, TypeError):\n    pass\n\n" + gold_source.replace("TypeError('no')", "Bad('no')")
    for name, source, agrees in (
        ("same", gold_source.replace("'no'", "'other words'"), True),
        ("subclass", subclass, True),
        ("value_error", gold_source.replace("TypeError", "ValueError"), False),
        ("base_class", gold_source.replace("TypeError", "Exception"), False),
        ("several_bases", several, False),
        ("returns", gold_source.replace("raise TypeError('no')", "return None"), False),
    ):
        assert compare(gold, answers(source, name)).agreed is agrees, name
    # the reverse: the gold raises a subclass, the candidate only its base
    gold_sub = GoldAnswers(inputs, answers(subclass, "gold_sub"), "local")
    assert not compare(gold_sub, answers(gold_source, "base")).agreed


def test_equal_values_printed_differently_agree_and_types_stay_strict():
    from rollhub.envs.swe.grading.oracle_compare import same_answer

    def agree(gold: str, candidate: str, args: tuple[str, str] = ("((), {})", "((), {})")) -> bool:
        return same_answer(["return:" + gold, args[0], ""], ["return:" + candidate, args[1], ""])

    assert agree("{9, 1}", "{1, 9}") and agree("frozenset({'b', 'a'})", "frozenset({'a', 'b'})")
    assert agree("{'b': 1, 'a': [2, {3, 4}]}", "{'a': [2, {4, 3}], 'b': 1}")  # a dict is a mapping
    assert agree("-0.0", "0.0") and agree("[(-0.0, 1)]", "[(0.0, 1)]")
    assert agree("Version(major=1, parts={1, 2})", "Version(major=1, parts={2, 1})")
    assert agree("('iterator', [{2, 1}])", "[{1, 2}]")  # a lazy result as the list it yields
    assert agree("None", "None", ("(([3, 1],), {})", "(([3, 1],), {})"))
    for gold, candidate in (
        ("1", "1.0"),
        ("True", "1"),
        ("[1, 2]", "[2, 1]"),  # a list keeps its order
        ("(1, 2)", "[1, 2]"),
        ("{1, 2}", "{1, 2, 3}"),
        ("{'a': 1}", "{'a': 1.0}"),
        ("OrderedDict({'b': 1, 'a': 2})", "OrderedDict({'a': 2, 'b': 1})"),  # its equality keeps order
        ("OrderedDict([('b', 1), ('a', 2)])", "OrderedDict([('a', 2), ('b', 1)])"),
        ("'a b'", "'a  b'"),
        ("<object at 0x1>", "<object at 0x2>"),
    ):
        assert not agree(gold, candidate), (gold, candidate)
    # arguments changed in place are part of the answer, compared by value too
    assert agree("None", "None", ("(({9, 1},), {})", "(({1, 9},), {})"))
    assert not agree("None", "None", ("(([1, 3],), {})", "(([3, 1],), {})"))
    # where the gold raises, a return, a timeout or different printed text disagrees
    raised = ["raise:builtins.KeyError<builtins.LookupError", "", ""]
    assert same_answer(raised, ["raise:builtins.KeyError<builtins.LookupError", "x", ""])
    assert not same_answer(raised, ["timeout", "", ""])
    assert not same_answer(raised, ["raise:builtins.KeyError<builtins.LookupError", "", "printed"])


def test_honest_fixes_with_other_set_and_dict_orders_agree_through_the_harness(tmp_path):
    gold_source = "def f(n):\n    s = {9}\n    s.add(n)\n    return s, {'b': n, 'a': -0.0 * n}\n"
    fix = "def f(n):\n    s = {n}\n    s.add(9)\n    return s, dict(a=0.0, b=n)\n"
    inputs = ["((1,), {})", "((2,), {})", "((17,), {})"]
    gold = GoldAnswers(inputs, answers_of(tmp_path, gold_source, inputs, "gold"), "local")
    fixed = answers_of(tmp_path, fix, inputs, "fix")
    assert [a[0] for a in gold.answers] != [a[0] for a in fixed]  # the texts differ...
    assert compare(gold, fixed).agreed  # ...the values do not
    wrong = answers_of(tmp_path, fix.replace("a=0.0", "a=0"), inputs, "wrong")
    assert not compare(gold, wrong).agreed  # 0 is not 0.0


def answers_of(tmp_path, source: str, inputs: list[str], name: str, timing: str = "5/60") -> list[list[str]]:
    text = run_harness_locally(tmp_path, source, inputs, name, timing=timing, function="f")
    answers = parse_harness_output(text, "NONCE", len(inputs))
    assert answers is not None
    return answers


def test_in_place_change_of_an_argument_is_part_of_the_answer(tmp_path):
    """The decision: a caller sees its list sorted or not, so copying where the gold sorts in
    place (or the reverse) disagrees, even with the same return value."""
    gold_source = "def f(items):\n    items.sort()\n    return items[0]\n"
    copying = "def f(items):\n    return sorted(items)[0]\n"
    inputs = ["(([3, 1, 2],), {})", "(([5, 4],), {})", "(([1],), {})"]
    gold = GoldAnswers(inputs, answers_of(tmp_path, gold_source, inputs, "gold"), "local")
    assert not compare(gold, answers_of(tmp_path, copying, inputs, "copying")).agreed
    in_place_too = "def f(items):\n    items[:] = sorted(items)\n    return min(items)\n"
    assert compare(gold, answers_of(tmp_path, in_place_too, inputs, "in_place")).agreed


def test_a_slow_fix_agrees_and_one_past_the_time_budget_fails_closed_with_a_reason(tmp_path):
    gold_source = "def f(n):\n    return n * 2\n"
    slow = "import time\n\ndef f(n):\n    time.sleep(0.3)\n    return n * 2\n"
    hangs = "def f(n):\n    while n == 2:\n        pass\n    return n * 2\n"
    inputs = ["((1,), {})", "((2,), {})", "((3,), {})"]
    gold = GoldAnswers(inputs, answers_of(tmp_path, gold_source, inputs, "gold"), "local")
    assert compare(gold, answers_of(tmp_path, slow, inputs, "slow", timing="2/60")).agreed
    hung = answers_of(tmp_path, hangs, inputs, "hangs", timing="0.5/60")
    assert [a[0] for a in hung] == ["return:2", "timeout", "return:6"]  # one call late, the rest answered
    verdict = compare(gold, hung)
    assert not verdict.agreed and verdict.timeouts == 1 and "ran out of time" in verdict.reason
    assert verdict.info()["oracle_timeouts"] == 1
    over_budget = answers_of(tmp_path, slow, inputs, "budget", timing="2/0.4")  # 0.3 s a call, 0.4 s in all
    assert [a[0] for a in over_budget] == ["return:2", "return:4", "timeout"]
    assert compare(gold, over_budget).timeouts == 1


def test_a_list_agrees_with_the_generator_it_replaces_and_values_still_must_match():
    """An honest fix may return a list where the original returned a generator (or the reverse);
    the items must still be the original's, and a raise still cannot stand in for a return."""
    from rollhub.envs.swe.grading.oracle import same_answer

    lazy = ["return:('iterator', [1, 2, 3])", "()" + "{}", ""]
    assert same_answer(lazy, ["return:[1, 2, 3]", "(){}", ""])
    assert same_answer(["return:[1, 2, 3]", "(){}", ""], lazy)
    assert not same_answer(lazy, ["return:[1, 2, 4]", "(){}", ""])
    assert not same_answer(lazy, ["raise:ValueError", "(){}", ""])
    assert not same_answer(lazy, ["return:[1, 2, 3]", "([9],){}", ""])  # arguments changed differently


def test_neighbours_of_the_visible_inputs_exposing_the_bug_are_asked_and_never_visible():
    """Where the bug is told apart only on the tests' inputs, the inputs one argument away are
    where a table keeping the bug goes wrong (an uncountable word title-cased, a number negated)."""
    from rollhub.envs.swe.grading.oracle_inputs import is_visible, neighbours

    sites = call_sites([TESTS], "suffix", sources=[GOLD])
    near = neighbours([((23,), {}), ((4,), {})], sites, taken={"((24,), {})"})
    assert near == neighbours([((23,), {}), ((4,), {})], sites, taken={"((24,), {})"})  # deterministic
    assert ((-23,), {}) in near and ((22,), {}) in near and ((-4,), {}) in near
    assert ((24,), {}) not in near and ((1,), {}) not in near  # taken; shown by the tests
    assert near and not any(is_visible(*i, sites) for i in near)
    words = neighbours([(("sheep",), {"strict": True})], call_sites(["f('sheep', strict=True)"], "f"), set())
    assert (("SHEEP",), {"strict": True}) in words and (("sheep",), {"strict": False}) in words


def test_a_gold_answer_whose_repr_raised_is_not_compared():
    """Every value whose repr fails prints the same `repr-raised:` text (any int past 4,300 digits), so
    a wrong huge answer would agree with the gold's: such inputs are dropped, as addresses are."""
    from rollhub.envs.swe.grading.oracle import _usable

    printable = ["42", ""]
    unprintable = ["repr-raised:ValueError", ""]
    assert _usable(printable, list(printable))
    assert not _usable(unprintable, list(unprintable))
