"""The factory's doctest mode without Docker: the library modules that have examples join the
suite with `--doctest-modules`, only they are mutated, the eval script runs them but resets
only the test files (they hold the fix), and the same mutant makes a task of its own."""

from __future__ import annotations

import json
import shlex

from rollhub.envs.swe.factory.build import Candidate, instance_id_for, make_row, suite_command
from rollhub.envs.swe.factory.package_repo import PackageRepo
from rollhub.envs.swe.tasks import SHIPPED_TASKS, SweTask


def _repo(tmp_path) -> PackageRepo:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "with_doc.py").write_text('def f():\n    """\n    >>> f()\n    1\n    """\n    return 1\n')
    (tmp_path / "pkg" / "plain.py").write_text("def g():\n    return 2\n")
    return PackageRepo("pkg", "1.0", tmp_path, ["tests"], ["pkg/plain.py", "pkg/with_doc.py"], "")


def test_doctest_mode_adds_the_modules_with_examples_and_the_flag(tmp_path):
    repo = _repo(tmp_path)
    plain_id = instance_id_for(repo, "key")
    assert suite_command(repo).endswith("console_output_style=classic")
    assert repo.use_doctests() == ["pkg/with_doc.py"]
    assert repo.suite_targets == ["tests", "pkg/with_doc.py"]
    assert suite_command(repo).endswith(" --doctest-modules")
    assert instance_id_for(repo, "key") != plain_id


def test_doctest_rows_run_the_modules_and_reset_only_the_tests(tmp_path):
    repo = _repo(tmp_path)
    repo.use_doctests()
    gold = "diff --git a/pkg/with_doc.py b/pkg/with_doc.py\n"
    candidate = Candidate("k", "pkg/with_doc.py", "f", "op_flip", 6, "bug", gold)
    record = {"fail_to_pass": ["pkg/with_doc.py::pkg.with_doc.f"], "pass_to_pass": ["tests/test_x.py::test_y"]}
    row = make_row(repo, candidate, record, "img:latest", "a" * 40)
    script = row["eval_script"]
    run_line = next(line for line in script.splitlines() if "pytest" in line)
    assert "--doctest-modules" in run_line and shlex.split(run_line)[-2:] == ["tests", "pkg/with_doc.py"]
    resets = [line for line in script.splitlines() if line.startswith("git checkout")]
    assert resets and all("with_doc" not in line for line in resets)
    assert row["rollhub"]["doctest_modules"] == ["pkg/with_doc.py"]


def test_shipped_set_holds_doctest_tasks_of_two_packages_whose_fix_module_hosts_doctests():
    rows = [json.loads(line) for line in SHIPPED_TASKS.read_text().splitlines() if line.strip()]
    doctest_rows = [r for r in rows if r["rollhub"].get("doctest_modules")]
    assert len(doctest_rows) >= 6
    assert len({r["repo"] for r in doctest_rows}) >= 2
    for row in doctest_rows:
        task = SweTask.from_row(row)
        fixed = row["rollhub"]["mutation"]["file"]
        tests = [*task.fail_to_pass, *task.pass_to_pass]
        assert any(t.startswith(f"{fixed}::") for t in tests), row["instance_id"]
        assert "--doctest-modules" in task.eval_script
