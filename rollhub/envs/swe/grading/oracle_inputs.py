"""Hidden inputs of the differential oracle, made on the host from the task's tests.

A factory task is a mutant of one function whose correct version is known. The visible tests
call it on a few inputs; a patch can answer exactly those from a table and keep the bug. The
oracle calls the candidate's function and the original one on more inputs than the tests
show and compares what they return (rollhub.envs.swe.grading.oracle). The inputs come from:

- the tests' call sites of the function whose arguments are literals (and doctest examples);
- the function's signature (arity, annotations, defaults), filled from the literals the tests
  use (a parametrised test's table feeds the pool even when its call site names a variable);
- small derivations of those literals (n +- 1, boundary numbers, a string reversed, emptied or
  upper-cased, a list reversed, shortened or emptied, a dict with a key dropped, added or its
  order reversed, None where a parameter defaults to None, keyword-only parameters moved), so
  the oracle also asks what the tests never ask.

Each input is also marked *visible* or not (`is_visible`): visible when it is one of the tests'
literal calls or doctest examples, or when every argument equals a literal the tests or the
doctests show (a parametrised table feeds the tests through a variable). A patch can answer
visible inputs from a table and keep the bug, so only a disagreement of the bug on an input
that is not visible makes the oracle worth trusting (`oracle.GoldAnswers.exposing_hidden`).

Everything is seeded by the task's id: the same task always gets the same inputs, and they are
computed at grading time on the host, after the episode: the agent never sees them, though the
graded module can read them while the harness runs, so the oracle rests on the gold answers
being unknown to the patch, not on the inputs being secret.
"""

from __future__ import annotations

import ast
import doctest
import hashlib
import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

#: literals longer than this (as repr) are not used as inputs
MAX_LITERAL_CHARS = 300
_SIMPLE_TYPES = {"int": int, "str": str, "float": float, "bool": bool, "bytes": bytes, "list": list, "tuple": tuple}
_SIMPLE_TYPES.update({"dict": dict, "set": set, "frozenset": frozenset})


@dataclass
class Signature:
    """What the inputs must fit: positional parameters, how many are required, their types
    where annotations or defaults say so, and whether `*args` takes more."""

    names: list[str]
    required: int
    types: list[type | None]
    varargs: bool = False
    #: keyword-only parameters with a default: name -> the default (a literal, or None when not one)
    keyword_only: dict[str, object] = field(default_factory=dict)
    #: positional parameters whose default is the literal None (None is a fair question there)
    none_default: set[str] = field(default_factory=set)


@dataclass
class CallSites:
    """What the tests show about the function: exact literal calls, arities used, literal pool."""

    exact: list[tuple[tuple, dict]] = field(default_factory=list)
    #: every literal the tests or doctest examples show, as `_visible_key`s: what a table can key on
    visible: set[str] = field(default_factory=set)
    #: every call's arguments: literal values, HOLE where the test passes a variable
    templates: list[tuple[list, dict]] = field(default_factory=list)
    arities: set[int] = field(default_factory=set)
    pool: dict[str, object] = field(default_factory=dict)


def find_function(module_text: str, function: str) -> ast.FunctionDef | None:
    """The module-level `def function` (not a method or a nested function), or None."""
    try:
        tree = ast.parse(module_text)
    except SyntaxError:
        return None
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    return found[-1] if found else None


def signature_of(node: ast.FunctionDef) -> Signature:
    args = [*node.args.posonlyargs, *node.args.args]
    defaults = [None] * (len(args) - len(node.args.defaults)) + list(node.args.defaults)
    types: list[type | None] = []
    none_default = set()
    for arg, default in zip(args, defaults):
        kind = None
        if isinstance(arg.annotation, ast.Name):
            kind = _SIMPLE_TYPES.get(arg.annotation.id)
        if default is not None:
            value = _literal(default)
            if value is None:
                none_default.add(arg.arg)
            elif kind is None and value is not _NOT_LITERAL:
                kind = type(value)
        types.append(kind)
    keyword_only = {}
    for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
        if default is not None:  # a required keyword-only parameter: the tests' templates pass it
            value = _literal(default)
            keyword_only[arg.arg] = None if value is _NOT_LITERAL else value
    return Signature(
        [a.arg for a in args],
        len(args) - len(node.args.defaults),
        types,
        varargs=node.args.vararg is not None,
        keyword_only=keyword_only,
        none_default=none_default,
    )


_NOT_LITERAL = object()
#: an argument a test passes as a variable: the oracle fills it from the pool
HOLE = _NOT_LITERAL
#: `{ITERATOR: [...]}` as an argument: the harness passes `iter([...])` (functions that take
#: iterators often treat them apart from sequences)
ITERATOR = "__rollhub_oracle_iterator__"


def _literal(node: ast.AST) -> object:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "iter"
        and len(node.args) == 1
        and not node.keywords
    ):
        items = _literal(node.args[0])  # `iter([...])` in a test: an iterator argument
        return {ITERATOR: list(items)} if isinstance(items, (list, tuple)) else _NOT_LITERAL
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL
    try:
        if len(repr(value)) > MAX_LITERAL_CHARS:
            return _NOT_LITERAL
    except (ValueError, RecursionError):
        return _NOT_LITERAL
    return value


def _trees(text: str) -> Iterator[tuple[ast.AST, bool]]:
    """The file's AST and the ASTs of the doctest examples in its string constants, each with
    whether it is a doctest example."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    yield tree, False
    parser = doctest.DocTestParser()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ">>>" in node.value:
            try:
                examples = parser.get_examples(node.value)
            except ValueError:
                continue
            for example in examples:
                try:
                    yield ast.parse(example.source), True
                except SyntaxError:
                    continue


def _calls_function(call: ast.Call, function: str) -> bool:
    target = call.func
    return (isinstance(target, ast.Name) and target.id == function) or (
        isinstance(target, ast.Attribute) and target.attr == function
    )


def call_sites(texts: Iterable[str], function: str, sources: Iterable[str] = ()) -> CallSites:
    """Calls of `function` (by name or as an attribute) and every literal in `texts` (the tests:
    all they show is visible) and `sources` (the module: only its doctest examples are visible,
    its other literals feed the pool)."""
    sites = CallSites()
    shown = [(text, True) for text in texts] + [(text, False) for text in sources]
    for text, is_test in shown:
        for tree, is_doctest in _trees(text):
            visible = is_test or is_doctest
            for node in ast.walk(tree):
                if isinstance(node, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.UnaryOp, ast.Call)):
                    value = _literal(node)
                    if value is not _NOT_LITERAL:
                        sites.pool.setdefault(_key(value), value)
                        items = list(value) if isinstance(value, (list, tuple, set, frozenset)) else []
                        for item in items:
                            sites.pool.setdefault(_key(item), item)
                        if visible:
                            sites.visible.update(_visible_key(v) for v in [value, *items])
                if not (isinstance(node, ast.Call) and _calls_function(node, function)):
                    continue
                if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                    continue
                sites.arities.add(len(node.args))
                args = [_literal(a) for a in node.args]
                kwargs = {k.arg: _literal(k.value) for k in node.keywords}
                sites.templates.append((args, kwargs))
                if all(v is not HOLE for v in [*args, *kwargs.values()]):
                    sites.exact.append((tuple(args), kwargs))
    return sites


def _round_trips(text: str, value: object) -> bool:
    """Whether the harness gets exactly this value back from its text (it reads literals only)."""
    try:
        return ast.literal_eval(text) == value
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _key(value: object) -> str:
    return f"{type(value).__name__}:{value!r}"


def _visible_key(value: object) -> str:
    """What a table lookup would key on: an iterator as its items, a list as a tuple, a set as a
    sorted tuple, a number by value (a table holding 1 also answers 1.0 and True)."""
    if isinstance(value, dict) and set(value) == {ITERATOR}:
        value = value[ITERATOR]
    if isinstance(value, (list, tuple)):
        return "seq:" + repr(tuple(_visible_key(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return "set:" + repr(sorted(_visible_key(v) for v in value))
    if isinstance(value, dict):
        return "dict:" + repr(sorted((_visible_key(k), _visible_key(v)) for k, v in value.items()))
    if isinstance(value, (bool, int)):
        return f"num:{int(value)}"
    if isinstance(value, float) and value.is_integer():
        return f"num:{int(value)}"
    return _key(value)


def is_visible(args: tuple, kwargs: dict, sites: CallSites) -> bool:
    """Whether a table of what the tests and doctests show could answer this call: every
    argument equals one of their literals (the call itself a literal call or a parametrised
    table's row). Such an input cannot vouch for the oracle."""
    keys = [_visible_key(v) for v in [*args, *kwargs.values()]]
    return all(k in sites.visible for k in keys)


#: small on purpose: a count or a size of 2**31 makes `partition(n, seq)` allocate until killed
_BOUNDARY_INTS = [0, 1, -1, 2, 7, 100, 1000]


def _derived(value: object) -> list[object]:
    """Neighbours of a literal of the same type: what a table of the tests' answers misses."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, -value, value * 2 + 3, value + 10, *_BOUNDARY_INTS]
    if isinstance(value, float):
        return [value + 0.5, -value, value * 2, value / 3, 0.0, 1e-9, 1e6]
    if isinstance(value, str):
        derived = [value.upper(), value.lower(), value[::-1], value + value[:2], value[1:], value.title(), value[:1]]
        derived += ["", " " + value + " ", value.replace(" ", "  "), value + "é", value * 3, value[: len(value) // 2]]
        if len(value) == 1:  # a character: its neighbours and one far below (control characters)
            code = ord(value)
            derived += [chr(max(code - 1, 0)), chr(code + 1), chr(code // 2), chr(code // 4)]
        return [v for v in derived if v != value]
    if isinstance(value, bytes):
        return [value[::-1], value + value[:1], b"", value.upper()]
    if isinstance(value, (list, tuple)):
        kind = type(value)
        items = list(value)
        derived = [kind(reversed(value)), kind(items[1:]), kind([*items, *items[:1]]), {ITERATOR: items}, kind()]
        derived += [kind(items[: len(items) // 2]), kind([*items, *items])]
        if items and all(isinstance(i, (int, float)) and not isinstance(i, bool) for i in items):
            derived += [kind(sorted(items)), kind([i + 1 for i in items]), kind([-i for i in items])]
        return derived
    if isinstance(value, dict) and set(value) != {ITERATOR}:
        pairs = list(value.items())
        derived = [dict(reversed(pairs)), dict(pairs[1:]), {}]
        if pairs:
            key, item = pairs[0]
            derived += [{**value, key: _derived(item)[0] if _derived(item) else None}]
        return derived
    if isinstance(value, (set, frozenset)):
        kind = type(value)
        items = sorted(value, key=repr)
        extra = [v for v in (_derived(items[0]) if items else [0]) if isinstance(v, (int, float, str, bytes, tuple))]
        return [kind(items[1:]), kind(), kind([*items, *extra[:1]])]
    return []


def hidden_inputs(
    instance_id: str, signature: Signature, sites: CallSites, max_inputs: int = 96, max_visible: int = 12
) -> list[tuple[tuple, dict]]:
    """Deterministic inputs for one task: some of the tests' own literal calls, then variants
    of them, then calls built from the signature and the tests' literals."""
    rng = random.Random(int(hashlib.sha256(f"rollhub-oracle:{instance_id}".encode()).hexdigest()[:16], 16))
    by_type: dict[type, list[object]] = {}
    for value in sites.pool.values():
        by_type.setdefault(type(value), []).append(value)
    pool = list(sites.pool.values())
    chosen: dict[str, tuple[tuple, dict]] = {}
    visible = 0

    def add(args: tuple, kwargs: dict) -> None:
        # inputs a table could answer do not vouch for the oracle: past 2 * max_visible, none more
        nonlocal visible
        text = repr((args, kwargs))
        if len(chosen) >= max_inputs or text in chosen or not _round_trips(text, (args, kwargs)):
            return
        if is_visible(args, kwargs, sites):
            if visible >= 2 * max_visible:
                return
            visible += 1
        chosen[text] = (args, kwargs)

    exact = list(sites.exact)
    rng.shuffle(exact)
    for args, kwargs in exact[:max_visible]:
        add(args, kwargs)

    def value_like(example: object | None, kind: type | None) -> object:
        kind = kind or (type(example) if example is not None else None)
        choices: list[object] = []
        if example is not None:
            choices += _derived(example)
        if kind is not None:
            same = by_type.get(kind, [])
            choices += same
            for seed in rng.sample(same, min(10, len(same))):
                choices += _derived(seed)
        if not choices:
            choices = pool
        value = rng.choice(choices) if choices else None
        if isinstance(value, list) and rng.random() < 0.25:
            return {ITERATOR: value}
        return value

    def kind_at(slot: int | str) -> type | None:
        index = slot if isinstance(slot, int) else (signature.names.index(slot) if slot in signature.names else -1)
        return signature.types[index] if 0 <= index < len(signature.types) else None

    attempts = 0
    while len(chosen) < max_inputs and attempts < max_inputs * 20:
        attempts += 1
        if sites.templates and rng.random() < 0.7:
            # a test's own call: its variables filled from the pool, then one argument moved
            template_args, template_kwargs = rng.choice(sites.templates)
            holes = [v is HOLE for v in [*template_args, *template_kwargs.values()]]
            args = [value_like(None, kind_at(i)) if v is HOLE else v for i, v in enumerate(template_args)]
            kwargs = {k: value_like(None, kind_at(k)) if v is HOLE else v for k, v in template_kwargs.items()}
            slots: list[int | str] = [*range(len(args)), *kwargs]
            moves = 2 if len(slots) > 1 and rng.random() < 0.3 else 1
            if slots and (not any(holes) or rng.random() < 0.5):
                for slot in rng.sample(slots, moves):
                    if isinstance(slot, int):
                        args[slot] = value_like(args[slot], kind_at(slot))
                    else:
                        kwargs[slot] = value_like(kwargs[slot], kind_at(slot))
            if rng.random() < 0.35:  # a parameter the call leaves at its default, set by keyword
                optional = [*signature.keyword_only]
                optional += [n for n in signature.none_default if signature.names.index(n) >= len(args)]
                name = rng.choice(optional) if optional else None
                if name in signature.keyword_only:
                    kwargs[name] = value_like(signature.keyword_only[name], None)
                elif name is not None:
                    kwargs[name] = rng.choice([None, value_like(None, kind_at(name))])
            add(tuple(args), kwargs)
            continue
        arities = sorted(sites.arities) or [signature.required]
        arity = rng.choice(arities)
        if arity < signature.required or (arity > len(signature.names) and not signature.varargs):
            continue
        add(tuple(value_like(None, kind_at(i)) for i in range(arity)), {})
    return list(chosen.values())


def neighbours(
    exposing: list[tuple[tuple, dict]], sites: CallSites, taken: set[str], limit: int = 48
) -> list[tuple[tuple, dict]]:
    """Inputs one argument away from those on which the bug is wrong but the tests show
    (`exposing`), left out where the tests show them too: where a bug is told apart only on the
    tests' own inputs, their neighbours are where a table keeping the bug answers wrongly. In a
    fixed order (round-robin over the exposing inputs), so the same task always gets the same."""
    per_input: list[list[tuple[tuple, dict]]] = []
    for args, kwargs in exposing:
        near = []
        for slot in [*range(len(args)), *kwargs]:
            given = args[slot] if isinstance(slot, int) else kwargs[slot]
            for value in _derived(given):
                if isinstance(slot, int):
                    near.append((tuple(value if i == slot else a for i, a in enumerate(args)), kwargs))
                else:
                    near.append((args, {**kwargs, slot: value}))
        per_input.append(near)
    chosen: list[tuple[tuple, dict]] = []
    seen = set(taken)
    for round_ in itertools.zip_longest(*per_input):
        for item in round_:
            if item is None or len(chosen) >= limit:
                continue
            text = repr(item)
            if text not in seen and _round_trips(text, item) and not is_visible(*item, sites):
                seen.add(text)
                chosen.append(item)
    return chosen
