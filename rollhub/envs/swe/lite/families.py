"""Function families of SWE-lite: small, pure, deterministic utilities made from parts.

A family is a skeleton (count, sum, first index, mask characters, ...) combined with a
predicate and, for some skeletons, a transform: `sum:above:scaled` is "sum of the values
above k, each times m". The families are the product of those parts (a few hundred), so
a held-out set can draw families that training never sees. A concrete function draws its
constants, argument names and nouns from a seeded generator, so one family yields many
distinct functions; its docstring says what it does, as a small model reads it.

Every function is pure and loops only over `range` or a sequence (no `while`), so no
mutant of it can hang; inputs are small lists of ints or short strings.
"""

from __future__ import annotations

import ast
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------------- parts
#: int predicates: name -> (expression over {v}, doc); {k}, {lo}, {hi} are drawn constants
INT_PREDICATES: dict[str, tuple[str, str]] = {
    "above": ("{v} > {k}", "greater than {k}"),
    "at_least": ("{v} >= {k}", "at least {k}"),
    "below": ("{v} < {k}", "less than {k}"),
    "at_most": ("{v} <= {k}", "at most {k}"),
    "divisible": ("{v} % {d} == 0", "divisible by {d}"),
    "indivisible": ("{v} % {d} != 0", "not divisible by {d}"),
    "inside": ("{v} >= {lo} and {v} <= {hi}", "between {lo} and {hi} inclusive"),
    "outside": ("not ({v} >= {lo} and {v} <= {hi})", "outside {lo}..{hi}"),
    "even_positive": ("{v} > 0 and {v} % 2 == 0", "positive and even"),
}
#: int transforms: name -> (expression over {v}, doc); {m} is a drawn constant
INT_TRANSFORMS: dict[str, tuple[str, str]] = {
    "scaled": ("{v} * {m}", "times {m}"),
    "shifted": ("{v} + {m}", "plus {m}"),
    "reduced": ("{v} - {m}", "minus {m}"),
    "halved": ("{v} // 2", "halved (floor division)"),
    "squared": ("{v} * {v}", "squared"),
    "negated": ("-{v}", "negated"),
    "capped": ("min({v}, {m})", "capped at {m}"),
    "floored": ("max({v} - {m}, 0)", "reduced by {m} but never below 0"),
}
#: character predicates over {c}
CHAR_PREDICATES: dict[str, tuple[str, str]] = {
    "digits": ("{c}.isdigit()", "digits"),
    "uppercase": ("{c}.isupper()", "uppercase letters"),
    "vowels": ("{c} in 'aeiou'", "lowercase vowels"),
    "punctuation": ("{c} in '.,;:!?'", "punctuation marks (.,;:!?)"),
    "letters": ("{c}.isalpha()", "letters"),
    "spaces": ("{c} == ' '", "spaces"),
}
#: word predicates over {w}
WORD_PREDICATES: dict[str, tuple[str, str]] = {
    "long": ("len({w}) > {k}", "longer than {k} characters"),
    "short": ("len({w}) <= {k}", "at most {k} characters long"),
    "capitalized": ("{w}[:1].isupper()", "capitalized"),
    "numeric": ("{w}.isdigit()", "made of digits only"),
    "prefixed": ("{w}.startswith('{p}')", "starting with '{p}'"),
}

#: (plural, singular): the list argument and its loop variable
_INT_NOUNS = [
    ("scores", "score"),
    ("values", "value"),
    ("readings", "reading"),
    ("amounts", "amount"),
    ("levels", "level"),
    ("points", "point"),
    ("sizes", "size"),
    ("ticks", "tick"),
    ("weights", "weight"),
    ("prices", "price"),
]
_TEXT_ARGS = ["text", "line", "label", "message", "title", "phrase"]
_SEPARATORS = [" ", ",", ";", "-", "/"]

# ---------------------------------------------------------------------- skeletons
#: int-list skeletons: name -> (function-name pattern, doc pattern, body). The body uses
#: {xs} (the list), {v}, {P} (the predicate) and {T} (the transform) when the name has one.
INT_SKELETONS: dict[str, tuple[str, str, str]] = {
    "count": (
        "count_{noun}_{pred}",
        "Return how many of the {noun} are {pdoc}.",
        """
        count = 0
        for {v} in {xs}:
            if {P}:
                count += 1
        return count
        """,
    ),
    "sum": (
        "total_{trans}_{noun}_{pred}",
        "Sum the {noun} that are {pdoc}, each {tdoc}.",
        """
        total = 0
        for {v} in {xs}:
            if {P}:
                total += {T}
        return total
        """,
    ),
    "select": (
        "{trans}_{noun}_{pred}",
        "Return the {noun} that are {pdoc}, each {tdoc}, in their original order.",
        """
        result = []
        for {v} in {xs}:
            if {P}:
                result.append({T})
        return result
        """,
    ),
    "largest": (
        "largest_{trans}_{noun}_{pred}",
        "Return the largest of the {noun} that are {pdoc}, taken {tdoc}; None if there is none.",
        """
        best = None
        for {v} in {xs}:
            if {P}:
                candidate = {T}
                if best is None or candidate > best:
                    best = candidate
        return best
        """,
    ),
    "first_index": (
        "first_{noun}_{pred}_index",
        "Return the index of the first of the {noun} that is {pdoc}, or -1 if there is none.",
        """
        for i in range(len({xs})):
            {v} = {xs}[i]
            if {P}:
                return i
        return -1
        """,
    ),
    "last_index": (
        "last_{noun}_{pred}_index",
        "Return the index of the last of the {noun} that is {pdoc}, or -1 if there is none.",
        """
        for i in range(len({xs}) - 1, -1, -1):
            {v} = {xs}[i]
            if {P}:
                return i
        return -1
        """,
    ),
    "all": (
        "all_{noun}_{pred}",
        "Return True when every one of the {noun} is {pdoc} (True for an empty list).",
        """
        for {v} in {xs}:
            if not ({P}):
                return False
        return True
        """,
    ),
    "partition": (
        "partition_{noun}_{pred}",
        "Split the {noun} into (those {pdoc}, the rest), keeping their order.",
        """
        hits = []
        misses = []
        for {v} in {xs}:
            if {P}:
                hits.append({v})
            else:
                misses.append({v})
        return hits, misses
        """,
    ),
    "jumps": (
        "{noun}_jumps_{pred}",
        "Return the indexes i >= 1 where the step {xs}[i] - {xs}[i - 1] is {pdoc}.",
        """
        result = []
        for i in range(1, len({xs})):
            {v} = {xs}[i] - {xs}[i - 1]
            if {P}:
                result.append(i)
        return result
        """,
    ),
    "runs": (
        "count_{noun}_runs_{pred}",
        "Count the maximal runs of consecutive {noun} that are {pdoc}.",
        """
        runs = 0
        inside = False
        for {v} in {xs}:
            if {P}:
                if not inside:
                    runs += 1
                inside = True
            else:
                inside = False
        return runs
        """,
    ),
    "replace": (
        "replace_{noun}_{pred}",
        "Return the {noun} with each one that is {pdoc} replaced by {fill}.",
        """
        return [{fill} if {P} else {v} for {v} in {xs}]
        """,
    ),
}
_INT_WITH_TRANSFORM = {"sum", "select", "largest"}

#: string skeletons over characters ({C}) or words ({W}) of {s}
CHAR_SKELETONS: dict[str, tuple[str, str, str]] = {
    "count_chars": (
        "count_{cp}",
        "Return how many characters of {s} are {cpdoc}.",
        """
        count = 0
        for c in {s}:
            if {C}:
                count += 1
        return count
        """,
    ),
    "remove_chars": (
        "remove_{cp}",
        "Return {s} without its {cpdoc}.",
        """
        kept = []
        for c in {s}:
            if not {C}:
                kept.append(c)
        return ''.join(kept)
        """,
    ),
    "mask_chars": (
        "mask_{cp}",
        "Return {s} with every one of its {cpdoc} replaced by '{mask}'.",
        """
        out = []
        for c in {s}:
            if {C}:
                out.append('{mask}')
            else:
                out.append(c)
        return ''.join(out)
        """,
    ),
    "first_char": (
        "find_first_{cp}",
        "Return the position of the first of the {cpdoc} in {s}, or -1 if there is none.",
        """
        for i in range(len({s})):
            c = {s}[i]
            if {C}:
                return i
        return -1
        """,
    ),
}
WORD_SKELETONS: dict[str, tuple[str, str, str]] = {
    "select_words": (
        "{wp}_words",
        "Return the words of {s} (split on {sepdoc}) that are {wpdoc}.",
        """
        result = []
        for w in {s}.split({sep!r}):
            if {W}:
                result.append(w)
        return result
        """,
    ),
    "count_words": (
        "count_{wp}_words",
        "Return how many words of {s} (split on {sepdoc}) are {wpdoc}.",
        """
        count = 0
        for w in {s}.split({sep!r}):
            if {W}:
                count += 1
        return count
        """,
    ),
    "longest_word": (
        "longest_{wp}_word",
        "Return the longest word of {s} (split on {sepdoc}) that is {wpdoc}; the first on ties, '' if none.",
        """
        best = ''
        for w in {s}.split({sep!r}):
            if {W} and len(w) > len(best):
                best = w
        return best
        """,
    ),
    "initials": (
        "{wp}_initials",
        "Return the upper-cased first letters of the words of {s} (split on {sepdoc}) that are {wpdoc}.",
        """
        letters = []
        for w in {s}.split({sep!r}):
            if w and {W}:
                letters.append(w[:1].upper())
        return ''.join(letters)
        """,
    ),
}
#: formatting skeletons: fixed shape, drawn constants
FORMAT_SKELETONS: dict[str, tuple[str, str, str]] = {
    "truncate": (
        "truncate_{s}",
        "Cut {s} to at most {width} characters, ending in '{suffix}' when it was cut.",
        """
        if len({s}) <= {width}:
            return {s}
        return {s}[:{width} - len('{suffix}')] + '{suffix}'
        """,
    ),
    "pad": (
        "pad_{s}",
        "Left-pad {s} with '{fill_char}' to {width} characters; longer text is returned unchanged.",
        """
        if len({s}) >= {width}:
            return {s}
        return '{fill_char}' * ({width} - len({s})) + {s}
        """,
    ),
    "chunks": (
        "{s}_chunks",
        "Split {s} into pieces of {size} characters; the last one may be shorter.",
        """
        pieces = []
        for start in range(0, len({s}), {size}):
            pieces.append({s}[start:start + {size}])
        return pieces
        """,
    ),
    "swap_case_after": (
        "shout_{s}_after",
        "Upper-case the characters of {s} from position {start} on, keeping the first {start} as they are.",
        """
        head = {s}[:{start}]
        tail = {s}[{start}:]
        return head + tail.upper()
        """,
    ),
}


# ---------------------------------------------------------------------- families
@dataclass(frozen=True)
class Family:
    """One function family: a skeleton and its parts (the held-out split is by family id)."""

    domain: str  # "ints" | "chars" | "words" | "format"
    skeleton: str
    predicate: str = ""
    transform: str = ""

    @property
    def id(self) -> str:
        return ":".join(p for p in (self.skeleton, self.predicate, self.transform) if p)


def all_families() -> list[Family]:
    """Every family, in a fixed order."""
    families = []
    for skeleton in INT_SKELETONS:
        for pred in INT_PREDICATES:
            if skeleton in _INT_WITH_TRANSFORM:
                families += [Family("ints", skeleton, pred, t) for t in INT_TRANSFORMS]
            else:
                families.append(Family("ints", skeleton, pred))
    for skeleton in CHAR_SKELETONS:
        families += [Family("chars", skeleton, p) for p in CHAR_PREDICATES]
    for skeleton in WORD_SKELETONS:
        families += [Family("words", skeleton, p) for p in WORD_PREDICATES]
    families += [Family("format", s) for s in FORMAT_SKELETONS]
    return families


@dataclass(frozen=True)
class Function:
    """A concrete function: its source (normalised by `ast.unparse`) and test inputs."""

    family: Family
    name: str
    source: str
    #: argument tuples for the tests (each a tuple of literals)
    inputs: tuple[tuple[Any, ...], ...]

    def compiled(self) -> Callable[..., Any]:
        return compile_function(self.source, self.name)


def compile_function(source: str, name: str) -> Callable[..., Any]:
    """The function object of generated source (our own generator's code, run on the host to
    compute the tests' expected values and to tell which mutants the tests catch)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<swe-lite {name}>", "exec"), namespace)  # noqa: S102 - generated code
    return namespace[name]


def _normalise(source: str) -> str:
    return ast.unparse(ast.parse(source)) + "\n"


def _render(name: str, args: str, doc: str, body: str, **values: Any) -> str:
    body = textwrap.dedent(body).strip("\n").format(**values)
    lines = [f"def {name}({args}):", f'    """{doc}"""'] + ["    " + line for line in body.splitlines()]
    return _normalise("\n".join(lines))


def _int_inputs(rng: random.Random, constants: list[int]) -> tuple[tuple[Any, ...], ...]:
    """Six lists: boundary values around the constants, then random ones; one empty list."""
    edges = sorted({c + d for c in constants for d in (-1, 0, 1)})
    lists = [[], edges, [rng.randint(-4, 14) for _ in range(rng.randint(3, 7))]]
    for _ in range(3):
        pool = edges + [rng.randint(-6, 16) for _ in range(4)]
        lists.append([rng.choice(pool) for _ in range(rng.randint(2, 8))])
    return tuple((xs,) for xs in lists)


_WORDS = ["alpha", "Beta", "gamma", "42", "x", "Delta", "eo", "7", "rapid", "Sun", "io", "2024", "oak", "Pine"]


def _text_inputs(rng: random.Random, sep: str = " ") -> tuple[tuple[Any, ...], ...]:
    texts = [""]
    for _ in range(5):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 5))]
        text = sep.join(words)
        if rng.random() < 0.5:
            text += rng.choice(["!", ".", "?", ",", " ok"])
        texts.append(text)
    return tuple((t,) for t in texts)


def make_function(family: Family, rng: random.Random) -> Function:
    """A concrete function of `family`, its constants, names and test inputs drawn from `rng`."""
    if family.domain == "ints":
        noun, v = rng.choice(_INT_NOUNS)
        v = "step" if family.skeleton == "jumps" else v
        pattern, doc, body = INT_SKELETONS[family.skeleton]
        k, d, m = rng.randint(0, 9), rng.randint(2, 5), rng.randint(2, 6)
        lo = rng.randint(-2, 5)
        hi = lo + rng.randint(2, 6)
        fill = rng.choice([0, -1, 99])
        const = {"k": k, "d": d, "lo": lo, "hi": hi}
        pexpr, pdoc = INT_PREDICATES[family.predicate]
        texpr, tdoc = INT_TRANSFORMS.get(family.transform, ("{v}", ""))
        name = pattern.format(noun=noun, pred=family.predicate, trans=family.transform)
        predicate = pexpr.format(v=v, **const)
        transform = texpr.format(v=v, m=m)
        docstring = doc.format(noun=noun, pdoc=pdoc.format(**const), tdoc=tdoc.format(m=m), xs=noun, fill=fill)
        source = _render(name, noun, docstring, body, xs=noun, v=v, P=predicate, T=transform, fill=fill)
        inputs = _int_inputs(rng, [k, lo, hi, d, 0])
    elif family.domain in ("chars", "words"):
        s = rng.choice(_TEXT_ARGS)
        sep = rng.choice(_SEPARATORS)
        if family.domain == "chars":
            pattern, doc, body = CHAR_SKELETONS[family.skeleton]
            cexpr, cdoc = CHAR_PREDICATES[family.predicate]
            mask = rng.choice(["*", "#", "_"])
            name = pattern.format(cp=family.predicate)
            docstring = doc.format(s=s, cpdoc=cdoc, mask=mask)
            source = _render(name, s, docstring, body, s=s, C=cexpr.format(c="c"), mask=mask)
            inputs = _text_inputs(rng)
        else:
            pattern, doc, body = WORD_SKELETONS[family.skeleton]
            k, p = rng.randint(2, 5), rng.choice(["a", "P", "s", "r", "D"])
            wexpr, wdoc = WORD_PREDICATES[family.predicate]
            name = pattern.format(wp=family.predicate)
            sepdoc = "spaces" if sep == " " else repr(sep)
            docstring = doc.format(s=s, sepdoc=sepdoc, wpdoc=wdoc.format(k=k, p=p))
            source = _render(name, s, docstring, body, s=s, sep=sep, W=wexpr.format(w="w", k=k, p=p))
            inputs = _text_inputs(rng, sep)
    else:
        s = rng.choice(_TEXT_ARGS)
        pattern, doc, body = FORMAT_SKELETONS[family.skeleton]
        values = {
            "s": s,
            "width": rng.randint(5, 12),
            "suffix": rng.choice(["...", "~", ".."]),
            "fill_char": rng.choice(["0", ".", "*"]),
            "size": rng.randint(2, 5),
            "start": rng.randint(1, 4),
        }
        name = pattern.format(s=s)
        source = _render(name, s, doc.format(**values), body, **values)
        inputs = _text_inputs(rng, rng.choice(_SEPARATORS)) + (("a" * values["width"],), ("b" * values["size"],))
    return Function(family, name, source, inputs)


def body_key(source: str) -> str:
    """What identifies a function's code whatever its name: two functions with the same key
    in one image would leak a task's correct code through another task's folder."""
    tree = ast.parse(source)
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef)
    func.name = "_"
    if func.body and isinstance(func.body[0], ast.Expr) and isinstance(func.body[0].value, ast.Constant):
        func.body = func.body[1:]  # the docstring says what, not how
    return ast.dump(func)
