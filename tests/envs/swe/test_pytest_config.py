"""pytest's configuration judged as pytest reads it (no docker needed).

The attacks hide settings from a judge that reads ini files with `configparser` while
pytest reads them with `iniconfig`, or use a file name pytest reads that a judge does not
know. Each variant is checked three ways: pytest's own loader (`_pytest.config.findpaths`)
does read `addopts` from it (the attack is real), the policy drops it, and honest edits of
the same files are kept."""

import configparser

import pytest
from _pytest.config.findpaths import load_config_dict_from_file

from rollhub.envs.swe.grading.patch_policy import PatchPolicy, sanitize_patch
from rollhub.envs.swe.grading.pytest_config import CONFIG_NAMES, config_change, pytest_reads

TOX = "[tox]\nenvlist = py3\n"
METADATA = "[metadata]\nname = demo\n"
SETUP_CFG = "[metadata]\nname = demo\n\n[tool:pytest]\ntestpaths = tests\n"
PYPROJECT = '[project]\nname = "demo"\nversion = "1.0"\n\n[tool.pytest.ini_options]\nxfail_strict = true\n'
BASE_TEXTS = {"tox.ini": TOX, "setup.cfg": SETUP_CFG, "pyproject.toml": PYPROJECT, "pytest.ini": "[pytest]\n"}
BASE_FILES = frozenset({"pkg/__init__.py", "pkg/core.py", "tests/test_core.py", *BASE_TEXTS})
#: every line break `str.splitlines` knows and `configparser` (which splits on "\n") does not
LINE_BREAKS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
#: section headers iniconfig cuts at the first comment character and configparser does not
HEADER_TRICKS = ["[{}];]", "[{}]#]", "[{}] ;]", "[{}]\t# ]"]


def replace_file(path, old, new):
    """A `git diff` section that turns `old` into `new` (one hunk; lines split on "\\n" as git splits)."""
    before, after = old.split("\n")[:-1], new.split("\n")[:-1]
    return (
        f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -1,{len(before)} +1,{len(after)} @@\n"
        + "".join(f"-{line}\n" for line in before)
        + "".join(f"+{line}\n" for line in after)
    )


def new_file(path, text):
    lines = text.split("\n")[:-1]
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n"
        f"+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)
    )


def delete_file(path, text):
    lines = text.split("\n")[:-1]
    return (
        f"diff --git a/{path} b/{path}\ndeleted file mode 100644\nindex 1111111..0000000\n--- a/{path}\n"
        f"+++ /dev/null\n@@ -1,{len(lines)} +0,0 @@\n" + "".join(f"-{line}\n" for line in lines)
    )


def policy(**texts):
    texts = {**BASE_TEXTS, **{k.replace("_", "."): v for k, v in texts.items()}}
    return PatchPolicy.for_task([], ["tests/test_core.py::test_x"], base_files=BASE_FILES, base_texts=texts)


def _hidden(name, base, header, separator="\n"):
    return base.rstrip("\n") + separator + header + separator + "addopts = -p forge\n"


#: (label, file, base text, patched text): hidden `[pytest]` / `[tool:pytest]` sections
INI_DIFFERENTIAL = [
    *[(f"tox.ini break {sep!r}", "tox.ini", TOX, _hidden("tox.ini", TOX, "[pytest]", sep)) for sep in LINE_BREAKS],
    *[
        (f"setup.cfg break {sep!r}", "setup.cfg", METADATA, _hidden("setup.cfg", METADATA, "[tool:pytest]", sep))
        for sep in LINE_BREAKS
    ],
    *[(f"tox.ini header {t!r}", "tox.ini", TOX, _hidden("tox.ini", TOX, t.format("pytest"))) for t in HEADER_TRICKS],
    *[
        (f"setup.cfg header {t!r}", "setup.cfg", METADATA, _hidden("setup.cfg", METADATA, t.format("tool:pytest")))
        for t in HEADER_TRICKS
    ],
]
#: (label, patch): files pytest's rootdir search reads, added or deleted
ADDED_OR_DELETED = [
    ("pytest.toml", new_file("pytest.toml", '[pytest]\naddopts = "-p forge"\n')),
    (".pytest.toml", new_file(".pytest.toml", '[pytest]\npythonpath = ["vendor/forge.zip"]\n')),
    (
        "empty pytest.toml moves the rootdir",
        "diff --git a/pkg/pytest.toml b/pkg/pytest.toml\nnew file mode 100644\nindex 0000000..e69de29\n",
    ),
    ("pkg/.pytest.toml", new_file("pkg/.pytest.toml", '[pytest]\nrequired_plugins = ["forge"]\n')),
    ("docs/tox.ini", new_file("docs/tox.ini", "[pytest]\naddopts = -p forge\n")),
    ("sub setup.cfg", new_file("pkg/setup.cfg", "[tool:pytest]\npython_files = *.py\n")),
    ("sub pyproject", new_file("src/pyproject.toml", '[tool.pytest]\naddopts = ["-p", "forge"]\n')),
    ("deleted pytest.ini", delete_file("pytest.ini", "[pytest]\n")),
    ("deleted setup.cfg", delete_file("setup.cfg", SETUP_CFG)),
]


@pytest.mark.parametrize("label, name, base, new", INI_DIFFERENTIAL, ids=[v[0] for v in INI_DIFFERENTIAL])
def test_settings_configparser_cannot_see_are_read_by_pytest_and_refused(tmp_path, label, name, base, new):
    # the attack is real: pytest's own loader reads addopts from the patched file (written as git writes it)
    (tmp_path / name).write_bytes(new.encode())
    read = load_config_dict_from_file(tmp_path / name)
    assert read is not None and "addopts" in read, label
    # ... and a configparser judge does not see it
    parser = configparser.RawConfigParser(strict=False)
    parser.read_string(new)
    seen = {s for s in parser.sections() if s.lower() in ("pytest", "tool:pytest")}
    assert all("addopts" not in dict(parser.items(s)) for s in seen)
    # the policy does
    assert config_change(name, base, new)
    sanitized = sanitize_patch(replace_file(name, base, new), policy(**{name.replace(".", "_"): base}))
    assert name in sanitized.dropped and "pytest configuration" in sanitized.dropped[name]


@pytest.mark.parametrize("label, patch", ADDED_OR_DELETED, ids=[v[0] for v in ADDED_OR_DELETED])
def test_adding_or_deleting_a_file_pytest_reads_is_refused_anywhere(label, patch):
    sanitized = sanitize_patch(patch, policy())
    assert sanitized.dropped and not sanitized.kept, label
    assert "pytest configuration" in next(iter(sanitized.dropped.values()))


def test_edits_that_leave_what_pytest_reads_alone_are_kept():
    edits = [
        ("tox.ini", TOX, "[tox]\nenvlist = py311\n"),
        ("setup.cfg", SETUP_CFG, SETUP_CFG.replace("name = demo", "name = demo2")),
        ("pyproject.toml", PYPROJECT, PYPROJECT.replace('"1.0"', '"1.1"')),
        ("pytest.ini", "[pytest]\n", "# pytest's settings\n[pytest]\n"),
        ("setup.cfg", SETUP_CFG, SETUP_CFG + "\n[flake8]\nmax-line-length = 100\n"),
    ]
    for name, base, new in edits:
        assert config_change(name, base, new) == "", name
    patch = "".join(replace_file(name, base, new) for name, base, new in edits[:4])
    sanitized = sanitize_patch(patch, policy())
    assert sanitized.patch == patch and not sanitized.dropped


def test_changed_settings_unreadable_texts_and_parser_disagreements_are_refused():
    cases = [
        ("pyproject.toml", PYPROJECT, PYPROJECT.replace("xfail_strict = true", 'addopts = "-p forge"')),
        ("pyproject.toml", PYPROJECT, PYPROJECT + '\n[tool.pytest]\naddopts = ["-p", "forge"]\n'),
        ("pytest.ini", "[pytest]\n", "[pytest]\npythonpath = forge.zip\n"),
        ("setup.cfg", SETUP_CFG, SETUP_CFG + "\n[options.entry_points]\npytest11 =\n    forge = forge\n"),
        ("setup.cfg", SETUP_CFG, SETUP_CFG + "\n[pytest]\n"),  # pytest fails on a [pytest] setup.cfg
        ("tox.ini", TOX, TOX + "[tox]\n"),  # duplicate section: iniconfig rejects what it accepted
        ("tox.ini", TOX, "\ufeff[pytest]\naddopts = -p forge\n" + TOX),  # iniconfig >= 2.3.1 strips a BOM
        ("tox.ini", TOX, TOX + "# \udcff\n"),  # not UTF-8: pytest cannot open it
        ("pyproject.toml", PYPROJECT, PYPROJECT + "[broken\n"),
        # pytest opens the file with universal newlines: a CR starts a table a raw tomllib read rejects
        ("pyproject.toml", PYPROJECT, PYPROJECT.rstrip("\n") + '\r[tool.pytest]\raddopts = ["-p", "forge"]\n'),
        ("pytest.toml", "[pytest]\nxfail_strict = true\n", "[pytest]\nxfail_strict = true\n\n[x]\ny = 1\n"),
    ]
    for name, base, new in cases:
        assert config_change(name, base, new), (name, new)
    # a base text the judge cannot read allows no change at all
    assert config_change("tox.ini", "[tox\n", "[tox\n# comment\n")


def test_the_judge_reads_what_pytest_reads(tmp_path):
    """The judge's view of the pytest section is pytest's own, on texts the two parsers split differently."""
    texts = [TOX + "[pytest]\naddopts = -ra\n  -q\n", *(new for _, _, _, new in INI_DIFFERENTIAL if "tox" in _)]
    for text in texts:
        (tmp_path / "tox.ini").write_bytes(text.encode())
        pytest_view = {k: v.value for k, v in (load_config_dict_from_file(tmp_path / "tox.ini") or {}).items()}
        assert pytest_reads("tox.ini", text)["iniconfig"].get("pytest", {}) == pytest_view
    assert CONFIG_NAMES[:2] == ("pytest.toml", ".pytest.toml")


def test_packaging_changes_that_load_no_code_are_not_pytest_configuration():
    """Honest release changes (tabulate, pluggy): requirements and package layout moved between
    setup.cfg and pyproject.toml; entry points, the way a pytest11 plugin loads, are still judged."""
    base = "[options]\ninstall_requires = six\npackages = find:\n[tool:pytest]\naddopts = -q\n"
    moved = "[options]\ninstall_requires = six>=1.16\npython_requires = >=3.9\n[tool:pytest]\naddopts = -q\n"
    assert config_change("setup.cfg", base, moved) == ""
    plugin = moved + "entry_points =\n    pytest11 = forge = pkg.forge\n"
    assert config_change(
        "setup.cfg", base, plugin.replace("[tool:pytest]\naddopts = -q\n", "") + "[tool:pytest]\naddopts = -q\n"
    )
    toml = '[tool.setuptools]\npackages = ["tab"]\n[tool.pytest.ini_options]\naddopts = "-q"\n'
    assert config_change("pyproject.toml", toml, toml.replace('packages = ["tab"]', 'package-dir = {"" = "src"}')) == ""
    scripts = toml + '[project.entry-points.pytest11]\nforge = "tab.forge"\n'
    assert config_change("pyproject.toml", toml, scripts)
    version = toml + '[tool.setuptools.dynamic]\nversion = {attr = "tab._version.__version__"}\n'
    assert config_change("pyproject.toml", toml, version) == ""  # sniffio
    plugin_file = toml + '[tool.setuptools.dynamic]\nentry-points = {file = "plugins.cfg"}\n'
    assert config_change("pyproject.toml", toml, plugin_file)
    assert config_change("pyproject.toml", toml, toml.replace('"-q"', '"-p tab.forge"'))
