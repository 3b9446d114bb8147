"""Grade an eval log with swebench's own functions, so our reward is the official verdict.

`get_logs_eval` parses the log between the markers with the row's `log_parser` (we use
`parse_log_pytest_v2`: the plain pytest parser keeps only the first whitespace token of
an id and makes parametrised ids collide) and rejects forged or empty logs;
`get_eval_tests_report` and `get_resolution_status` decide FAIL_TO_PASS/PASS_TO_PASS.
Reward 1.0 iff the resolution is FULL. The log is written by the code under test (and shows
the agent's own text), so nothing in it can make a grade an infra failure: that is decided
from the engine's own signals (rollhub.envs.swe.evaluate), and a log without test output
scores 0.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

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
        }


def grade_log(task: SweTask, log_text: str) -> GradeResult:
    """Grade the output of the task's eval script (stdout+stderr) the official way."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType
    from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status
    from swebench.harness.utils import make_test_spec

    spec = make_test_spec(task.row)
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(log_text)
        log_path = f.name
    try:
        status_map, found = get_logs_eval(spec, log_path)
    finally:
        os.unlink(log_path)
    total = len(task.fail_to_pass) + len(task.pass_to_pass)
    if not found:
        return GradeResult(resolved=False, tests={t: "FAILED" for t in [*task.fail_to_pass, *task.pass_to_pass]})
    report = get_eval_tests_report(
        status_map,
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
    )


def parse_pytest_log(log_text: str) -> dict[str, str]:
    """Status map of a `pytest -rA` run with swebench's id-preserving parser (no markers needed)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    return PARSER_REGISTRY["parse_log_pytest_v2"](log_text, None)
