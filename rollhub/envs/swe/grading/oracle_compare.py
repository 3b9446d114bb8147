"""When the candidate's answer to one hidden input agrees with the gold's.

The harness (rollhub.envs.swe.grading.oracle) reports, per input, `[answer, arguments after, printed]`
as texts. Comparing the texts byte for byte refuses honest fixes whose values are equal but
print differently, so a repr that parses as a Python expression is compared by value shape:

- a set (and `frozenset({...})`) is compared as a set: its repr order depends on how it was built;
- a plain dict is compared as a mapping (insertion order is not part of a dict's equality);
  an `OrderedDict(...)` keeps its order (its equality does);
- `-0.0` equals `0.0` (they are equal values; a fix computing `-x` for zero is no less a fix);
- the types of constants stay strict: `1` vs `1.0` and `True` vs `1` disagree (a caller can
  tell them apart, `repr`/`json` print them differently);
- anything else (a custom object's repr, a clipped text) is compared as text.

The arguments after the call are part of the answer where the gold returns: a function that
changes its argument in place (or leaves it alone) is observed so by every caller, so a fix that
copies where the original mutates, or mutates where it copies, disagrees. Printed text must match.

Where the gold raises, the candidate must raise an exception of the gold's class or of a
subclass by single inheritance (every `except Gold:` still catches it; a class with several
bases is accepted only as itself, so one exception made to match every handler cannot pass);
a broader class (`ValueError` for the gold's `JSONDecodeError`) or an unrelated one (`ValueError`
for `TypeError`) disagrees. The arguments' state after a raise is not compared (an honest fix
may fail part-way through another way).
"""

from __future__ import annotations

import ast
from typing import Any

#: the harness's answer to a call that ran out of its time budget
TIMEOUT = "timeout"
_LAZY = "return:('iterator', "


def canonical(text: str) -> Any:
    """A hashable value-shape of a repr text: equal for equal values printed differently."""
    try:
        tree = ast.parse(text, mode="eval")
        return _canon(tree.body, ordered_dict=False)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ("text", text)


def _canon(node: ast.AST, ordered_dict: bool) -> Any:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, float) and value == 0.0:
            value = 0.0  # -0.0 and 0.0
        return ("const", type(value).__name__, value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = node.operand
        if isinstance(inner, ast.Constant) and type(inner.value) in (int, float, complex):
            value = -inner.value if isinstance(node.op, ast.USub) else inner.value
            return _canon(ast.Constant(value), ordered_dict)
    if isinstance(node, (ast.List, ast.Tuple)):
        return (type(node).__name__, tuple(_canon(e, False) for e in node.elts))
    if isinstance(node, ast.Set):
        return ("set", frozenset(_canon(e, False) for e in node.elts))
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        pairs = [(_canon(k, False), _canon(v, False)) for k, v in zip(node.keys, node.values)]
        return ("odict", tuple(pairs)) if ordered_dict else ("dict", frozenset(pairs))
    if isinstance(node, ast.Call):
        func = _canon(node.func, False)
        keeps_order = isinstance(node.func, ast.Name) and node.func.id == "OrderedDict"
        args = tuple(_canon(a, keeps_order) for a in node.args)
        kwargs = tuple((k.arg, _canon(k.value, False)) for k in node.keywords)
        return ("call", func, args, kwargs)
    if isinstance(node, ast.Name):
        return ("name", node.id)
    if isinstance(node, ast.Attribute):
        return ("attr", _canon(node.value, False), node.attr)
    return ("node", ast.dump(node))


def _eager(answer: str) -> str:
    """A lazy result as the list it yields: a fix that returns a list where the original returned
    a generator or map (or the reverse) answers the same items, and is no less a fix."""
    if answer.startswith(_LAZY) and answer.endswith(")"):
        return "return:" + answer[len(_LAZY) : -1]
    return answer


def same_value(gold: str, candidate: str) -> bool:
    """Two repr texts of equal values (exact text first: the common case costs no parse)."""
    return gold == candidate or canonical(gold) == canonical(candidate)


def exception_chain(answer: str) -> list[str]:
    """`raise:a.B<a.A<builtins.ValueError` -> the class and the ancestors the harness listed."""
    return answer[len("raise:") :].split("<")


def same_exception(gold: str, candidate: str) -> bool:
    """The candidate raised the gold's class or a single-inheritance subclass of it."""
    if not candidate.startswith("raise:") or candidate.startswith("raise:SystemExit:"):
        return False
    return exception_chain(gold)[0] in exception_chain(candidate)


def same_answer(gold: list[str], candidate: list[str]) -> bool:
    """Whether the candidate answered one input as the gold did (see the module's docstring)."""
    if candidate[0] == TIMEOUT or candidate[2] != gold[2]:
        return False
    if gold[0].startswith("raise:") and not gold[0].startswith("raise:SystemExit:"):
        return same_exception(gold[0], candidate[0])
    prefix = "return:" if gold[0].startswith("return:") else "raise:SystemExit:"
    if not candidate[0].startswith(prefix):
        return False
    values = same_value(_eager(gold[0])[len(prefix) :], _eager(candidate[0])[len(prefix) :])
    return values and same_value(gold[1], candidate[1])
