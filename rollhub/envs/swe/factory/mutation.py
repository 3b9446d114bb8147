"""Procedural bugs for the task factory: small AST-located edits to a package's source.

Each mutation edits the original bytes at AST positions (col offsets are UTF-8 byte
offsets), so the rest of the file -- comments, formatting -- is untouched and the bug
patch is a minimal diff. At most one site per operator family per function (functions of
3+ lines), chosen by a generator seeded from the site, so the set is reproducible.

Families: op_flip (+ -, * //, & |, << >>), cmp_flip (< >=, == !=, in / not in, is / is
not), bool_flip (and / or, True / False), const_off_by_one (n -> n+1), remove_if (drop an
if-statement without else), swap_if_else (exchange the branches), remove_assign (drop an
assignment that is not the last statement of its block).
"""

from __future__ import annotations

import ast
import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

FAMILIES = ("op_flip", "cmp_flip", "bool_flip", "const_off_by_one", "remove_if", "swap_if_else", "remove_assign")

_BINOP_SWAP: dict[type, tuple[str, str]] = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "//"),
    ast.FloorDiv: ("//", "*"),
    ast.Mod: ("%", "//"),
    ast.BitAnd: ("&", "|"),
    ast.BitOr: ("|", "&"),
    ast.LShift: ("<<", ">>"),
    ast.RShift: (">>", "<<"),
}
_CMP_SWAP: dict[type, tuple[str, str]] = {
    ast.Lt: ("<", ">="),
    ast.GtE: (">=", "<"),
    ast.Gt: (">", "<="),
    ast.LtE: ("<=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}
_BOOL_SWAP: dict[type, tuple[str, str]] = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


@dataclass(frozen=True)
class Mutation:
    path: str
    family: str
    function: str
    lineno: int
    new_source: str

    @property
    def key(self) -> str:
        """Stable id of the site (file, function, family)."""
        return f"{self.path}:{self.function}:{self.family}"


class _Source:
    """The file as bytes plus (line, col) -> byte offset."""

    def __init__(self, text: str):
        self.data = text.encode("utf-8")
        self.line_starts = [0]
        for i, byte in enumerate(self.data):
            if byte == 0x0A:
                self.line_starts.append(i + 1)

    def offset(self, lineno: int, col: int) -> int:
        return self.line_starts[lineno - 1] + col

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def line_span(self, first_line: int, last_line: int) -> tuple[int, int]:
        """Byte span of whole lines first..last (inclusive, with the newline)."""
        end = self.line_starts[last_line] if last_line < len(self.line_starts) else len(self.data)
        return self.line_starts[first_line - 1], end

    def replace(self, start: int, end: int, new: bytes) -> str:
        return (self.data[:start] + new + self.data[end:]).decode("utf-8")


def _token_between(src: _Source, start: int, end: int, token: str) -> tuple[int, int] | None:
    """Byte span of `token` in src[start:end] when the gap holds only it (plus spaces/brackets)."""
    gap = src.data[start:end].decode("utf-8", errors="replace")
    stripped = gap.replace("(", " ").replace(")", " ").replace("\\\n", " ")
    if "#" in stripped or " ".join(stripped.split()) != token:
        return None
    words = token.split()
    first = gap.find(words[0])
    last = gap.find(words[-1], first + len(words[0]) if len(words) > 1 else first)
    head = len(gap[:first].encode("utf-8"))
    tail = len(gap[: last + len(words[-1])].encode("utf-8"))
    return start + head, start + tail


def _whole_lines(src: _Source, nodes: list[ast.stmt]) -> tuple[int, int] | None:
    """Span of the lines holding `nodes` if nothing else shares those lines."""
    first, last = nodes[0], nodes[-1]
    line_start, _ = src.line_span(first.lineno, first.lineno)
    if src.data[line_start : src.start(first)].strip():
        return None
    _, line_end = src.line_span(last.end_lineno, last.end_lineno)  # type: ignore[arg-type]
    if src.data[src.end(last) : line_end].strip() not in (b"", b";"):
        return None
    return line_start, line_end


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body, not descending into nested functions/classes/f-strings."""
    stack: list[ast.AST] = list(getattr(func, "body", []))
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.JoinedStr)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _blocks(func: ast.AST) -> Iterator[list[ast.stmt]]:
    for node in [func, *_own_nodes(func)]:  # the function itself gives its body
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _operator_site(src: _Source, left: ast.AST, right: ast.AST, swap: tuple[str, str]) -> tuple[int, int, bytes] | None:
    """Replace the operator token between two operands (old -> new), if it is plainly there."""
    span = _token_between(src, src.end(left), src.start(right), swap[0])
    return None if span is None else (*span, swap[1].encode())


def _op_flip(src: _Source, func: ast.AST) -> list[bytes | tuple[int, int, bytes]]:
    sites = []
    for node in _own_nodes(func):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                continue  # string concatenation / %-formatting: not a logic bug
            if site := _operator_site(src, node.left, node.right, _BINOP_SWAP[type(node.op)]):
                sites.append(site)
    return sites


def _cmp_flip(src: _Source, func: ast.AST) -> list:
    sites = []
    for node in _own_nodes(func):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
            if site := _operator_site(src, node.left, node.comparators[0], _CMP_SWAP[type(node.ops[0])]):
                sites.append(site)
    return sites


def _bool_flip(src: _Source, func: ast.AST) -> list:
    sites = []
    for node in _own_nodes(func):
        if isinstance(node, ast.BoolOp) and len(node.values) == 2:
            if site := _operator_site(src, node.values[0], node.values[1], _BOOL_SWAP[type(node.op)]):
                sites.append(site)
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            old = str(node.value).encode()
            if src.data[src.start(node) : src.end(node)] == old:
                sites.append((src.start(node), src.end(node), str(not node.value).encode()))
    return sites


def _const_off_by_one(src: _Source, func: ast.AST) -> list:
    sites = []
    for node in _own_nodes(func):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            text = src.data[src.start(node) : src.end(node)]
            if text == str(node.value).encode():
                sites.append((src.start(node), src.end(node), str(node.value + 1).encode()))
    return sites


def _remove_if(src: _Source, func: ast.AST) -> list:
    sites = []
    for block in _blocks(func):
        if len(block) < 2:
            continue
        for stmt in block:
            if isinstance(stmt, ast.If) and not stmt.orelse and (span := _whole_lines(src, [stmt])):
                sites.append((*span, b""))
    return sites


def _swap_if_else(src: _Source, func: ast.AST) -> list:
    sites = []
    for node in _own_nodes(func):
        if not (isinstance(node, ast.If) and node.orelse and node.body[0].lineno > node.lineno):
            continue
        else_first = node.orelse[0]
        line_start, _ = src.line_span(else_first.lineno, else_first.lineno)
        if src.data[line_start : src.start(else_first)].strip():
            continue  # `else: x` on one line
        if isinstance(else_first, ast.If) and src.data[src.start(else_first) :].startswith(b"elif"):
            continue
        body_span = _whole_lines(src, node.body)
        else_span = _whole_lines(src, node.orelse)
        if not body_span or not else_span:
            continue
        between = src.data[body_span[1] : else_span[0]]
        body, orelse = src.data[body_span[0] : body_span[1]], src.data[else_span[0] : else_span[1]]
        if body.strip() == orelse.strip():
            continue
        sites.append((body_span[0], else_span[1], orelse + between + body))
    return sites


def _remove_assign(src: _Source, func: ast.AST) -> list:
    sites = []
    for block in _blocks(func):
        for stmt in block[:-1]:
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and (span := _whole_lines(src, [stmt])):
                sites.append((*span, b""))
    return sites


_FINDERS: dict[str, Callable[[_Source, ast.AST], list]] = {
    "op_flip": _op_flip,
    "cmp_flip": _cmp_flip,
    "bool_flip": _bool_flip,
    "const_off_by_one": _const_off_by_one,
    "remove_if": _remove_if,
    "swap_if_else": _swap_if_else,
    "remove_assign": _remove_assign,
}


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")

    yield from visit(tree, "")


def find_mutations(
    path: str, text: str, families: tuple[str, ...] = FAMILIES, min_function_lines: int = 3
) -> list[Mutation]:
    """All mutants of one file: at most one per (function, family), each re-parsed."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    src = _Source(text)
    original_dump = ast.dump(tree)
    mutations = []
    for qualname, func in _functions(tree):
        if func.end_lineno - func.lineno + 1 < min_function_lines:  # type: ignore[attr-defined]
            continue
        for family in families:
            sites = _FINDERS[family](src, func)
            seed = int(hashlib.sha256(f"{path}:{qualname}:{family}".encode()).hexdigest()[:16], 16)
            random.Random(seed).shuffle(sites)
            for start, end, new in sites:
                candidate = src.replace(start, end, new)
                try:
                    changed = ast.dump(ast.parse(candidate)) != original_dump
                except SyntaxError:
                    continue
                if changed:
                    lineno = src.data[:start].count(b"\n") + 1
                    mutations.append(Mutation(path, family, qualname, lineno, candidate))
                    break
    return mutations
