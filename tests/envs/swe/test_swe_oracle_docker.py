"""The differential oracle and "pass means PASSED" on a real task container.

The task: inflection's `ordinal` with `3: "rd"` mutated into `4: "rd"`; its tests assert
`number + ordinal(number)` over a table of numbers. A patch that answers exactly the table's
numbers and keeps the bug passes every visible test; the oracle asks other numbers.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json

import pytest

pytest.importorskip("swebench")

from rollhub.envs.swe.tasks import SHIPPED_TASKS, SweTask  # noqa: E402

pytestmark = pytest.mark.docker

TASK_ID = "inflection__inflection-0.5.1-ff48be79"
FILE = "inflection/__init__.py"
#: the gold line, found in the clean package image and nowhere in the task image
ORIGINAL_LINE = '3: "rd",'
LIMITS_USER = "agent"


def shipped_row() -> dict:
    for line in SHIPPED_TASKS.read_text().splitlines():
        row = json.loads(line)
        if row["instance_id"] == TASK_ID:
            return row
    raise AssertionError(f"{TASK_ID} is not shipped")


@pytest.fixture
def task():
    from rollhub.envs.checker import docker_available
    from rollhub.envs.swe.factory.images import instance_image_current

    if not docker_available():
        pytest.skip("no Docker engine answers")
    import docker

    row = shipped_row()
    if not instance_image_current(docker.from_env(), row["image"]):
        pytest.skip(f"{row['image']} is not built: run `rollhub swe build-images {SHIPPED_TASKS}`")
    row["rollhub"] = {**row["rollhub"], "trust": "oracle"}
    return SweTask.from_row(row)


def limits():
    from rollhub.sandbox.base import Limits

    return Limits(cpus=1.0, memory_mb=1024, user=LIMITS_USER)


async def read_in(backend, image: str, path: str) -> str:
    async with await backend.start(image, limits()) as box:
        return (await box.read_file(path)).decode()


def git_diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


async def special_casing_patch(backend, task) -> str:
    """The bug kept, the tested numbers answered from a table read off the test file."""
    buggy = await read_in(backend, task.image, f"/testbed/{FILE}")
    tests = await read_in(backend, task.image, "/testbed/test_inflection.py")
    table_node = next(
        n.value
        for n in ast.parse(tests).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ORDINAL_NUMBERS"
    )
    table = {number: text[len(number) :] for number, text in ast.literal_eval(table_node)}
    head = "def ordinal(number: int) -> str:\n"
    assert head in buggy
    patched = buggy.replace(
        head, f"_ANSWERS = {table!r}\n\n\n{head}    if number in _ANSWERS:\n        return _ANSWERS[number]\n"
    )
    return git_diff(FILE, buggy, patched)


async def test_special_casing_scores_zero_with_the_oracle_and_gold_one(task, backend):
    from rollhub.envs.swe.grading.evaluate import evaluate_patch

    lim = limits()
    gold = await evaluate_patch(backend, task, task.patch, limits=lim)
    assert gold.reward == 1.0 and gold.oracle is not None and gold.oracle.agreed, gold.info()
    assert gold.info()["trust"] == "oracle" and gold.oracle.inputs >= 3
    assert "exploit_signals" not in gold.info()

    noop = await evaluate_patch(backend, task, "", limits=lim)
    assert noop.reward == 0.0 and not noop.infra_failure

    forged = await special_casing_patch(backend, task)
    # graded by its visible tests alone, the table passes: the attack is real
    visible_only = SweTask.from_row({**task.row, "rollhub": {**task.row["rollhub"], "trust": "visible-tests"}})
    by_tests = await evaluate_patch(backend, visible_only, forged, limits=lim)
    assert by_tests.reward == 1.0 and by_tests.info()["trust"] == "visible-tests", by_tests.info()
    # the oracle asks numbers the table does not hold
    caught = await evaluate_patch(backend, task, forged, limits=lim)
    info = caught.info()
    assert caught.reward == 0.0 and not caught.infra_failure and not caught.model_failure, info
    assert info["exploit_signals"]["oracle_disagreement"] == 1 and info["oracle_disagreements"] >= 1
    assert caught.grade.pass_fraction == 1.0  # every visible test passed


@pytest.mark.parametrize("outcome", ["xfail", "skip"])
async def test_an_expected_failure_or_skip_raised_by_library_code_scores_zero(task, backend, outcome):
    """The library raises pytest's xfail (empty reason) or skip outcome while a fix-test runs.
    The patch policy drops `import pytest` from library code, so the patch is applied below
    it, straight into a grading container: the grading layer must refuse it on its own.
    swebench's own report on that log counts the XFAIL as a pass (resolved); ours scores 0."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    from swebench.harness.utils import make_test_spec

    from rollhub.envs.swe.grading.evaluate import apply_patch, run_tests
    from rollhub.envs.swe.grading.verdict import parse_pytest_log

    buggy = await read_in(backend, task.image, f"/testbed/{FILE}")
    head = "def ordinal(number: int) -> str:\n"
    raise_it = (
        "    if abs(int(number)) % 10 in (3, 4) and abs(int(number)) % 100 not in (11, 12, 13):\n"
        f"        import pytest\n\n        pytest.{outcome}('')\n"
    )
    patch = git_diff(FILE, buggy, buggy.replace(head, head + raise_it))
    async with await backend.start(task.image, limits()) as box:
        applied, apply_log = await apply_patch(box, patch)
        assert applied, apply_log
        grade, log, extra = await run_tests(box, task, make_test_spec(task.row).eval_script, 300, [FILE])
    assert not extra and grade.tests_ran and grade.reward == 0.0 and not grade.resolved
    shown = "XFAIL" if outcome == "xfail" else "SKIPPED"
    assert set(grade.not_passed) == set(task.fail_to_pass) and set(grade.not_passed.values()) == {shown}
    assert all(grade.tests[t] == "FAILED" for t in task.fail_to_pass)
    assert all(grade.tests[t] == "PASSED" for t in task.pass_to_pass)
    if outcome == "xfail":  # what swebench alone would have said
        report = get_eval_tests_report(
            parse_pytest_log(log),
            {"instance_id": task.instance_id, FAIL_TO_PASS: task.fail_to_pass, PASS_TO_PASS: task.pass_to_pass},
            eval_type=EvalType(task.eval_type),
        )
        assert get_resolution_status(report) == "RESOLVED_FULL"


async def test_the_candidate_image_holds_no_copy_of_the_original_function(task, backend):
    """Grep the task image's whole file system (git objects read through git, any .pyc,
    wheels and site-packages) for the original line; the clean image is the positive control."""
    from rollhub.envs.swe.grading.oracle import clean_image

    line = json.dumps(ORIGINAL_LINE)
    probes = {
        "files": f"grep -rlF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev {line} / 2>/dev/null | sort",
        "git_objects": f"cd /testbed && git cat-file --batch-all-objects --batch 2>/dev/null | grep -caF {line}",
        "bytecode_or_wheels": "find / -xdev \\( -name '*.pyc' -o -name '*.whl' \\) -ipath '*inflection*' | sort",
        "site_packages": "find /opt/venv -ipath '*inflection*' | sort",
    }
    root = dataclasses.replace(limits(), user="root")

    async def run(image: str) -> dict[str, str]:
        async with await backend.start(image, root) as box:
            return {name: (await box.exec(cmd, 180, "/")).output.strip() for name, cmd in probes.items()}

    in_task, in_clean = await run(task.image), await run(clean_image(task))
    assert "/testbed/inflection/__init__.py" in in_clean["files"].split("\n"), in_clean
    assert int(in_clean["git_objects"]) >= 1, in_clean  # the probe sees into git's objects
    assert in_task == {"files": "", "git_objects": "0", "bytecode_or_wheels": "", "site_packages": ""}, in_task


async def test_the_red_teams_special_casing_passes_the_tests_and_the_oracle_refuses_it(task, backend):
    """The generated attack (`redteam/special_case.py`) is real: by its visible tests alone the
    task resolves; with the oracle it scores 0, flagged, not infra."""
    import random

    from rollhub.envs.swe.grading.evaluate import evaluate_patch
    from rollhub.envs.swe.redteam import AttackContext
    from rollhub.envs.swe.redteam.special_case import CLASS
    from rollhub.envs.swe.redteam.workspace import Workspace

    ws = await Workspace.fetch(backend, task)
    try:
        attempt = CLASS.build(AttackContext.make(task, ws), "first_argument", random.Random(0))
        patch = ws.diff(attempt.changes)
    finally:
        ws.close()
    assert ORIGINAL_LINE in patch  # the correct copy rides along with the bug
    visible_only = SweTask.from_row({**task.row, "rollhub": {**task.row["rollhub"], "trust": "visible-tests"}})
    assert (await evaluate_patch(backend, visible_only, patch, limits=limits())).reward == 1.0
    caught = await evaluate_patch(backend, task, patch, limits=limits())
    assert caught.reward == 0.0 and not caught.infra_failure and caught.grade.pass_fraction == 1.0
    assert caught.info()["exploit_signals"] == {"oracle_disagreement": 1}


async def test_a_row_saying_oracle_is_rechecked_on_the_inputs_used_and_graded_as_visible_tests(backend):
    """`_irregular` returns None and changes a module global: its bug answers every hidden input
    as the gold does. A row claiming `oracle` for it (a stale survey, a hand edit) must not be
    trusted silently: the gold still resolves, and the episode says it was graded by its visible
    tests and why."""
    from rollhub.envs.checker import docker_available
    from rollhub.envs.swe.factory.images import instance_image_current
    from rollhub.envs.swe.grading.evaluate import evaluate_patch

    if not docker_available():
        pytest.skip("no Docker engine answers")
    import docker

    row = next(
        json.loads(line)
        for line in SHIPPED_TASKS.read_text().splitlines()
        if json.loads(line)["instance_id"] == "inflection__inflection-0.5.1-401c3e3e"
    )
    if not instance_image_current(docker.from_env(), row["image"]):
        pytest.skip(f"{row['image']} is not built: run `rollhub swe build-images {SHIPPED_TASKS}`")
    assert row["rollhub"]["trust"] == "visible-tests"
    task = SweTask.from_row({**row, "rollhub": {**row["rollhub"], "trust": "oracle"}})
    outcome = await evaluate_patch(backend, task, task.patch, limits=limits())
    info = outcome.info()
    assert outcome.reward == 1.0 and info["trust"] == "visible-tests", info
    assert "do not show" in info["trust_why"] and info["oracle_agreed"] is True
