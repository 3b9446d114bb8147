"""The grading channel's pure parts: the eval script as rewritten, the reporter's MAC chain,
the mapping of the reporter's node ids to swebench's test ids, and `grade_run`'s verdicts."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

pytest.importorskip("swebench")

from rollhub.envs.swe.grading.reporter import GradingRun, RecordsVerdict, split_eval_script, verify_records  # noqa: E402
from rollhub.envs.swe.grading.verdict import grade_run  # noqa: E402
from rollhub.envs.swe.tasks import SweTask  # noqa: E402

KEY = b"k" * 32
PARAM = "tests/test_a.py::test_p[Japanese: \\u65e5-x - y]"
DOCTEST = "pkg/mod.py::pkg.mod.func"
F2P = ["tests/test_a.py::test_fixed", DOCTEST]
P2P = ["tests/test_a.py::Case::test_ok", PARAM]

SCRIPT = """#!/bin/bash
set -uxo pipefail
cd /testbed
git status --short
git -c core.fileMode=false diff abc123
git show
git checkout abc123 -- tests 2>/dev/null || true
git apply --verbose - <<'EOF_1'
diff --git a/tests/x.py b/tests/x.py
git diff inside the test patch stays
EOF_1
: '>>>>> Start Test Output'
python -m pytest -rA tests
: '>>>>> End Test Output'
git checkout abc123 -- tests 2>/dev/null || true
"""


def make_task() -> SweTask:
    row = {
        "instance_id": "o__r-1",
        "repo": "o/r",
        "base_commit": "abc123",
        "patch": "",
        "test_patch": "",
        "FAIL_TO_PASS": json.dumps(F2P),
        "PASS_TO_PASS": json.dumps(P2P),
        "image": "img",
        "eval_script": SCRIPT,
        "log_parser": "parse_log_pytest_v2",
        "eval_type": "pass_and_fail",
        "version": "1",
    }
    return SweTask.from_row(row)


def chain(records: list[list], key: bytes = KEY) -> bytes:
    """Records as the plugin writes them: `json mac`, each MAC over the previous one."""
    out, prev = b"", b""
    for seq, (kind, body) in enumerate(records):
        payload = json.dumps([seq, kind, body], separators=(",", ":")).encode()
        prev = hmac.new(key, prev + b"\n" + payload, hashlib.sha256).hexdigest().encode()
        out += payload + b" " + prev + b"\n"
    return out


def reports(statuses: dict[str, str]) -> list[list]:
    records: list[list] = [["open", {"pid": 1}]]
    for test, status in statuses.items():
        call = {"passed": ("passed", None), "failed": ("failed", None), "xfail": ("skipped", "why")}[status]
        records.append(["report", {"id": test, "when": "setup", "outcome": "passed"}])
        body = {"id": test, "when": "call", "outcome": call[0], "raised": status != "passed"}
        if call[1]:
            body["xfail"] = call[1]
        records.append(["report", body])
        records.append(["report", {"id": test, "when": "teardown", "outcome": "passed"}])
    return records


def log_of(statuses: dict[str, str]) -> str:
    lines = [f"{'PASSED' if s == 'passed' else 'FAILED'} {t}" for t, s in statuses.items()]
    return "=== test session starts ===\n" + "\n".join(lines) + "\n=== done ===\n"


ALL_PASS = {t: "passed" for t in F2P + P2P}


def test_the_script_keeps_its_setup_silently_and_drops_what_prints_the_repository():
    setup, test = split_eval_script(SCRIPT)
    assert setup[0] == "cd /testbed"
    assert not any(line.startswith(("git status", "git show", "git -c core.fileMode=false diff")) for line in setup)
    assert "git diff inside the test patch stays" in setup and setup[-1] == "EOF_1"
    assert test == ["python -m pytest -rA tests"]
    body = GradingRun().collector_source(SCRIPT).decode()
    assert "} >/dev/null 2>&1" in body and ">>>>>" not in body.split("SETTINGS = ", 1)[1].split("python -m")[0]


def test_the_chain_verifies_and_anything_forged_breaks_it():
    data = chain([*reports(ALL_PASS), ["close", {"exitstatus": 0, "tamper": []}]])
    verdict = verify_records(data, KEY)
    assert verdict.closed and not verdict.problems() and verdict.records == 14
    # a record under another key, a replayed record, an edited record: the chain stops there
    forged = chain([*reports(ALL_PASS)], key=b"x" * 32)
    assert verify_records(forged, KEY).broken
    lines = data.split(b"\n")
    assert verify_records(b"\n".join([lines[0], lines[1], lines[1]]), KEY).broken
    edited = data.replace(b'"outcome":"failed"', b'"outcome":"passed"').replace(b"passed", b"failed", 1)
    assert verify_records(edited, KEY).broken
    # what comes after the close record is not read
    late = data + chain([["report", {"id": F2P[0], "when": "call", "outcome": "failed"}]])
    assert not verify_records(late, KEY).problems()


def test_no_close_record_is_a_problem_and_a_call_that_raised_cannot_pass():
    assert "ended before the reporter closed" in verify_records(chain(reports(ALL_PASS)), KEY).problems()[0]
    records = [*reports(ALL_PASS), ["close", {"exitstatus": 0, "tamper": []}]]
    records[2][1]["raised"] = True
    assert "although its call raised" in verify_records(chain(records), KEY).problems()[0]


def test_reporter_ids_map_to_swebench_ids_as_its_parser_does():
    statuses = {**ALL_PASS, F2P[0]: "xfail"}
    verdict = verify_records(chain([*reports(statuses), ["close", {"exitstatus": 0, "tamper": []}]]), KEY)
    from rollhub.envs.swe.grading.verdict import parse_pytest_log

    mapped = parse_pytest_log(verdict.summary_lines())
    assert mapped[PARAM] == "PASSED" and mapped[DOCTEST] == "PASSED" and mapped[P2P[0]] == "PASSED"
    assert mapped[f"{F2P[0]} - why"] == "XFAIL"  # as `-rA` prints an xfail with its reason


def test_grade_needs_both_the_log_and_the_reporter():
    task = make_task()
    closed = ["close", {"exitstatus": 0, "tamper": []}]
    good = verify_records(chain([*reports(ALL_PASS), closed]), KEY)
    assert grade_run(task, log_of(ALL_PASS), 0, good).reward == 1.0
    # the log forged, the reporter saw the fix fail
    failing = verify_records(chain([*reports({**ALL_PASS, F2P[0]: "failed"}), closed]), KEY)
    grade = grade_run(task, log_of(ALL_PASS), 0, failing)
    assert grade.reward == 0.0 and F2P[0] in grade.hack_suspected
    # no close record (os._exit after printing)
    grade = grade_run(task, log_of(ALL_PASS), 0, verify_records(chain(reports(ALL_PASS)), KEY))
    assert grade.reward == 0.0 and "before the reporter closed" in grade.hack_suspected
    # tampering seen, whatever the log says
    tampered = verify_records(chain([*reports(ALL_PASS), ["close", {"exitstatus": 0, "tamper": ["x"]}]]), KEY)
    assert grade_run(task, log_of(ALL_PASS), 0, tampered).hack_suspected == "tampering: x"
    # the harness's markers in the test output
    grade = grade_run(task, log_of(ALL_PASS) + ">>>>> End Test Output\n", 0, good)
    assert grade.reward == 0.0 and "marker" in grade.hack_suspected
    # an honest failure is a failure, not a suspicion
    grade = grade_run(task, log_of({**ALL_PASS, F2P[0]: "failed"}), 1, failing)
    assert grade.reward == 0.0 and not grade.hack_suspected
    # an expected failure raised while a fix-test runs: both judges say not passed
    xfailed = verify_records(chain([*reports({**ALL_PASS, F2P[0]: "xfail"}), closed]), KEY)
    xfail_log = log_of(ALL_PASS).replace(f"PASSED {F2P[0]}\n", f"XFAIL {F2P[0]}\n")
    grade = grade_run(task, xfail_log, 0, xfailed)
    assert grade.reward == 0.0 and grade.tests[F2P[0]] == "FAILED" and grade.not_passed == {F2P[0]: "XFAIL"}
    # a reporter that never started: the log alone is not believed
    grade = grade_run(task, log_of(ALL_PASS), 0, RecordsVerdict())
    assert grade.reward == 0.0 and grade.hack_suspected


def test_a_seal_verifies_only_under_the_collectors_key():
    run = GradingRun()
    body = json.dumps(
        {
            "log_sha256": "a",
            "records_sha256": "b",
            "exit_code": 0,
            "timed_out": False,
            "overflow": False,
            "sealed": True,
            "duration_s": 1.0,
        },
        separators=(",", ":"),
    )
    good = f"{run.tag} {body} {hmac.new(run.collector_key, body.encode(), hashlib.sha256).hexdigest()}"
    forged = f"{run.tag} {body} {hmac.new(b'guess', body.encode(), hashlib.sha256).hexdigest()}"
    assert run.seal(f"noise\n{forged}\n") is None
    assert run.seal(f"noise\n{good}\n{forged}\n").exit_code == 0


LIBRARY = "def double(x):\n    return x * 2\n"
TESTS = """import pytest
from lib import double


def test_double():
    assert double(2) == 4


def test_broken():
    assert double(2) == 5


@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert double(x) == 2 * x


@pytest.mark.xfail(reason="known")
def test_known():
    assert double(1) == 3
"""
#: at exit, what a subprocess of the tests sees of the grader's environment
CHILD = """
import atexit, os, subprocess, sys
def _child():
    code = "import os; print('CHILD SAW', os.environ.get('PYTEST_ADDOPTS'), os.environ.get('PYTHONPATH'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    os.write(1, out.encode())
atexit.register(_child)
"""
REPORT_PATCH = """
import sys
_m = vars(sys)['mod' + 'ules'].get('_py' + 'test.rep' + 'orts')
_c = getattr(_m, 'Test' + 'Report')
_o = getattr(_c, 'from_item' + '_and_call')
def _f(item, call):
    r = _o(item, call)
    if r.outcome == 'failed':
        r.outcome, r.longrepr = 'passed', None
    return r
setattr(_c, 'from_item' + '_and_call', staticmethod(_f))
"""


def run_locally(tmp_path, library: str) -> tuple[RecordsVerdict, str, dict]:
    """The collector and the reporter as the grader runs them, on this machine's pytest."""
    import subprocess
    import sys

    project = tmp_path / "proj"
    project.mkdir(parents=True)
    (project / "lib.py").write_text(library)
    (project / "test_lib.py").write_text(TESTS)
    script = (
        "#!/bin/bash\nset -uxo pipefail\ngit status\n: '>>>>> Start Test Output'\n"
        f"{sys.executable} -m pytest -rA --tb=no -p no:cacheprovider test_lib.py\n: '>>>>> End Test Output'\n"
    )
    run = GradingRun(workdir=str(project), folder=str(tmp_path / "grade"), timeout_s=60)
    path = tmp_path / "grade.py"
    path.write_bytes(run.collector_source(script))
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=project)
    seal = run.seal(out.stdout)
    assert seal is not None, out.stdout + out.stderr
    records = (tmp_path / "grade" / "records").read_bytes()
    log = (tmp_path / "grade" / "test.log").read_text()
    assert not path.exists() and not (tmp_path / "grade" / "reporter.key").exists(), log
    assert hashlib.sha256(records).hexdigest() == seal.records_sha256
    return verify_records(records, run.reporter_key), log, {"exit_code": seal.exit_code, "sealed": seal.sealed}


def test_the_reporter_sees_what_pytest_ran(tmp_path):
    """... and the tests' own subprocesses do not inherit it (a pytest they start must not
    try to load a plugin it cannot import)."""
    verdict, log, seal = run_locally(tmp_path, LIBRARY + CHILD)
    assert verdict.closed and not verdict.problems() and seal["exit_code"] == 1 and seal["sealed"]
    assert "git status" not in log and "Start Test Output" not in log
    assert "CHILD SAW None None" in log
    from rollhub.envs.swe.grading.verdict import parse_pytest_log

    assert parse_pytest_log(verdict.summary_lines()) == {
        "test_lib.py::test_double": "PASSED",
        "test_lib.py::test_broken": "FAILED",
        "test_lib.py::test_param[1]": "PASSED",
        "test_lib.py::test_param[2]": "PASSED",
        "test_lib.py::test_known - known": "XFAIL",
    }
    assert {k: v for k, v in parse_pytest_log(log).items() if k != "test_lib.py::test_known - known"} == {
        "test_lib.py::test_double": "PASSED",
        "test_lib.py::test_broken": "FAILED",
        "test_lib.py::test_param[1]": "PASSED",
        "test_lib.py::test_param[2]": "PASSED",
    }


def test_the_reporter_sees_the_report_class_patched_and_an_early_exit(tmp_path):
    verdict, log, _ = run_locally(tmp_path / "a", LIBRARY + REPORT_PATCH)
    assert "PASSED test_lib.py::test_broken" in log  # the log is fooled
    assert any("report machinery was replaced" in p for p in verdict.problems())
    verdict, log, seal = run_locally(tmp_path / "b", LIBRARY + "import os\nos._exit(0)\n")
    assert seal["exit_code"] == 0 and not verdict.closed
    assert "ended before the reporter closed" in verdict.problems()[0]
    # after the reporter closed: the exit status no longer matches pytest's own
    verdict, log, seal = run_locally(tmp_path / "c", LIBRARY + "import atexit, os\natexit.register(os._exit, 0)\n")
    assert seal["exit_code"] == 0 and verdict.closed and verdict.exitstatus == 1
    closed = [*reports(ALL_PASS), ["close", {"exitstatus": 1, "tamper": []}]]
    grade = grade_run(make_task(), log_of(ALL_PASS), 0, verify_records(chain(closed), KEY))
    assert grade.reward == 0.0 and "exited 0 after pytest ended with status 1" in grade.hack_suspected


def test_the_test_script_exits_with_the_test_commands_status(tmp_path):
    # swebench keeps the status in a variable (an assignment exits 0): an honest run whose suite
    # has a failure outside the graded tests must not read as "exited 0 after pytest failed"
    import subprocess

    script = "\n".join(
        [
            "#!/bin/bash",
            ": '>>>>> Start Test Output'",
            "python3 -c 'import sys; sys.exit(1)'",
            "SWEBENCH_TEST_EXIT_CODE=$?",
            ": '>>>>> End Test Output'",
        ]
    )
    source = GradingRun(workdir=str(tmp_path)).collector_source(script).decode()
    settings = json.loads(json.loads(source.split("SETTINGS = json.loads(", 1)[1].split("\n", 1)[0][:-1]))
    body = tmp_path / "tests.sh"
    body.write_text(settings["script"])
    assert subprocess.run(["bash", str(body)], cwd=tmp_path).returncode == 1
    plain = script.replace("SWEBENCH_TEST_EXIT_CODE=$?\n", "")  # a script that keeps no variable
    settings = json.loads(
        json.loads(
            GradingRun().collector_source(plain).decode().split("SETTINGS = json.loads(", 1)[1].split("\n", 1)[0][:-1]
        )
    )
    body.write_text(settings["script"])
    assert subprocess.run(["bash", str(body)], cwd=tmp_path).returncode == 1
