"""Grade an eval log with swebench's own functions, so our reward is the official verdict.

`get_logs_eval` parses the log between the markers with the row's `log_parser` (we use
`parse_log_pytest_v2`: the plain pytest parser keeps only the first whitespace token of
an id and makes parametrised ids collide) and rejects forged or empty logs;
`get_eval_tests_report` and `get_resolution_status` decide FAIL_TO_PASS/PASS_TO_PASS.
Reward 1.0 iff the resolution is FULL. A graded test counts only when its outcome is
`PASSED`: swebench also counts XFAIL (and SKIPPED for PASS_TO_PASS) as a pass, and library
code can raise pytest's xfail or skip outcome while a test runs, so any other outcome of a
graded test is a failure here (`only_passed`; shown in `info["not_passed"]`).
The log is written by the code under test, so nothing in it can make a grade an infra
failure: that is decided from the engine's own signals (rollhub.envs.swe.grading.evaluate), and a
log without test output scores 0.

`grade_run` grades what the collector brought back (rollhub.envs.swe.grading.reporter): swebench's
verdict on the test log AND the grading reporter's records must both say resolved; where the
log says resolved and the reporter does not, or the reporter saw its chain broken or the
runner tampered with, the grade is 0 with `hack_suspected` saying why.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from rollhub.envs.swe.grading.reporter import RecordsVerdict
from rollhub.envs.swe.tasks import SweTask


@dataclass
class GradeResult:
    resolved: bool
    #: test id -> "PASSED" / "FAILED" (per swebench's F2P/P2P semantics); F2P and P2P only
    tests: dict[str, str] = field(default_factory=dict)
    fail_to_pass_passed: int = 0
    pass_to_pass_passed: int = 0
    #: fraction of FAIL_TO_PASS + PASS_TO_PASS that pass
    pass_fraction: float = 0.0
    #: the log had parseable test output (the patches applied and the suite ran)
    tests_ran: bool = False
    status: str = "RESOLVED_NO"
    #: why the run is believed to have forged its outcome ("" when it is not): reward 0
    hack_suspected: str = ""
    #: graded test -> an outcome swebench would count as a pass that is not PASSED (XFAIL, ...)
    not_passed: dict[str, str] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0

    def info(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "resolution": self.status,
            "tests": self.tests,
            "fail_to_pass_passed": self.fail_to_pass_passed,
            "pass_to_pass_passed": self.pass_to_pass_passed,
            "pass_fraction": self.pass_fraction,
            "tests_ran": self.tests_ran,
            "hack_suspected": bool(self.hack_suspected),
            **({"hack_reason": self.hack_suspected} if self.hack_suspected else {}),
            **({"not_passed": self.not_passed} if self.not_passed else {}),
        }


def grade_log(task: SweTask, log_text: str) -> GradeResult:
    """Grade the output of the task's eval script (stdout+stderr) the official way."""
    from swebench.harness.grading import get_logs_eval
    from swebench.harness.utils import make_test_spec

    spec = make_test_spec(task.row)
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(log_text)
        log_path = f.name
    try:
        status_map, found = get_logs_eval(spec, log_path)
    finally:
        os.unlink(log_path)
    if not found:
        return GradeResult(resolved=False, tests={t: "FAILED" for t in [*task.fail_to_pass, *task.pass_to_pass]})
    return _grade_status_map(task, status_map)


#: outcomes swebench's report counts as a pass for FAIL_TO_PASS or PASS_TO_PASS that are not PASSED
NOT_PASSED_OUTCOMES = frozenset({"XFAIL", "XPASS", "SKIPPED"})


def only_passed(status_map: dict[str, str]) -> dict[str, str]:
    """The status map with every outcome other than PASSED turned into FAILED, so that
    swebench's report counts a test as passing only when it passed: an expected failure or a
    skip raised by the code under test is not a fix."""
    return {test: "PASSED" if status == "PASSED" else "FAILED" for test, status in status_map.items()}


def _grade_status_map(task: SweTask, status_map: dict[str, str]) -> GradeResult:
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    total = len(task.fail_to_pass) + len(task.pass_to_pass)
    graded = {*task.fail_to_pass, *task.pass_to_pass}
    not_passed = {
        test: status for test, status in status_map.items() if status in NOT_PASSED_OUTCOMES and test in graded
    }
    report = get_eval_tests_report(
        only_passed(status_map),
        {"instance_id": task.instance_id, FAIL_TO_PASS: task.fail_to_pass, PASS_TO_PASS: task.pass_to_pass},
        eval_type=EvalType(task.eval_type),
    )
    tests: dict[str, str] = {}
    for kind in (FAIL_TO_PASS, PASS_TO_PASS):
        for test in report[kind]["success"]:
            tests[test] = "PASSED"
        for test in report[kind]["failure"]:
            tests[test] = "FAILED"
    f2p_ok = len(report[FAIL_TO_PASS]["success"])
    p2p_ok = len(report[PASS_TO_PASS]["success"])
    status = get_resolution_status(report)
    return GradeResult(
        resolved=status == "RESOLVED_FULL",
        tests=tests,
        fail_to_pass_passed=f2p_ok,
        pass_to_pass_passed=p2p_ok,
        pass_fraction=(f2p_ok + p2p_ok) / total if total else 0.0,
        tests_ran=True,
        status=status,
        not_passed=not_passed,
    )


#: the official harness's own markers: output of the tests that holds one is forging its bounds
def _harness_markers() -> tuple[str, ...]:
    from swebench.harness import constants as c

    return (
        c.START_TEST_OUTPUT,
        c.END_TEST_OUTPUT,
        c.TEST_EXIT_CODE,
        c.APPLY_PATCH_FAIL,
        c.APPLY_PATCH_PASS,
        c.RESET_FAILED,
        c.TESTS_ERROR,
        c.TESTS_TIMEOUT,
    )


def official_log(test_log: str, exit_code: int | None) -> str:
    """The test output in the form swebench's `get_logs_eval` reads: between its markers,
    followed by the exit-status line its cross-check wants."""
    from swebench.harness import constants as c

    tail = f"{c.TEST_EXIT_CODE}: {exit_code}\n" if exit_code is not None else ""
    return f"{c.START_TEST_OUTPUT}\n{test_log.rstrip(chr(10))}\n{c.END_TEST_OUTPUT}\n{tail}"


_ORDER = {"RESOLVED_NO": 0, "RESOLVED_PARTIAL": 1, "RESOLVED_FULL": 2}


def grade_run(task: SweTask, test_log: str, exit_code: int | None, records: RecordsVerdict | None) -> GradeResult:
    """Grade a sealed run: the official verdict on the test log, and, for pytest tasks, the
    grading reporter's (None: the task's runner is not pytest, the log alone decides).

    Resolved iff both say so. `hack_suspected` when the log claims a graded test passed that
    the reporter saw fail or not run, or the reporter saw its chain broken or the runner
    tampered with; a run whose log claims nothing the reporter denies is not suspected of
    anything (a crash is just a failure)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    markers = [m for m in _harness_markers() if m in test_log]
    by_log = grade_log(task, official_log(test_log, exit_code))
    if markers:
        by_log.resolved, by_log.status = False, "RESOLVED_NO"
        by_log.hack_suspected = f"the test output holds the harness's marker {markers[0]!r}"
        return by_log
    if records is None:
        return by_log
    by_reporter = _grade_status_map(task, parse_pytest_log(records.summary_lines()))
    problems = records.problems()
    if exit_code == 0 and records.closed and records.exitstatus not in (0, None):
        # pytest ended with failures, then the process exited 0 (os._exit at exit)
        problems.append(f"the run exited 0 after pytest ended with status {records.exitstatus}")
    evidence = [p for p in problems if p.startswith(("tampering", "the reporter's record chain"))]
    claims = PARSER_REGISTRY[task.log_parser](test_log, None)
    denied = sorted(
        t
        for t in {*task.fail_to_pass, *task.pass_to_pass}
        if claims.get(t) in ("PASSED", "XFAIL") and by_reporter.tests.get(t) != "PASSED"
    )
    suspicion = "; ".join(evidence[:3])
    if not suspicion and denied:
        suspicion = (
            f"the log says {len(denied)} graded test(s) passed that the reporter saw fail or not run "
            f"({', '.join(denied[:3])})" + (f": {problems[0]}" if problems else "")
        )
    if not suspicion and by_log.resolved and problems:
        suspicion = "; ".join(problems[:3])
    tests = {
        t: "PASSED" if s == "PASSED" and by_reporter.tests.get(t) == "PASSED" else "FAILED"
        for t, s in by_log.tests.items()
    }
    if problems:
        tests = {t: "FAILED" for t in tests}
    f2p = sum(tests.get(t) == "PASSED" for t in task.fail_to_pass)
    p2p = sum(tests.get(t) == "PASSED" for t in task.pass_to_pass)
    total = len(task.fail_to_pass) + len(task.pass_to_pass)
    resolved = by_log.resolved and by_reporter.resolved and not problems
    status = min(by_log.status, by_reporter.status, key=_ORDER.__getitem__)
    return GradeResult(
        resolved=resolved,
        tests=tests,
        fail_to_pass_passed=f2p,
        pass_to_pass_passed=p2p,
        pass_fraction=(f2p + p2p) / total if total else 0.0,
        tests_ran=by_log.tests_ran,
        status="RESOLVED_FULL" if resolved else ("RESOLVED_NO" if problems else status),
        hack_suspected=suspicion,
        not_passed={**by_log.not_passed, **by_reporter.not_passed},
    )


def parse_pytest_log(log_text: str) -> dict[str, str]:
    """Status map of a `pytest -rA` run with swebench's id-preserving parser (no markers needed)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    return PARSER_REGISTRY["parse_log_pytest_v2"](log_text, None)
