"""Factory pieces that need no docker: AST mutation, problem statements, diff filtering."""

import ast
import difflib

import pytest

from rollhub.envs.swe.factory.mutation import FAMILIES, find_mutations

SOURCE = '''\
def clamp(value, low, high):  # keep the comment
    """Clamp é into [low, high]."""
    if value < low:
        return low
    result = value * 2 + 1
    if value > high and low >= 0:
        result = high
    else:
        result = value
    total = 0
    total += result
    flag = True
    return total if flag else None


def tiny(x):
    return x
'''


def changed_lines(before, after):
    return [
        row
        for row in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if row[:1] in "+-" and row[:3] not in ("+++", "---")
    ]


def test_every_family_finds_one_site_that_parses_and_keeps_the_rest():
    mutations = find_mutations("m.py", SOURCE)
    families = [m.family for m in mutations]
    assert sorted(families) == sorted(FAMILIES)  # one site per family in clamp, none in the 2-line tiny()
    assert all(m.function == "clamp" for m in mutations)
    for m in mutations:
        ast.parse(m.new_source)
        assert "# keep the comment" in m.new_source and "é" in m.new_source
        assert ast.dump(ast.parse(m.new_source)) != ast.dump(ast.parse(SOURCE))
        assert len(changed_lines(SOURCE, m.new_source)) <= 9


def test_operator_flips_are_exact():
    by_family = {m.family: m for m in find_mutations("m.py", SOURCE)}
    op = changed_lines(SOURCE, by_family["op_flip"].new_source)
    assert op in (
        ["-    result = value * 2 + 1", "+    result = value // 2 + 1"],
        ["-    result = value * 2 + 1", "+    result = value * 2 - 1"],
    )
    cmp_lines = changed_lines(SOURCE, by_family["cmp_flip"].new_source)
    assert cmp_lines in (
        ["-    if value < low:", "+    if value >= low:"],
        ["-    if value > high and low >= 0:", "+    if value <= high and low >= 0:"],
        ["-    if value > high and low >= 0:", "+    if value > high and low < 0:"],
    )
    swapped = by_family["swap_if_else"].new_source
    assert swapped.index("result = value\n    else:") < swapped.index("result = high")


def test_mutations_are_deterministic_and_skip_broken_files():
    assert [m.new_source for m in find_mutations("m.py", SOURCE)] == [
        m.new_source for m in find_mutations("m.py", SOURCE)
    ]
    assert find_mutations("bad.py", "def f(:\n") == []
    assert find_mutations("m.py", SOURCE, families=("bool_flip",))[0].family == "bool_flip"


def test_problem_statement_uses_tests_not_the_diff():
    from rollhub.envs.swe.factory.build import failure_messages, problem_statement

    log = "PASSED t.py::test_ok\nFAILED t.py::test_a[x y] - AssertionError: assert 3 == 4\nFAILED t.py::test_b\n"
    messages = failure_messages(log, ["t.py::test_a[x y]", "t.py::test_b"])
    assert messages == {"t.py::test_a[x y]": "AssertionError: assert 3 == 4", "t.py::test_b": ""}
    text = problem_statement(
        "demo", ["t.py::test_a[x y]", "t.py::test_b"] + [f"t.py::test_{i}" for i in range(10)], messages
    )
    assert "t.py::test_a[x y]" in text and "assert 3 == 4" in text and "and 7 more" in text
    assert "diff" not in text and "+" not in text


def test_drop_test_files_keeps_only_source_sections():
    from rollhub.envs.swe.grading.evaluate import drop_test_files

    patch = (
        "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/tests/test_core.py b/tests/test_core.py\n"
        "--- a/tests/test_core.py\n+++ b/tests/test_core.py\n@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/test_x.py b/test_x.py\nnew file mode 100644\n"
    )
    kept = drop_test_files(patch)
    assert "pkg/core.py" in kept and "tests/" not in kept and "test_x.py" not in kept
    assert drop_test_files(patch, {"pkg/core.py"}) == ""


def test_requirement_parsing_and_instance_image_names():
    from rollhub.core.errors import UserError
    from rollhub.envs.swe.factory.images import instance_image_name
    from rollhub.envs.swe.factory.package_repo import parse_requirement

    assert parse_requirement("inflection==0.5.1") == ("inflection", "0.5.1")
    with pytest.raises(UserError, match="PACKAGE==VERSION"):
        parse_requirement("inflection>=0.5")
    assert instance_image_name("a_b__a_b-1.0-abc") == "rollhub/sweb.eval.x86_64.a_b_1776_a_b-1.0-abc:latest"


def test_swe_cli_registers_and_rejects_bad_requirement(capsys):
    from rollhub.cli import main

    assert main(["swe", "make-tasks", "not-a-pin"]) == 2
    assert "PACKAGE==VERSION" in capsys.readouterr().err
