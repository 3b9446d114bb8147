"""`rollhub config show [RECIPE]`: every knob of a run, its value, its default and one line of doc.

The knobs are found by walking the `RunConfig` dataclass tree at run time, so a section that
moves to another module, or a knob that is added or deleted, shows up without touching this
file. The doc of a knob is the comment its dataclass field carries in the source (the comment
on the field's own lines, else the comment lines right above it): the source stays the one
place a knob is documented, and a knob without a comment is caught by a test.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import json
import re
import tokenize
from pathlib import Path
from typing import Any

#: comment lines that only group fields ("--- backend: server ---") document none of them
_GROUP_HEADER = re.compile(r"^-{2,}.*-{2,}$")


def register(subparsers: argparse._SubParsersAction) -> None:
    config = subparsers.add_parser("config", help="the knobs of a run: values, defaults and what each does")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION")
    show = config_sub.add_parser(
        "show", help="every knob (section.key) with its value, default and one-line doc; * = set by the recipe"
    )
    show.add_argument("config", nargs="?", help="recipe YAML, e.g. configs/sokoban_tiny.yaml (default: no recipe)")
    show.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a value first"
    )
    show.add_argument("--only", metavar="PREFIX", default=None, help="knobs whose name starts with PREFIX, e.g. loss.")
    show.add_argument("--full", action="store_true", help="the whole doc comment of each knob, not its first words")
    show.add_argument("--json", action="store_true", help="one JSON object per knob, with the whole doc comment")
    show.set_defaults(func=_cmd_show)
    config.set_defaults(func=lambda args: (config.print_help(), 2)[1])


@dataclasses.dataclass
class Knob:
    key: str  # dotted name, as in a recipe or --set
    value: Any
    default: Any
    set: bool  # named by the recipe or a --set
    doc: str  # the field's whole comment, one line

    def summary(self, limit: int = 100) -> str:
        """The doc's first sentence, cut at a word near `limit` characters: a table row's worth."""
        match = re.search(r"(?<=[a-z0-9)\]`'])\. (?=[A-Z(`])", self.doc)
        text = self.doc[: match.start() + 1] if match else self.doc
        if len(text) <= limit:
            return text
        return text[:limit].rsplit(" ", 1)[0].rstrip(",;:(") + " …"


def knobs(config: Any = None, set_keys: set[str] | None = None) -> list[Knob]:
    """Every leaf field of a `RunConfig` (sections are walked, dicts and lists are one knob)."""
    from rollhub.trainer.config import RunConfig

    config = config if config is not None else RunConfig()
    set_keys = set_keys or set()
    found: list[Knob] = []

    def walk(value: Any, default: Any, prefix: str) -> None:
        for spec in dataclasses.fields(value):
            key = prefix + spec.name
            child, child_default = getattr(value, spec.name), getattr(default, spec.name)
            if dataclasses.is_dataclass(child) and not isinstance(child, type):
                walk(child, child_default, key + ".")
                continue
            is_set = key in set_keys or any(k.startswith(key + ".") for k in set_keys)
            found.append(Knob(key, child, child_default, is_set, field_doc(type(value), spec.name)))

    walk(config, RunConfig(), "")
    return found


def field_doc(cls: type, name: str) -> str:
    """The comment of field `name` of dataclass `cls` (inherited fields: the class that declares it)."""
    for klass in cls.__mro__:
        docs = _class_field_docs(klass)
        if name in docs:
            return docs[name]
    return ""


@functools.cache
def _class_field_docs(cls: type) -> dict[str, str]:
    try:
        path = inspect.getsourcefile(cls)
        source = Path(path).read_text() if path else ""
    except (TypeError, OSError):
        return {}
    return _module_field_docs(source).get(cls.__qualname__, {})


@functools.cache
def _module_field_docs(source: str) -> dict[str, dict[str, str]]:
    """{class qualname: {field: comment}} for every class of a module's source."""
    comments: dict[int, str] = {}  # line -> comment text
    code_lines: set[int] = set()  # lines holding code (a comment there is an inline one)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    result: dict[str, dict[str, str]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, ast.ClassDef):
                continue
            qualname = prefix + node.name
            docs: dict[str, str] = {}
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    docs[statement.target.id] = _statement_doc(statement, comments, code_lines)
            result[qualname] = docs
            visit(node.body, qualname + ".")

    visit(ast.parse(source).body, "")
    return result


def _statement_doc(statement: ast.stmt, comments: dict[int, str], code_lines: set[int]) -> str:
    inline = [
        comments[line]
        for line in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
        if line in comments
    ]
    if inline:
        return _one_line(inline)
    above: list[str] = []
    line = statement.lineno - 1
    while line in comments and line not in code_lines:  # the block of comment-only lines right above
        above.append(comments[line])
        line -= 1
    return _one_line([text for text in reversed(above) if not _GROUP_HEADER.match(text)])


def _one_line(parts: list[str]) -> str:
    return " ".join(" ".join(parts).split())


def _show(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value) if value == "" or value.strip() != value else value
    return json.dumps(value, default=str)


def _cmd_show(args: argparse.Namespace) -> int:
    import yaml

    from rollhub.core.config import apply_overrides, load_config
    from rollhub.core.errors import UserError
    from rollhub.trainer.config import RunConfig

    config = load_config(RunConfig, args.config, list(args.overrides))
    raw: dict[str, Any] = {}
    if args.config:
        raw = yaml.safe_load(Path(args.config).read_text()) or {}
    set_keys = set(_flat_keys(apply_overrides(raw, list(args.overrides))))
    rows = knobs(config, set_keys)
    if args.only:
        rows = [row for row in rows if row.key.startswith(args.only)]
        if not rows:
            raise UserError(f"no knob starts with {args.only!r}; try 'rollhub config show' for the list")
    if args.json:
        for row in rows:
            print(json.dumps(dataclasses.asdict(row), default=str))
        return 0
    print(f"# {args.config or 'no recipe: the defaults'}; * = set by the recipe or --set; --full for whole docs")
    table = [
        (
            "*" if row.set else " ",
            row.key,
            _clip(_show(row.value)),
            _clip(_show(row.default)),
            row.doc if args.full else row.summary(),
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in table) for i in range(1, 4)]
    print(f"  {'knob':<{widths[0]}}  {'value':<{widths[1]}}  {'default':<{widths[2]}}  doc")
    for mark, key, value, default, doc in table:
        print(f"{mark} {key:<{widths[0]}}  {value:<{widths[1]}}  {default:<{widths[2]}}  {doc}".rstrip())
    return 0


def _clip(text: str, limit: int = 26) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _flat_keys(data: Any, prefix: str = "") -> list[str]:
    """Dotted keys of a nested mapping's leaves (a mapping that is a knob's value counts as leaves too)."""
    if not isinstance(data, dict):
        return [prefix[:-1]] if prefix else []
    keys = [prefix[:-1]] if prefix else []
    for key, value in data.items():
        keys += _flat_keys(value, f"{prefix}{key}.")
    return keys


__all__ = ["Knob", "field_doc", "knobs", "register"]
