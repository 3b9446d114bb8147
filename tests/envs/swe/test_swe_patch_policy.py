"""The grader's diff parser and file policy on crafted diffs (no docker needed).

Every forged text here is one a policy can produce in its container (custom git config,
an external diff program, a replaced git binary); each must be rejected or lose the
sections that would change how the tests run."""

import json

import pytest

from rollhub.envs.swe.grading.patch_policy import (
    PatchPolicy,
    PatchRejected,
    apply_hunks,
    config_changes_runner,
    doctest_hosts,
    parse_git_diff,
    reset_targets,
    sanitize_patch,
)
from rollhub.envs.swe.tasks import SHIPPED_TASKS

PLUGIN = "import pytest\n\n@pytest.hookimpl(wrapper=True)\ndef pytest_runtest_makereport(item, call):\n    r = yield\n"
BASE_FILES = frozenset(
    {"pkg/__init__.py", "pkg/core.py", "tests/test_core.py", "setup.cfg", "pyproject.toml", "mod.py"}
)


def new_file(path, text="x = 1\n", mode="100644", a="a/", b="b/"):
    lines = text.rstrip("\n").split("\n")
    body = "".join(f"+{line}\n" for line in lines)
    return (
        f"diff --git {a}{path} {b}{path}\nnew file mode {mode}\nindex 0000000..1111111\n"
        f"--- /dev/null\n+++ {b}{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def section(path, hunk, *lines, header=""):
    """One `diff --git` section of `path` with extended header lines and one hunk."""
    old = "/dev/null" if "new file mode" in header else f"a/{path}"
    body = "".join(f"{line}\n" for line in lines)
    return f"diff --git a/{path} b/{path}\n{header}--- {old}\n+++ b/{path}\n{hunk}\n{body}"


def edit(path, old="a", new="b"):
    return section(path, "@@ -1 +1 @@", f"-{old}", f"+{new}", header="index 1111111..2222222 100644\n")


def policy(**kwargs):
    kwargs.setdefault("base_files", BASE_FILES)
    return PatchPolicy.for_task([], ["tests/test_core.py::test_x"], **kwargs)


def test_every_shipped_gold_patch_parses_and_is_kept_whole():
    for line in SHIPPED_TASKS.read_text().splitlines():
        row = json.loads(line)
        tests = json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"])
        if doctest_hosts(tests):  # judged against their base texts: tests/envs/swe/test_content_rules_gold.py
            continue
        sanitized = sanitize_patch(row["patch"], PatchPolicy.for_task([], tests, eval_script=row["eval_script"]))
        assert sanitized.patch == row["patch"] and not sanitized.dropped and not sanitized.rejected


@pytest.mark.parametrize(
    "text, why",
    [
        # diff.mnemonicPrefix / diff.noprefix headers (the red team's first finding)
        (new_file("conftest.py", PLUGIN, a="c/", b="i/"), "a/PATH b/PATH"),
        (
            new_file("conftest.py", a="", b=""),
            "",
        ),
        # a traditional patch with no `diff --git` line (git apply takes it)
        ("--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+x\n", "outside any file section"),
        (edit("pkg/core.py") + "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+x\n", "unexpected line"),
        # writing into .git (the external-diff hook) and out of the repository
        (new_file(".git/hooks/post-checkout", "#!/bin/sh\ntouch /tmp/x\n", "100755"), "inside .git"),
        (new_file("pkg/.GIT./config"), "inside .git"),
        (new_file("../outside.py"), "leaves the repository"),
        (new_file("/etc/cron.d/x"), ""),
        (new_file("pkg//core.py"), "leaves the repository"),
        # renames / copies carry a second path: git diff --no-renames never writes them
        (
            "diff --git a/README b/README\nsimilarity index 90%\ncopy from README\ncopy to conftest.py\n"
            "--- a/README\n+++ b/conftest.py\n@@ -1 +1 @@\n-a\n+b\n",
            "",
        ),
        # file names that disagree with the header; a hunk longer than its count
        (
            "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/conftest.py\n@@ -1 +1 @@\n-a\n+b\n",
            "names",
        ),
        ("diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1 +1 @@\n-a\n+b\n+c\n", ""),
        (
            "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1,2 +1,2 @@\n-a\n",
            "truncated",
        ),
        (edit("pkg/core.py") + edit("pkg/core.py", "b", "c"), "two sections"),
        ('diff --git "a/pkg/\\q.py" "b/pkg/\\q.py"\n--- a/x\n', "bad escape"),
        ("diff --git a/x b/x\nBinary files a/x and b/x differ\n", ""),
    ],
)
def test_forged_texts_are_rejected_whole(text, why):
    sanitized = sanitize_patch(edit("pkg/core.py") + text, policy())
    assert sanitized.rejected and sanitized.patch == ""  # the good section goes down with it
    with pytest.raises(PatchRejected, match=why or None):
        parse_git_diff(text)


@pytest.mark.parametrize(
    "path, text",
    [
        ("conftest.py", PLUGIN),
        ("pkg/conftest.py", PLUGIN),
        ("tests/conftest.py", PLUGIN),
        ("tests/test_core.py", "def test_x():\n    pass\n"),
        ("tests/__init__.py", ""),
        ("pytest.ini", "[pytest]\naddopts = -p forge\n"),
        ("pkg/.pytest.ini", "[pytest]\n"),
        ("tox.ini", "[pytest]\naddopts = -p forge\n"),
        ("sitecustomize.py", "import os\n"),
        ("pkg/usercustomize.py", "import os\n"),
        ("forge.pth", "import os\n"),
        ("src/forge.pth", "import os\n"),
        ("pkg/__pycache__/core.cpython-311.pyc", "x\n"),
        ("pkg/core.pyc", "x\n"),
        (".pytest_cache/v/cache/lastfailed", "{}\n"),
        ("forge-0.1.dist-info/entry_points.txt", "[pytest11]\nforge = forge\n"),
        ("src/forge.egg-info/entry_points.txt", "[pytest11]\nforge = forge\n"),
        ("venv/lib/python3.11/site-packages/forge.py", "x = 1\n"),
        ("pytest/__init__.py", "import sys\n"),  # shadows pytest through sys.path[0]
        ("json.py", "x = 1\n"),  # shadows the standard library
        ("src/pytest.py", "x = 1\n"),
        ("forge_plugin.py", PLUGIN),
        (".gitattributes", "*.py filter=x\n"),
        (".pythonrc.py", "x = 1\n"),
        ("pkg/helpers.py", "import _pytest.reports\n"),  # library code reaching into the runner
        ("pkg/helpers.py", "def pytest_configure(config):\n    pass\n"),
        ("pkg/helpers.py", 'import sys\n\nUNDER_TEST = "pytest" in sys.modules  # special-cases the tests\n'),
    ],
)
def test_sections_that_change_the_test_run_are_dropped(path, text):
    sanitized = sanitize_patch(edit("pkg/core.py") + new_file(path, text), policy())
    assert not sanitized.rejected
    assert path in sanitized.dropped and sanitized.kept == ["pkg/core.py"]
    assert sanitized.patch == edit("pkg/core.py")


def test_symlinks_submodules_and_test_files_named_by_the_task_are_dropped():
    new = "new file mode {}\n".format
    link = section("pkg/link.py", "@@ -0,0 +1 @@", "+/etc/passwd", "\\ No newline at end of file", header=new(120000))
    gitlink = section("vendored", "@@ -0,0 +1 @@", "+Subproject commit 1234567", header=new(160000))
    checks = edit("checks/spec_x.py")
    task_policy = PatchPolicy.for_task([], ["checks/spec_x.py::test_y"], base_files=BASE_FILES | {"checks/spec_x.py"})
    sanitized = sanitize_patch(edit("pkg/core.py") + link + gitlink + checks, task_policy)
    assert set(sanitized.dropped) == {"pkg/link.py", "vendored", "checks/spec_x.py"}
    assert "symlink" in sanitized.dropped["pkg/link.py"] and sanitized.kept == ["pkg/core.py"]
    # the eval script's reset targets (folders too) are test files of the task
    script = "git checkout abcdef1234 -- spec 2>/dev/null || true\npytest spec\n"
    assert reset_targets(script) == ["spec"]
    by_script = PatchPolicy.for_task([], [], base_files=BASE_FILES, eval_script=script)
    assert "spec/data.json" in sanitize_patch(new_file("spec/data.json", "{}"), by_script).dropped


def test_library_edits_new_modules_in_packages_and_data_files_are_kept():
    patch = edit("pkg/core.py") + new_file("pkg/_util.py") + new_file("pkg/sub/__init__.py") + edit("mod.py")
    patch += new_file("docs/notes.txt", "pytest is mentioned in a text file\n") + new_file("pkg/data.json", "{}")
    sanitized = sanitize_patch(patch, policy())
    assert not sanitized.dropped and not sanitized.rejected and sanitized.patch == patch


def test_quoted_paths_and_names_with_spaces():
    quoted = (
        'diff --git "a/pkg/\\303\\244 b.py" "b/pkg/\\303\\244 b.py"\nnew file mode 100644\n'
        '--- /dev/null\n+++ "b/pkg/\\303\\244 b.py"\n@@ -0,0 +1 @@\n+x\n'
    )
    spaced = section("pkg/a b.py", "@@ -0,0 +1 @@", "+x", header="new file mode 100644\n")
    spaced = spaced.replace("+++ b/pkg/a b.py\n", "+++ b/pkg/a b.py\t\n")  # git's tab after names with spaces
    sanitized = sanitize_patch(quoted + spaced, policy())
    assert sanitized.kept == ["pkg/ä b.py", "pkg/a b.py"]
    assert "pkg/conftest.py" in sanitize_patch(quoted.replace("\\303\\244 b.py", "conftest.py"), policy()).dropped


def test_binary_sections_parse_and_are_dropped():
    binary = (
        "diff --git a/pkg/logo.png b/pkg/logo.png\nnew file mode 100644\nindex 0000000..f1c1e0a\n"
        "GIT binary patch\nliteral 5\nMcmZQzWMXCj0000200jU7\n\nliteral 0\nHcmV?d00001\n\n"
    )
    (parsed,) = parse_git_diff(binary)
    assert parsed.binary and parsed.path == "pkg/logo.png"
    # no binary reaches the run: Python could import an archive of any name (zipimport), no one can read one
    assert "binary" in sanitize_patch(binary, policy()).dropped["pkg/logo.png"]
    assert "native" in sanitize_patch(binary.replace("logo.png", "fast.so"), policy()).dropped["pkg/fast.so"]


def test_config_files_are_judged_by_their_runner_sections():
    base_cfg = "[metadata]\nname = demo\n\n[tool:pytest]\ntestpaths = tests\n"
    base_toml = '[project]\nname = "demo"\nversion = "1.0"\n\n[tool.pytest.ini_options]\nxfail_strict = true\n'
    texts = {"setup.cfg": base_cfg, "pyproject.toml": base_toml}
    harmless = section("setup.cfg", "@@ -2 +2 @@", "-name = demo", "+name = demo2") + section(
        "pyproject.toml", "@@ -3 +3 @@", '-version = "1.0"', '+version = "1.1"'
    )
    sanitized = sanitize_patch(harmless, policy(base_texts=texts))
    assert sanitized.kept == ["setup.cfg", "pyproject.toml"] and not sanitized.dropped
    forging = (
        section("setup.cfg", "@@ -5 +5,2 @@", " testpaths = tests", "+addopts = -p forge")
        + section("pyproject.toml", "@@ -6 +6 @@", "-xfail_strict = true", '+addopts = "-p forge"')
        + new_file("setup.py", "setup(entry_points={'pytest11': ['f = f']})")
    )
    sanitized = sanitize_patch(forging, policy(base_texts=texts))
    assert set(sanitized.dropped) == {"setup.cfg", "pyproject.toml", "setup.py"} and sanitized.patch == ""
    # a new tox.ini with a [pytest] section, and a config whose base text is unknown
    assert "tox.ini" in sanitize_patch(new_file("tox.ini", "[pytest]\naddopts = -p f"), policy()).dropped
    assert "setup.cfg" in sanitize_patch(harmless, policy()).dropped
    assert config_changes_runner("tox.ini", "[tox]\nenvlist = py3\n", "[tox]\nenvlist = py311\n") is False
    assert config_changes_runner("pyproject.toml", "", '[project.entry-points.pytest11]\nf = "f"\n') is True


def test_apply_hunks_rebuilds_the_new_text():
    base = "a\nb\nc\nd\n"
    patch = section("f.txt", "@@ -2,2 +2,3 @@", " b", "-c", "+C", "+C2")
    (parsed,) = parse_git_diff(patch)
    assert apply_hunks(base, parsed) == "a\nb\nC\nC2\nd\n"
    assert apply_hunks("x\ny\n", parsed) is None  # context that does not match


def test_drop_test_files_keeps_library_sections_only():
    from rollhub.envs.swe.grading.evaluate import drop_test_files

    cheat = (
        new_file("conftest.py", PLUGIN) + "diff --git a/tests/test_a.py b/tests/test_a.py\ndeleted file mode 100644\n"
    )
    assert drop_test_files(cheat) == ""
    assert drop_test_files(cheat + edit("pkg/core.py")) == edit("pkg/core.py")


def test_a_module_hosting_doctests_of_the_task_stays_editable():
    doctests = ["pkg/core.py::pkg.core.parse", "pkg/core.py::core", "pkg/__init__.py::pkg"]
    tests = ["tests/test_core.py::test_x", "tests/test_core.py::tests.test_core.helper", "checks/spec_x.py::test_y"]
    base_texts = {"pkg/core.py": "a", "pkg/__init__.py": "a"}
    task_policy = PatchPolicy.for_task(
        [], doctests + tests, base_files=BASE_FILES | {"checks/spec_x.py"}, base_texts=base_texts
    )
    assert task_policy.test_files == {"tests/test_core.py", "checks/spec_x.py"}
    fix = edit("pkg/core.py") + edit("pkg/__init__.py")
    sanitized = sanitize_patch(fix, task_policy)
    assert sanitized.patch == fix and not sanitized.dropped and not sanitized.rejected
    # real test files stay protected, also when their doctests are among the task's tests
    cheat = edit("tests/test_core.py") + edit("checks/spec_x.py") + new_file("tests/__init__.py", "")
    assert set(sanitize_patch(fix + cheat, task_policy).dropped) == {
        "tests/test_core.py",
        "checks/spec_x.py",
        "tests/__init__.py",
    }
    by_doctest = PatchPolicy.for_task([], ["checks/spec_x.py::spec_x.f"], base_files=BASE_FILES)
    assert "checks/spec_x.py" not in by_doctest.test_files  # a doctest host, not a test module
    assert PatchPolicy.for_task([], ["pkg/test_util.py::pkg.test_util.f"]).test_files == {"pkg/test_util.py"}
    # the test patch and the eval script's reset targets still protect a module by name
    named = PatchPolicy.for_task(["pkg/core.py"], doctests, base_files=BASE_FILES)
    assert "pkg/core.py" in sanitize_patch(fix, named).dropped


DOCTEST_BASE = '''def parse(text):
    """Split on commas.

    >>> parse("a,b")
    ['a', 'b']
    """
    return text.split(";")
'''


def _rewrite(old_line, new_line):
    """A one-line edit of DOCTEST_BASE's line `old_line` (1-based) into `new_line`."""
    old = DOCTEST_BASE.split("\n")[old_line - 1]
    return section(
        "pkg/core.py", f"@@ -{old_line} +{old_line} @@", f"-{old}", f"+{new_line}", header="index 1..2 100644\n"
    )


def test_the_doctests_of_the_task_are_tests_a_patch_cannot_edit():
    ids = ["pkg/core.py::pkg.core.parse"]
    task = PatchPolicy.for_task([], ids, base_files=BASE_FILES, base_texts={"pkg/core.py": DOCTEST_BASE})
    fix = _rewrite(7, '    return text.split(",")')
    assert sanitize_patch(fix, task).patch == fix  # the honest fix: the code under the docstring
    cheats = [
        _rewrite(5, "    ['a,b']"),  # the expected output made to match the bug
        _rewrite(4, '    >>> parse("a;b")'),  # the example made to match the bug
        _rewrite(4, "    >>> 1"),  # the example replaced by one that passes
        _rewrite(2, '    """Split on commas."""'),  # the docstring cut short: no example left
    ]
    for cheat in cheats:
        assert "doctest" in sanitize_patch(cheat, task).dropped["pkg/core.py"], cheat
    # the examples rewritten at run time, from the module itself or from any other one
    for path in ("pkg/core.py", "pkg/other.py"):
        runtime = new_file(path, "parse.__doc__ = '>>> 1\\n1'\n") if path != "pkg/core.py" else None
        if runtime is None:
            runtime = _rewrite(7, "    return text.split(','); parse.__doc__ = ''")
        assert "docstring" in sanitize_patch(runtime, task).dropped[path]
    # without the base text the change cannot be judged: dropped, never waved through
    blind = PatchPolicy.for_task([], ids, base_files=BASE_FILES)
    assert "base text unknown" in sanitize_patch(fix, blind).dropped["pkg/core.py"]


def test_names_with_tabs_and_carriage_returns_are_judged_file_by_file():
    # as `git diff --binary --no-renames` writes them: C-quoted, a tab after names with spaces
    def quoted(name, line="+x"):
        return (
            f'diff --git "a/{name}" "b/{name}"\nnew file mode 100644\nindex 0000000..975fbec\n'
            f'--- /dev/null\n+++ "b/{name}"\t\n@@ -0,0 +1 @@\n{line}\n'
        )

    patch = (
        edit("pkg/core.py") + quoted("pkg/da\\tta.txt") + quoted("pkg/c r\\r.txt") + quoted("pkg/\\303\\244\\177.py")
    )
    sanitized = sanitize_patch(patch, policy())
    assert not sanitized.rejected and not sanitized.dropped and sanitized.patch == patch
    assert sanitized.kept == ["pkg/core.py", "pkg/da\tta.txt", "pkg/c r\r.txt", "pkg/ä\x7f.py"]
    # the grading container's `git apply --numstat -z` names them whole (a rename: two names)
    from rollhub.envs.swe.grading.evaluate import numstat_paths

    listing = "1\t0\tpkg/c r\r.txt\x001\t1\tpkg/core.py\x001\t0\tpkg/da\tta.txt\x001\t0\tpkg/ä\x7f.py\x00"
    assert numstat_paths(listing) == set(sanitized.kept)
    assert numstat_paths("0\t0\t\x00a\tb.py\x00c.py\x00") == {"a\tb.py", "c.py"}
    # such a file is judged like any other: a test file or runner hook is dropped, the fix kept
    cheat = quoted("tests/test_\\tx.py") + quoted("pkg/h\\r.py", "+import pytest")
    sanitized = sanitize_patch(edit("pkg/core.py") + cheat, policy())
    assert set(sanitized.dropped) == {"tests/test_\tx.py", "pkg/h\r.py"} and sanitized.kept == ["pkg/core.py"]
    # what git never writes is still rejected whole: raw control characters, NUL, a bad escape
    for forged in (
        edit("pkg/da\tta.txt"),
        quoted("pkg/da\tta.txt"),
        edit("pkg/c\rr.txt"),
        quoted("pkg/nul\\000.py"),
        quoted("pkg/bad\\9.py"),
        quoted('pkg/q"q.py'),
    ):
        rejected = sanitize_patch(edit("pkg/core.py") + forged, policy())
        assert rejected.rejected and rejected.patch == "", forged
