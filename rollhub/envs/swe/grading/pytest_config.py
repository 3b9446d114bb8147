"""What pytest reads from its configuration files, read the way pytest reads them.

pytest looks for its configuration, in every directory from its arguments up to the root,
in the files of `CONFIG_NAMES`, in that order (`_pytest/config/findpaths.py`,
`CONFIG_LOADERS_BY_NAME`, pytest 9): the first that holds pytest settings wins and fixes
the rootdir. Any of them can turn a plugin on (`addopts = -p ...`, `pythonpath` to an
archive that carries a `pytest11` entry point, `required_plugins`, `python_files`...). So a
patch may not add or delete one anywhere, and may change one only where what pytest reads
from it stays the same.

"What pytest reads" is decided with pytest's own parsers, not with look-alikes:
`iniconfig` for the ini-style files (opened in text mode, so `\\r` ends a line, and split
with `str.splitlines`, so `\\f`, `\\v`, `\\x1c`-`\\x1e`, `\\x85`, `\\u2028`, `\\u2029` end one too:
`configparser` sees none of those and reads a different file), `tomllib` for the TOML files.
Every section or table whose name contains `pytest` is compared (a superset of what any pytest
version reads), with and without a leading BOM (iniconfig strips it since 2.3.1), plus the
entry-point tables packaging tools read. A patched text that one of the parsers rejects is
refused, whatever the base was.
"""

from __future__ import annotations

import configparser
import tomllib
from typing import Any

#: every file name pytest's rootdir search reads, in pytest's order of precedence
CONFIG_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
_INI_NAMES = frozenset({"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg"})
_BOM = "\N{BYTE ORDER MARK}"
#: install options that load code a reinstall would run: entry points (a `pytest11` plugin), scripts
#: (one named pytest), data files (a `.pth` into site-packages), dynamic values read from files.
#: Which packages or directories an install takes decides nothing new: every module in them is a
#: file the patch policy judges by itself (content rule, new top-level modules, start-up files)
_CODE_OPTIONS = frozenset({"entry_points", "scripts", "script_files", "dynamic", "data_files", "gui_scripts"})


class ConfigUnreadable(ValueError):
    """The judge cannot read the text as pytest would (then no change to it is allowed)."""


def is_config_name(path: str) -> bool:
    return path.rsplit("/", 1)[-1].lower() in CONFIG_NAMES


def as_pytest_opens(text: str) -> str:
    """The text pytest gets from `open(path, encoding="utf-8")`: universal newlines; bytes
    that are not UTF-8 make pytest fail, and the judge refuse."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigUnreadable("not UTF-8: pytest cannot read it") from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _ini_view(text: str) -> Any:
    try:
        import iniconfig
    except ImportError as exc:  # pytest's own dependency: without it nothing can be judged
        raise ConfigUnreadable("iniconfig (pytest's ini parser) is not installed: pip install iniconfig") from exc
    try:
        parsed = iniconfig.IniConfig("judged.ini", data=text)
    except iniconfig.ParseError as exc:
        return ("rejected by iniconfig", str(exc).split(":", 1)[-1].strip())
    return {
        name: dict(parsed[name].items())
        for name in parsed.sections
        if "pytest" in name.lower() or name.strip().lower() in ("pytest", "tool:pytest")
    }


def _configparser_view(text: str) -> Any:
    """The entry-point and options sections as setuptools reads setup.cfg (a reinstall would)."""
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return "rejected by configparser"
    wanted = ("options.entry_points", "options", "pytest", "tool:pytest")
    view = {name: dict(parser.items(name)) for name in parser.sections() if name.strip().lower() in wanted}
    for name, options in view.items():
        if name.strip().lower() == "options":  # requirements and metadata load nothing into pytest
            view[name] = {key: value for key, value in options.items() if key.strip().lower() in _CODE_OPTIONS}
    return {name: options for name, options in view.items() if options}


def _toml_view(name: str, text: str) -> Any:
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError):
        return "rejected by tomllib"
    if name in ("pytest.toml", ".pytest.toml"):
        return data  # the whole file is pytest's (top-level keys are an error pytest reports)
    tool = data.get("tool") if isinstance(data.get("tool"), dict) else {}
    project = data.get("project") if isinstance(data.get("project"), dict) else {}
    poetry = tool.get("poetry") if isinstance(tool.get("poetry"), dict) else {}
    return {
        "pytest": data.get("pytest"),
        "tool": {key: value for key, value in tool.items() if "pytest" in key.lower()},
        "project.entry-points": project.get("entry-points"),
        "project.scripts": project.get("scripts"),
        "project.gui-scripts": project.get("gui-scripts"),
        "tool.poetry.plugins": poetry.get("plugins"),
        "tool.setuptools": _code_options(tool.get("setuptools")),
    }


def _code_options(table: object) -> object:
    """The keys of `[tool.setuptools]` that choose what code an install puts on the path."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        return table
    chosen = {key: value for key, value in table.items() if key.lower().replace("-", "_") in _CODE_OPTIONS}
    dynamic = chosen.get("dynamic")
    if isinstance(dynamic, dict):  # a version read from a module loads nothing; entry points read from a file do
        chosen["dynamic"] = {
            k: v for k, v in dynamic.items() if k.lower().replace("-", "_") in _CODE_OPTIONS | {"gui_scripts"}
        }
        if not chosen["dynamic"]:
            del chosen["dynamic"]
    return chosen


def pytest_settings(name: str, text: str) -> Any:
    """Only the pytest settings of the file `name` (sections and tables named for pytest), to
    tell a change of pytest's configuration from one of packaging metadata. None when the text
    cannot be read."""
    name = name.lower()
    try:
        text = as_pytest_opens(text).removeprefix(_BOM)
    except ConfigUnreadable:
        return None
    if name in _INI_NAMES:
        return _ini_view(text)
    view = _toml_view(name, text)
    return view if isinstance(view, str) or name in ("pytest.toml", ".pytest.toml") else (view["pytest"], view["tool"])


def pytest_reads(name: str, text: str) -> Any:
    """Everything of the file `name` (a base name of `CONFIG_NAMES`) that pytest, or a
    packaging tool that installs its entry points, would read from `text`."""
    name = name.lower()
    text = as_pytest_opens(text)
    if name in _INI_NAMES:
        views = {"iniconfig": _ini_view(text), "iniconfig-no-bom": _ini_view(text.removeprefix(_BOM))}
        if name == "setup.cfg":
            views["configparser"] = _configparser_view(text)
        return views
    if name.endswith(".toml"):
        return {"tomllib": _toml_view(name, text.removeprefix(_BOM))}
    raise ConfigUnreadable(f"{name} is not a pytest configuration file")


def config_change(name: str, base: str | None, new: str | None) -> str:
    """Why a patch that turns the file `name` from `base` into `new` (None: absent) changes
    pytest's configuration, or "" when pytest reads the same from both."""
    name = name.rsplit("/", 1)[-1].lower()
    if base is None and new is None:
        return ""
    if base is None:
        return f"adds {name}, which pytest's rootdir search reads"
    if new is None:
        return f"deletes {name}, which pytest's rootdir search reads"
    try:
        before = pytest_reads(name, base)
    except ConfigUnreadable as exc:
        return f"{name}: the base text cannot be judged ({exc})"
    try:
        after = pytest_reads(name, new)
    except ConfigUnreadable as exc:
        return f"{name}: the patched text cannot be judged ({exc})"
    for view, value in after.items():
        if isinstance(value, tuple | str):  # pytest would stop on it, or the judge cannot tell
            return f"{name}: the patched text is rejected by {view}"
    if before != after:
        changed = sorted(view for view in after if after[view] != before.get(view))
        return f"{name}: what pytest (or an installer) reads changes ({', '.join(changed)})"
    return ""
