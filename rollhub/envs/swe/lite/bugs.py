"""Bug templates of SWE-lite: one AST edit of a generated function, named by what it does.

A template is a kind and its variant (`comparison:Lt->GtE`, `off_by_one:+1`,
`swapped_args:call`), so the held-out split can keep whole templates from training. The
kinds are the ones small models meet first: a negated comparison, an off-by-one bound
(strict vs non-strict), a wrong arithmetic operator, an integer off by one, a wrong
constant, swapped call arguments, a dropped negation, a wrong return value, and `and`/`or`.

The generated functions are normalised by `ast.unparse`, so a mutant re-unparsed differs
from the original on the edited line only: the bug (and gold) patch is one hunk. The
operator pairs are those of the package factory's `mutation.py` where they overlap.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_CMP = {"Lt": ast.Lt, "LtE": ast.LtE, "Gt": ast.Gt, "GtE": ast.GtE, "Eq": ast.Eq, "NotEq": ast.NotEq}
_CMP.update({"In": ast.In, "NotIn": ast.NotIn})
#: comparison -> its negation (the branch taken the other way)
COMPARISON = {"Lt": "GtE", "GtE": "Lt", "Gt": "LtE", "LtE": "Gt", "Eq": "NotEq", "NotEq": "Eq", "In": "NotIn"}
#: strict <-> non-strict (an off-by-one bound)
BOUNDARY = {"Lt": "LtE", "LtE": "Lt", "Gt": "GtE", "GtE": "Gt"}
_BIN = {"Add": ast.Add, "Sub": ast.Sub, "Mult": ast.Mult, "FloorDiv": ast.FloorDiv, "Mod": ast.Mod}
ARITHMETIC = {"Add": "Sub", "Sub": "Add", "Mult": "Add", "FloorDiv": "Mult", "Mod": "FloorDiv"}
_OTHER_CHAR = {
    "*": "#",
    "#": "*",
    "_": "-",
    "0": " ",
    ".": ",",
    "*.": "#",
    "...": "..",
    "~": "-",
    "..": "...",
    "'": '"',
}
_OTHER_CHAR.update({" ": "_", ",": ";", ";": ",", "-": "_", "/": "\\", "aeiou": "aeio", ".,;:!?": ".,;:!"})


def all_templates() -> list[str]:
    """Every template id, in a fixed order."""
    return (
        [f"comparison:{a}->{b}" for a, b in COMPARISON.items()]
        + [f"boundary:{a}->{b}" for a, b in BOUNDARY.items()]
        + [f"arithmetic:{a}->{b}" for a, b in ARITHMETIC.items()]
        + ["off_by_one:+1", "off_by_one:-1"]
        + ["wrong_constant:string", "wrong_constant:zero"]
        + ["swapped_args:call", "swapped_args:slice"]
        + ["dropped_negation:not", "dropped_negation:minus"]
        + ["wrong_return:argument", "wrong_return:none", "wrong_return:bool"]
        + ["logic:and->or", "logic:or->and"]
    )


def kind_of(template: str) -> str:
    return template.split(":", 1)[0]


@dataclass(frozen=True)
class Bug:
    template: str
    #: the mutated function's source (normalised)
    source: str
    lineno: int


def _sites(func: ast.FunctionDef, template: str) -> Iterator[tuple[ast.AST, Callable[[ast.AST], ast.AST | None]]]:
    """(node, edit) pairs: `edit` changes the node in place or returns its replacement."""
    kind, _, variant = template.partition(":")
    params = [a.arg for a in func.args.args]
    for node in ast.walk(func):
        if kind in ("comparison", "boundary") and isinstance(node, ast.Compare) and len(node.ops) == 1:
            old, new = variant.split("->")
            if isinstance(node.ops[0], _CMP[old]):
                yield node, lambda n, new=new: setattr(n, "ops", [_CMP[new]()])
        elif kind == "arithmetic" and isinstance(node, (ast.BinOp, ast.AugAssign)):
            old, new = variant.split("->")
            if isinstance(node.op, _BIN[old]):
                yield node, lambda n, new=new: setattr(n, "op", _BIN[new]())
        elif kind == "off_by_one" and _is_int(node):
            delta = 1 if variant == "+1" else -1
            yield node, lambda n, d=delta: setattr(n, "value", n.value + d)
        elif template == "wrong_constant:string" and isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in _OTHER_CHAR and node is not _docstring(func):
                yield node, lambda n: setattr(n, "value", _OTHER_CHAR[n.value])
        elif template == "wrong_constant:zero" and _is_int(node) and node.value not in (0, 1):
            yield node, lambda n: setattr(n, "value", 0)
        elif template == "swapped_args:call" and isinstance(node, ast.Call) and len(node.args) >= 2:
            yield node, lambda n: setattr(n, "args", [n.args[1], n.args[0], *n.args[2:]])
        elif template == "swapped_args:slice" and isinstance(node, ast.Slice) and node.lower and node.upper:
            yield node, lambda n: (setattr(n, "lower", n.upper), setattr(n, "upper", n.lower))
        elif kind == "dropped_negation" and isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not if variant == "not" else ast.USub) and not _is_int(node.operand):
                yield node, lambda n: n.operand
        elif template == "wrong_return:argument" and isinstance(node, ast.Return) and params:
            if isinstance(node.value, ast.Name) and node.value.id not in params:
                yield node, lambda n: setattr(n, "value", ast.Name(params[0], ast.Load()))
        elif template == "wrong_return:none" and isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                yield node, lambda n: setattr(n, "value", ast.Constant(None))
        elif template == "wrong_return:bool" and isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, bool):
                yield node, lambda n: setattr(n, "value", ast.Constant(not n.value.value))
        elif kind == "logic" and isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And if variant == "and->or" else ast.Or):
                yield node, lambda n: setattr(n, "op", ast.Or() if isinstance(n.op, ast.And) else ast.And())


def _is_int(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return False  # -1 is handled through its operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _docstring(func: ast.FunctionDef) -> ast.AST | None:
    first = func.body[0] if func.body else None
    return first.value if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else None


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, replacement: ast.AST):
        self.target, self.replacement = target, replacement

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if node is self.target:
            return self.replacement
        return super().generic_visit(node)


def find_bugs(source: str, templates: list[str]) -> list[Bug]:
    """Every mutant of the single function in `source` under `templates`: one per site, each
    unparsed and different from the original."""
    original = ast.unparse(ast.parse(source))
    bugs = []
    for template in templates:
        count = sum(1 for _ in _sites(ast.parse(source).body[0], template))  # type: ignore[arg-type]
        for index in range(count):
            tree = ast.parse(source)
            func = tree.body[0]
            node, edit = list(_sites(func, template))[index]  # type: ignore[arg-type]
            lineno = getattr(node, "lineno", func.lineno)
            replacement = edit(node)
            if isinstance(replacement, ast.AST):
                tree = _Replace(node, copy.deepcopy(replacement)).visit(tree)
            text = ast.unparse(ast.fix_missing_locations(tree))
            if text != original:
                bugs.append(Bug(template, text + "\n", lineno))
    return bugs
