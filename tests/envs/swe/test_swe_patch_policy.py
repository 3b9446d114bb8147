"""The grader's diff parser and file policy on crafted diffs (no docker needed).

Every forged text here is one a policy can produce in its container (custom git config,
an external diff program, a replaced git binary); each must be rejected or lose the
sections that would change how the tests run."""

import json

import pytest

from rollhub.envs.swe.patch_policy import (
    PatchPolicy,
    PatchRejected,
    apply_hunks,
    config_changes_runner,
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


def test_binary_sections_parse_and_binary_python_is_dropped():
    binary = (
        "diff --git a/pkg/logo.png b/pkg/logo.png\nnew file mode 100644\nindex 0000000..f1c1e0a\n"
        "GIT binary patch\nliteral 5\nMcmZQzWMXCj0000200jU7\n\nliteral 0\nHcmV?d00001\n\n"
    )
    assert sanitize_patch(binary, policy()).kept == ["pkg/logo.png"]
    assert "binary" in sanitize_patch(binary.replace("logo.png", "fast.so"), policy()).dropped["pkg/fast.so"]


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
    from rollhub.envs.swe.evaluate import drop_test_files

    cheat = (
        new_file("conftest.py", PLUGIN) + "diff --git a/tests/test_a.py b/tests/test_a.py\ndeleted file mode 100644\n"
    )
    assert drop_test_files(cheat) == ""
    assert drop_test_files(cheat + edit("pkg/core.py")) == edit("pkg/core.py")
