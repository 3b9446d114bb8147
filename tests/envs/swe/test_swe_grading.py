"""Grading with swebench's own functions on synthetic logs (no docker needed)."""

import json

import pytest

pytest.importorskip("swebench")

from rollhub.core.errors import UserError  # noqa: E402
from rollhub.envs.swe.grading.verdict import grade_log, parse_pytest_log  # noqa: E402
from rollhub.envs.swe.tasks import LegacyMapping, SweTask, files_in_patch, is_test_path, pytest_eval_script  # noqa: E402

F2P = ["tests/test_a.py::test_fix[a b]", "tests/test_a.py::test_other"]
P2P = ["tests/test_a.py::test_keep[a b]", "tests/test_a.py::test_keep[a c]"]


def make_task(**overrides):
    row = {
        "instance_id": "demo__demo-1",
        "repo": "demo/demo",
        "base_commit": "abc",
        "patch": "",
        "test_patch": "",
        "problem_statement": "x",
        "FAIL_TO_PASS": json.dumps(F2P),
        "PASS_TO_PASS": json.dumps(P2P),
        "version": "1",
        "image": "rollhub/sweb.eval.x86_64.demo_1776_demo-1:latest",
        "eval_script": pytest_eval_script("abc", ["tests/test_a.py"], "", "pytest -rA"),
        "log_parser": "parse_log_pytest_v2",
        "eval_type": "pass_and_fail",
    }
    row.update(overrides)
    return SweTask.from_row(row)


def log(statuses, exit_code=None):
    body = "\n".join(f"{status} {test}" for test, status in statuses.items())
    if exit_code is None:
        exit_code = 1 if any(s in ("FAILED", "ERROR") for s in statuses.values()) else 0
    return (
        f"+ git diff\n+ : '>>>>> Start Test Output'\n===== short test summary info =====\n{body}\n"
        f"+ : '>>>>> End Test Output'\n>>>>> Test Exit Code: {exit_code}\n"
    )


def test_all_pass_is_resolved_and_keeps_ids_with_spaces():
    result = grade_log(make_task(), log({t: "PASSED" for t in F2P + P2P}))
    assert result.resolved and result.reward == 1.0
    assert result.pass_fraction == 1.0
    assert set(result.tests) == set(F2P + P2P)


def test_one_fail_to_pass_still_failing_scores_zero_with_partial_fraction():
    statuses = {t: "PASSED" for t in F2P + P2P}
    statuses[F2P[0]] = "FAILED"
    result = grade_log(make_task(), log(statuses))
    assert not result.resolved and result.reward == 0.0
    assert result.status == "RESOLVED_PARTIAL"
    assert result.tests[F2P[0]] == "FAILED"
    assert result.pass_fraction == pytest.approx(3 / 4)
    assert not hasattr(result, "infra_failure")  # a grade is a verdict on the patch, never an infra failure


def test_broken_pass_to_pass_scores_zero():
    statuses = {t: "PASSED" for t in F2P + P2P}
    statuses[P2P[1]] = "FAILED"
    assert grade_log(make_task(), log(statuses)).reward == 0.0


def test_missing_test_counts_as_failed_and_skipped_f2p_fails():
    statuses = {t: "PASSED" for t in F2P + P2P}
    del statuses[P2P[0]]
    assert grade_log(make_task(), log(statuses)).reward == 0.0
    statuses = {t: "PASSED" for t in F2P + P2P}
    statuses[F2P[1]] = "SKIPPED"
    assert grade_log(make_task(), log(statuses)).reward == 0.0


@pytest.mark.parametrize("outcome", ["XFAIL", "XPASS", "SKIPPED"])
@pytest.mark.parametrize("graded", [F2P[0], P2P[1]])
def test_a_graded_test_counts_only_when_it_passed(outcome, graded):
    """swebench's report counts XFAIL as a pass (and SKIPPED for PASS_TO_PASS); library code can
    raise pytest's xfail or skip outcome while a test runs, so only PASSED counts here."""
    statuses = {t: "PASSED" for t in F2P + P2P}
    statuses[graded] = outcome
    result = grade_log(make_task(), log(statuses))
    assert not result.resolved and result.reward == 0.0
    assert result.tests[graded] == "FAILED"
    # swebench's parser reads no XPASS line at all: the test is missing, which is a failure
    shown = {} if outcome == "XPASS" else {graded: outcome}
    assert result.not_passed == shown and result.info().get("not_passed", {}) == shown


def test_forged_all_passed_log_with_nonzero_exit_is_rejected():
    result = grade_log(make_task(), log({t: "PASSED" for t in F2P + P2P}, exit_code=1))
    assert not result.resolved and not result.tests_ran


def test_log_without_markers_is_not_resolved():
    result = grade_log(make_task(), "PASSED " + F2P[0])
    assert not result.resolved and not result.tests_ran


@pytest.mark.parametrize(
    "text",
    [
        "Error response from daemon: container is not running\n",
        "# Error response from daemon: No such container: abc\nCannot connect to the Docker daemon\n",
        "OCI runtime exec failed: exec failed: unable to start container process\n",
    ],
)
def test_engine_error_text_in_the_log_scores_zero_and_is_never_infra(text):
    """The code under test writes the log (and the agent's diff may be printed into it): text
    reading like an engine error must not turn a 0 into an unscored, re-rolled failure."""
    result = grade_log(make_task(), text)
    assert not result.resolved and result.reward == 0.0 and not result.tests_ran
    assert not hasattr(result, "infra_failure")


def test_v2_parser_keeps_whole_parametrised_ids():
    text = "PASSED t.py::test_x[a b]\nPASSED t.py::test_x[a c]\nFAILED t.py::test_y - AssertionError: boom\n"
    assert parse_pytest_log(text) == {
        "t.py::test_x[a b]": "PASSED",
        "t.py::test_x[a c]": "PASSED",
        "t.py::test_y": "FAILED",
    }


def test_legacy_row_maps_to_official_image_and_pytest_script():
    row = make_task().row
    legacy = {k: v for k, v in row.items() if k not in ("image", "eval_script", "log_parser", "eval_type")}
    legacy["test_patch"] = (
        "diff --git a/tests/test_a.py b/tests/test_a.py\n"
        "--- a/tests/test_a.py\n+++ b/tests/test_a.py\n@@ -1 +1 @@\n-x\n+y\n"
    )
    with pytest.raises(UserError, match="4.x"):
        SweTask.from_row(legacy)
    task = SweTask.from_row(legacy, LegacyMapping())
    assert task.image == "swebench/sweb.eval.x86_64.demo_1776_demo-1:latest"
    assert "tests/test_a.py" in task.eval_script and "ROLLHUB_TEST_PATCH" in task.eval_script
    gym = SweTask.from_row(legacy, LegacyMapping(namespace="xingyaoww", separator="_s_"))
    assert gym.image == "xingyaoww/sweb.eval.x86_64.demo_s_demo-1:latest"


def test_test_paths_and_patch_files():
    assert is_test_path("tests/test_a.py") and is_test_path("test_inflection.py") and is_test_path("pkg/conftest.py")
    assert not is_test_path("src/parse.py") and not is_test_path("contest.py")
    patch = "diff --git a/x.py b/x.py\n+1\ndiff --git a/tests/t.py b/tests/t.py\n+2\n"
    assert files_in_patch(patch) == ["x.py", "tests/t.py"]
