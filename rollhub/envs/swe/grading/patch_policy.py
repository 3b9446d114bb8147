"""What of an agent's diff may reach the grading container, decided on the diff's text.

The diff comes from the agent's container, where the agent was root: it may have changed
the repository's git configuration, the git binary itself, anything. So the text is
parsed here as untrusted input, strictly, with the grammar `git diff --binary
--no-renames` emits (`parse_git_diff`, names C-quoted as git quotes them); anything else
rejects the whole patch. Then every file section is judged (`PatchPolicy.why_dropped`) by
what the file would do in the grading run, not only by its name:

* tests: test files and directories, `conftest.py` anywhere, the task's own test files
  (test patch, eval-script reset targets, the files of FAIL_TO_PASS / PASS_TO_PASS ids; not
  a library module whose doctests are the ids: it holds the code to fix), `__init__.py` next
  to a task test file;
* test-runner configuration: every file pytest's rootdir search reads (`pytest.toml`,
  `.pytest.toml`, `pytest.ini`, `.pytest.ini`, `pyproject.toml`, `tox.ini`, `setup.cfg`)
  added or deleted anywhere, or changed so that what pytest reads from it differs, judged
  with pytest's own parsers on the file rebuilt from the base text (`pytest_config`);
  `setup.py` edits that mention entry points or pytest; `.pytest_cache`, `.coveragerc`;
* interpreter start-up: `sitecustomize.py`, `usercustomize.py`, `*.pth`, `pyvenv.cfg`,
  `.pythonrc*`, `.pdbrc`, byte code (`__pycache__`, `*.pyc`), package metadata
  (`*.egg-info`, `*.dist-info`: their entry points load pytest plugins), anything under
  `site-packages`, and any Python module that would be importable under a new top-level
  name (a new file in a directory that is not a package at the base commit: it could
  shadow `pytest` or the standard library through `sys.path[0]`);
* what Python can import that no one can read: archives and native code (`.zip`, `.egg`,
  `.whl`, `.pyz`, `.so`, `.pyd`...), every `GIT binary patch`, and text that carries a NUL
  or a zip / ELF signature (zipimport finds an archive by its trailing directory, in a file
  of any name);
* git: `.gitattributes`, `.gitmodules`, symlinks and submodules (mode 120000 / 160000);
* content: added Python lines that define pytest hooks, name pytest (a library that asks
  whether it runs under pytest special-cases the tests) or reach into its internals; a
  module that, compiled as Python compiles it, newly reaches for dynamic execution or
  interpreter internals, or does not compile (`content_rules`).

Paths outside the repository (absolute, `..`) or inside `.git` reject the whole patch:
git never writes them, so the text was forged. The grading container re-checks the kept
patch with its own (trusted) `git apply --numstat` (`evaluate.verify_paths`).
"""

from __future__ import annotations

import ast
import doctest
import posixpath
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from rollhub.envs.swe.grading.content_rules import new_constructs, new_constructs_in_fragments
from rollhub.envs.swe.grading.pytest_config import CONFIG_NAMES, config_change, is_config_name
from rollhub.envs.swe.tasks import is_test_path

#: modes a regular source file may have; symlinks (120000) and gitlinks (160000) are dropped
REGULAR_MODES = frozenset({"100644", "100755"})
#: file names whose only purpose is to configure the test run or the interpreter
_RUNNER_FILES = frozenset(
    {
        "conftest.py",
        ".coveragerc",
        "sitecustomize.py",
        "usercustomize.py",
        "pyvenv.cfg",
        ".pdbrc",
        ".pdbrc.py",
        ".gitattributes",
        ".gitmodules",
    }
)
#: configuration files judged by content: what pytest reads from them must not change
_JUDGED_CONFIG = frozenset(CONFIG_NAMES)
_STARTUP_SUFFIXES = (".pth", ".pyc", ".pyo")
#: what the import system loads without a readable source: archives (zipimport), native code
ARCHIVE_SUFFIXES = (".zip", ".egg", ".whl", ".pyz", ".pyzw", ".so", ".pyd", ".dll", ".dylib", ".jar", ".egg-link")
#: signatures of a zip member / central directory / end record and of an ELF object
_BINARY_MAGIC = ("PK\x03\x04", "PK\x01\x02", "PK\x05\x06", "PK\x06\x06", "PK\x07\x08", "\x7fELF", "\0")
#: source files whose code the content rules judge (`.pyw` is inert on Linux, judged all the same)
_SOURCE_SUFFIXES = (".py", ".pyw")
_METADATA_DIR = re.compile(r"\.(egg-info|dist-info|egg-link|egg)$", re.I)
_PYTHON_MODULE = re.compile(r"\.(py|pyw|pyc|pyo|pyd|so)$", re.I)
#: added Python lines that make a module a pytest plugin or reach into the runner
_RUNNER_CODE = re.compile(
    r"\bdef\s+pytest_\w+\s*\(|\bpytest_plugins\b|\b_?pytest\b|\bpluggy\b|\bPYTEST_\w+|"
    r"\bsitecustomize\b|\busercustomize\b|\bconftest\b|\bhookimpl\b|\bTestReport\b"
)
#: repositories whose library *is* the test runner: the content rule would drop every fix
RUNNER_REPOS = frozenset({"pytest-dev/pytest", "pytest-dev/pluggy"})

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_INDEX = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+(?: (\d{6}))?$")
_MODE_LINE = re.compile(r"^(old mode|new mode|deleted file mode|new file mode) (\d{6})$")
_BINARY_DATA = re.compile(r"^[A-Za-z][0-9A-Za-z!#$%&()*+;<=>?@^_`{|}~-]+$")
_BINARY_BLOCK = re.compile(r"^(literal|delta) \d+$")
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


class PatchRejected(ValueError):
    """The text is not a diff git would have written from this repository: nothing of it is graded."""


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[str]  # body lines, each with its ' ', '-', '+' or '\\' marker


@dataclass
class FileSection:
    """One `diff --git` section."""

    path: str
    text: str = ""
    old_exists: bool = True
    new_exists: bool = True
    modes: set[str] = field(default_factory=set)
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False

    @property
    def added_lines(self) -> list[str]:
        return [line[1:] for hunk in self.hunks for line in hunk.lines if line.startswith("+")]

    @property
    def removed_lines(self) -> list[str]:
        return [line[1:] for hunk in self.hunks for line in hunk.lines if line.startswith("-")]


def _unprintable(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def unquote_path(token: str) -> str:
    """A path as git prints it: plain, or C-quoted ("a/\\303\\244.py") when it has odd bytes.

    git quotes every name that holds a control character (tab, CR, newline, ...), a double
    quote or a backslash, writing them as C escapes (octal `\\NNN` for other bytes), so a raw
    control character in either form is a forgery; an escaped one is a legal file name."""
    if _unprintable(token):
        raise PatchRejected(f"unquoted control character in path {token!r}")
    if not token.startswith('"'):
        return token
    if len(token) < 2 or not token.endswith('"'):
        raise PatchRejected(f"badly quoted path {token!r}")
    body, out, i = token[1:-1], bytearray(), 0
    while i < len(body):
        char = body[i]
        if char == '"':
            raise PatchRejected(f"badly quoted path {token!r}")
        if char != "\\":
            out += char.encode("utf-8", "surrogateescape")
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _C_ESCAPES:
            out.append(_C_ESCAPES[nxt])
            i += 2
        elif re.fullmatch(r"[0-3][0-7]{2}", body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            raise PatchRejected(f"bad escape in path {token!r}")
    return out.decode("utf-8", "surrogateescape")


def _split_quoted(rest: str) -> tuple[str, str]:
    """First token of `rest` (quoted or up to the first space) and the remainder."""
    if rest.startswith('"'):
        i = 1
        while i < len(rest):
            if rest[i] == "\\":
                i += 2
                continue
            if rest[i] == '"':
                return rest[: i + 1], rest[i + 1 :]
            i += 1
        raise PatchRejected(f"unterminated quoted path in {rest!r}")
    head, _, tail = rest.partition(" ")
    return head, " " + tail if tail else ""


def _header_path(line: str) -> str:
    """The one path of `diff --git a/P b/P` (no renames: both names must be the same)."""
    rest = line[len("diff --git ") :]
    if '"' in rest:
        first, remainder = _split_quoted(rest)
        if not remainder.startswith(" "):
            raise PatchRejected(f"bad diff header {line!r}")
        old, new = unquote_path(first), unquote_path(remainder[1:])
    else:
        size = (len(rest) - 5) // 2
        old, new = unquote_path(rest[: 2 + size]), unquote_path(rest[3 + size :])
        if len(rest) != 5 + 2 * size or rest[2 + size : 3 + size] != " ":
            raise PatchRejected(f"bad diff header {line!r}")
    if not (old.startswith("a/") and new.startswith("b/")) or old[2:] != new[2:]:
        raise PatchRejected(f"diff header is not 'a/PATH b/PATH' for one path: {line!r}")
    return check_path(old[2:])


def _file_line(line: str, marker: str, prefix: str, path: str) -> bool:
    """`--- a/P` / `+++ b/P` (True) or `/dev/null` (False); anything else rejects."""
    if not line.startswith(marker):
        raise PatchRejected(f"expected '{marker}...', got {line[:80]!r}")
    name = line[len(marker) :]
    if name.endswith("\t"):  # git adds a tab after names with spaces, for GNU patch
        name = name[:-1]
    if name == "/dev/null":
        return False
    name = unquote_path(name)
    if name != prefix + path:
        raise PatchRejected(f"{marker.strip()} names {name!r}, the header names {path!r}")
    return True


def check_path(path: str) -> str:
    """The path if it stays inside the work tree and out of `.git`, else PatchRejected.

    Control characters other than NUL are legal in a git path (they arrive C-quoted, see
    `unquote_path`); NUL never is."""
    if not path or path.startswith("/") or "\0" in path:
        raise PatchRejected(f"path {path!r} is outside the repository or unprintable")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise PatchRejected(f"path {path!r} leaves the repository")
        if part.lower().rstrip(". ") in (".git", "git~1"):
            raise PatchRejected(f"path {path!r} is inside .git")
    return path


def parse_git_diff(text: str) -> list[FileSection]:
    """Sections of a `git diff --binary --no-renames` text; PatchRejected for anything else."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    sections: list[FileSection] = []
    i = 0
    while i < len(lines):
        start = i
        if not lines[i].startswith("diff --git "):
            raise PatchRejected(f"line {i + 1} is outside any file section: {lines[i][:80]!r}")
        section = FileSection(path=_header_path(lines[i]))
        i += 1
        while i < len(lines):
            line = lines[i]
            if mode := _MODE_LINE.match(line):
                kind, value = mode.groups()
                section.modes.add(value)
                if kind == "new file mode":
                    section.old_exists = False
                elif kind == "deleted file mode":
                    section.new_exists = False
            elif index := _INDEX.match(line):
                if index.group(1):
                    section.modes.add(index.group(1))
            else:
                break
            i += 1
        if i < len(lines) and lines[i].startswith("--- "):
            if i + 1 >= len(lines):
                raise PatchRejected(f"{section.path}: '---' without '+++'")
            old = _file_line(lines[i], "--- ", "a/", section.path)
            new = _file_line(lines[i + 1], "+++ ", "b/", section.path)
            if old != section.old_exists or new != section.new_exists:
                raise PatchRejected(f"{section.path}: /dev/null disagrees with the file modes")
            i += 2
            if i >= len(lines) or not lines[i].startswith("@@ "):
                raise PatchRejected(f"{section.path}: no hunk after the file names")
            while i < len(lines) and lines[i].startswith("@@ "):
                i = _parse_hunk(lines, i, section)
        elif i < len(lines) and lines[i] == "GIT binary patch":
            section.binary = True
            i = _parse_binary(lines, i + 1, section.path)
        if i < len(lines) and not lines[i].startswith("diff --git "):
            raise PatchRejected(f"{section.path}: unexpected line {i + 1}: {lines[i][:80]!r}")
        if not section.modes and not section.hunks and not section.binary:
            raise PatchRejected(f"{section.path}: a section that changes nothing")
        section.text = "\n".join(lines[start:i]) + "\n"
        if any(s.path == section.path for s in sections):
            raise PatchRejected(f"{section.path}: a path appears in two sections")
        sections.append(section)
    return sections


def _parse_hunk(lines: list[str], i: int, section: FileSection) -> int:
    match = _HUNK.match(lines[i])
    if not match:
        raise PatchRejected(f"{section.path}: bad hunk header {lines[i][:80]!r}")
    old_start, old_count, new_start, new_count = (
        int(match.group(1)),
        int(match.group(2) if match.group(2) is not None else 1),
        int(match.group(3)),
        int(match.group(4) if match.group(4) is not None else 1),
    )
    hunk = Hunk(old_start, old_count, new_start, new_count, [])
    i += 1
    old_left, new_left = old_count, new_count
    while old_left > 0 or new_left > 0:
        if i >= len(lines):
            raise PatchRejected(f"{section.path}: truncated hunk")
        line = lines[i]
        marker = line[:1]
        if marker in (" ", ""):  # git apply takes an empty line as an empty context line
            old_left, new_left = old_left - 1, new_left - 1
            line = " " + line[1:]
        elif marker == "-":
            old_left -= 1
        elif marker == "+":
            new_left -= 1
        elif marker != "\\":
            raise PatchRejected(f"{section.path}: bad hunk line {line[:80]!r}")
        if old_left < 0 or new_left < 0:
            raise PatchRejected(f"{section.path}: hunk longer than its header says")
        hunk.lines.append(line)
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        hunk.lines.append(lines[i])
        i += 1
    section.hunks.append(hunk)
    return i


def _parse_binary(lines: list[str], i: int, path: str) -> int:
    for block in range(2):
        if i >= len(lines) or not _BINARY_BLOCK.match(lines[i]):
            if block == 1:
                return i
            raise PatchRejected(f"{path}: bad binary patch")
        i += 1
        while i < len(lines) and lines[i] != "":
            if not _BINARY_DATA.match(lines[i]):
                raise PatchRejected(f"{path}: bad binary patch data")
            i += 1
        if i >= len(lines):
            raise PatchRejected(f"{path}: unterminated binary patch")
        i += 1  # the blank line after each block
    return i


def test_file_of(test_id: str) -> str:
    """`tests/test_a.py::TestX::test_y[p]` -> `tests/test_a.py`."""
    return test_id.split("::", 1)[0]


def is_doctest_id(test_id: str) -> bool:
    """Whether `test_id` is a doctest that `pytest --doctest-modules` collected from a Python
    module: `pkg/mod.py::pkg.mod.func` (the item is named by the module's dotted name, or a
    tail of it, plus the object's qualified name; `pkg/__init__.py::pkg` for a package)."""
    path, sep, item = test_id.partition("::")
    if not sep or "::" in item or not path.endswith(".py") or not item:
        return False
    module = path[: -len(".py")].split("/")
    if module[-1] == "__init__":
        module.pop()
    names = item.split(".")
    if not module or not names[0].isidentifier():
        return False
    return any(names[:k] == module[-k:] for k in range(1, min(len(names), len(module)) + 1))


def task_test_files(test_ids: Iterable[str]) -> set[str]:
    """The files of the task's test ids that are tests: a module that only hosts doctests of
    the library (`pkg/mod.py::pkg.mod.func`) is the code under test, and stays editable; a
    real test module (`is_test_path`) is protected however its tests are collected."""
    return {test_file_of(t) for t in test_ids if not is_doctest_id(t) or is_test_path(test_file_of(t))}


def doctest_hosts(test_ids: Iterable[str]) -> set[str]:
    """The modules whose doctests are among the task's tests (they hold code to fix, and tests)."""
    return {test_file_of(t) for t in test_ids if is_doctest_id(t) and not is_test_path(test_file_of(t))}


def doctest_examples(text: str) -> list[tuple[str, str, str]] | None:
    """Every doctest example (source, expected output, expected exception) in the docstrings of a
    module's text, sorted; None when the text does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    parser = doctest.DocTestParser()
    examples = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                try:
                    found = parser.get_examples(docstring)
                except ValueError:  # a malformed example: pytest would report it, count it as text
                    examples.append((docstring, "", ""))
                    continue
                examples += [(e.source, e.want, e.exc_msg or "") for e in found]
    return sorted(examples)


def reset_targets(eval_script: str) -> list[str]:
    """Files and folders an eval script resets with `git checkout <commit> -- PATHS` (its test files)."""
    targets: list[str] = []
    for match in re.finditer(r"^\s*git checkout [0-9a-fA-F]{7,64} -- ([^\n;&|<>]+)", eval_script, flags=re.M):
        try:
            words = shlex.split(match.group(1))
        except ValueError:
            continue
        targets += [w for w in words if not w.startswith("-") and w not in (".", "2")]
    return [posixpath.normpath(t) for t in targets if t and not t.startswith("/")]


def apply_hunks(base: str, section: FileSection) -> str | None:
    """The new text of a file from its base text and the section's hunks (None if they do not fit)."""
    if not section.new_exists:
        return ""
    old = base.split("\n") if section.old_exists else []
    out: list[str] = []
    cursor = 0
    for hunk in section.hunks:
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        if start < cursor or start > len(old):
            return None
        out += old[cursor:start]
        cursor = start
        for line in hunk.lines:
            if line.startswith("\\"):
                continue
            if line[:1] in (" ", "-"):
                if cursor >= len(old) or old[cursor] != line[1:]:
                    return None
                cursor += 1
            if line[:1] in (" ", "+"):
                out.append(line[1:])
    out += old[cursor:]
    return "\n".join(out)


def config_changes_runner(name: str, base: str | None, new: str | None) -> bool:
    """Whether turning pytest configuration file `name` from `base` into `new` (None: absent)
    changes what pytest reads (`pytest_config.config_change`)."""
    return bool(config_change(name, base, new))


@dataclass
class PatchPolicy:
    """What the grading run must not let a patch change."""

    #: the task's own test files (test patch, FAIL_TO_PASS / PASS_TO_PASS test modules)
    test_files: frozenset[str] = frozenset()
    #: every path of the base commit (None: unknown, the new-module rule is skipped)
    base_files: frozenset[str] | None = None
    #: base texts of the judged configuration files and doctest hosts that exist at base (path -> text)
    base_texts: dict[str, str] = field(default_factory=dict)
    #: modules whose doctests are tests of the task: editable, but their examples must not change
    doctest_modules: frozenset[str] = frozenset()
    #: drop Python sections whose added code reaches into the test runner or the interpreter
    content_rules: bool = True

    @staticmethod
    def needs_base_text(path: str) -> bool:
        """Whether judging a change of `path` needs its base text (configuration, Python source)."""
        return is_config_name(path) or path.lower().endswith(_SOURCE_SUFFIXES)

    @classmethod
    def for_task(
        cls,
        test_patch_files: Iterable[str],
        test_ids: Iterable[str],
        repo: str = "",
        base_files: Iterable[str] | None = None,
        base_texts: dict[str, str] | None = None,
        eval_script: str = "",
    ) -> PatchPolicy:
        files = {*test_patch_files, *task_test_files(test_ids), *reset_targets(eval_script)}
        return cls(
            test_files=frozenset(f for f in files if f),
            base_files=frozenset(base_files) if base_files is not None else None,
            base_texts=dict(base_texts or {}),
            doctest_modules=frozenset(doctest_hosts(test_ids)),
            content_rules=repo not in RUNNER_REPOS,
        )

    @property
    def test_dirs(self) -> frozenset[str]:
        return frozenset(posixpath.dirname(f) for f in self.test_files)

    def _is_package_dir(self, directory: str) -> bool:
        assert self.base_files is not None
        return posixpath.join(directory, "__init__.py") in self.base_files

    def why_dropped(self, section: FileSection) -> str:
        """Why the section must not reach the grading run ("" = keep it)."""
        path = section.path
        parts = path.split("/")
        name = parts[-1]
        lower = name.lower()
        if is_test_path(path):
            return "test file"
        if any(path == t or path.startswith(t.rstrip("/") + "/") for t in self.test_files):
            return "a test file of the task"
        if lower == "__init__.py" and posixpath.dirname(path) in self.test_dirs:
            return "__init__.py of a test package"
        if lower in _RUNNER_FILES:
            return f"{name} configures the test run, the interpreter or git"
        if lower.startswith(".pythonrc") or lower.endswith(_STARTUP_SUFFIXES):
            return f"{name} runs at interpreter start-up (byte code / .pth)"
        if lower.endswith(ARCHIVE_SUFFIXES):
            return f"{name}: an archive or native module Python could import"
        for part in parts[:-1]:
            low = part.lower()
            if low in ("__pycache__", ".pytest_cache", "site-packages", "dist-packages"):
                return f"under {part}/"
            if _METADATA_DIR.search(low):
                return f"package metadata ({part}): its entry points load pytest plugins"
        if _METADATA_DIR.search(lower):
            return f"package metadata ({name})"
        modes = section.modes - REGULAR_MODES
        if modes:
            return f"not a regular file (mode {', '.join(sorted(modes))}: symlink or submodule)"
        if lower in _JUDGED_CONFIG:
            return self._judge_config(section)
        if section.binary:
            return "a binary file (GIT binary patch): Python could import it, no one can review it"
        for line in section.added_lines:
            magic = next((m for m in _BINARY_MAGIC if m in line), None)
            if magic is not None:
                return f"text that carries {magic!r}: a zip archive or native object Python could import"
        if lower == "setup.py" and any(
            re.search(r"entry_points|pytest|setup_requires", line)
            for line in section.added_lines + section.removed_lines
        ):
            return "setup.py: entry points / pytest settings changed"
        if _PYTHON_MODULE.search(lower):
            if self.base_files is not None and path not in self.base_files:
                ancestors = [posixpath.join(*parts[:k]) for k in range(1, len(parts))]
                if not any(self._is_package_dir(a) for a in ancestors):
                    return "a new top-level module (could shadow pytest or the standard library)"
            if self.content_rules and not self._base_known(section):  # else the AST rule judges it
                for line in section.added_lines:
                    if _RUNNER_CODE.search(line):
                        return f"code that hooks into the test runner: {line.strip()[:80]!r}"
            if self.doctest_modules:
                why = self._judge_doctests(section)
                if why:
                    return why
            if self.content_rules and lower.endswith(_SOURCE_SUFFIXES):
                why = self._judge_code(section)
                if why:
                    return why
        return ""

    def _base_known(self, section: FileSection) -> bool:
        """Whether the whole module can be judged as Python compiles it (a new file, or a base text
        at hand): then pytest's names are counted in code, not in comments and docstrings."""
        return not section.old_exists or section.path in self.base_texts

    def _judge_code(self, section: FileSection) -> str:
        """New uses of dynamic execution or interpreter internals, on the whole module as Python
        compiles it (the base text from the policy; a new file's base is empty), or on the
        hunks alone when the base text is unknown."""
        if not section.new_exists:
            return ""
        base = self.base_texts.get(section.path) if section.old_exists else ""
        if base is None:
            old_lines = [line[1:] for hunk in section.hunks for line in hunk.lines if line[:1] in (" ", "-")]
            new_lines = [line[1:] for hunk in section.hunks for line in hunk.lines if line[:1] in (" ", "+")]
            return new_constructs_in_fragments(old_lines, new_lines)
        new = apply_hunks(base, section)
        if new is None:
            return "hunks that do not fit the base text"
        return new_constructs(base, new)

    def _judge_doctests(self, section: FileSection) -> str:
        """The task's doctests are tests: a patch may fix the code around them, never edit the
        examples or their expected output, nor reach docstrings at run time."""
        for line in section.added_lines:
            if "__doc__" in line or "__test__" in line:
                return f"code that rewrites docstrings, which hold tests of the task: {line.strip()[:80]!r}"
        if section.path not in self.doctest_modules:
            return ""
        base = self.base_texts.get(section.path) if section.old_exists else None
        if base is None:
            return "holds doctests of the task, base text unknown: cannot judge the change"
        new = apply_hunks(base, section)
        if new is None or not section.new_exists:
            return "holds doctests of the task: removed, or hunks that do not fit"
        if doctest_examples(base) != doctest_examples(new):
            return "changes doctest examples, which are tests of the task"
        return ""

    def _judge_config(self, section: FileSection) -> str:
        name = section.path.rsplit("/", 1)[-1].lower()
        if section.binary:
            return f"{name} as a binary patch"
        base = self.base_texts.get(section.path) if section.old_exists else None
        if section.old_exists and base is None:
            return f"{name}: base text unknown, cannot judge the change"
        new = apply_hunks(base or "", section) if section.new_exists else None
        if section.new_exists and new is None:
            return f"{name}: hunks that do not fit the base text"
        why = config_change(name, base, new)
        return f"pytest configuration: {why}" if why else ""


@dataclass
class SanitizedPatch:
    patch: str  # what goes to the grading container
    kept: list[str] = field(default_factory=list)  # paths kept
    dropped: dict[str, str] = field(default_factory=dict)  # path -> why
    rejected: str = ""  # non-empty: nothing is graded, the reward is 0

    def info(self) -> dict[str, object]:
        info: dict[str, object] = {"dropped_files": dict(self.dropped)}
        if self.rejected:
            info["patch_rejected"] = self.rejected
        return info


def sanitize_patch(text: str, policy: PatchPolicy) -> SanitizedPatch:
    """Parse the agent's diff and keep only the sections the policy allows."""
    if not text.strip():
        return SanitizedPatch("")
    try:
        sections = parse_git_diff(text)
    except PatchRejected as exc:
        return SanitizedPatch("", rejected=str(exc))
    result = SanitizedPatch("")
    kept = []
    for section in sections:
        reason = policy.why_dropped(section)
        if reason:
            result.dropped[section.path] = reason
        else:
            kept.append(section)
            result.kept.append(section.path)
    result.patch = "".join(s.text for s in kept)
    return result
