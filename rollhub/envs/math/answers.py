"""Answer extraction and equivalence checking for verifiable math rewards.

Extraction order: the last `\\boxed{...}` inside the answer tag, else the tag's content,
else (format not followed) the last `\\boxed{...}` or the final number anywhere in the text.
Equivalence: identical after normalisation, or the same value. Values come from a small
grammar (numbers, `+ - * / ^`, implicit multiplication, sqrt exp log ln sin cos tan, pi,
E, I, single-letter variables, tuples), evaluated as exact rationals where possible (so
`1/2`, `0.5`, `\\frac{1}{2}` and `\\dfrac12` all match and `1/3` is not `0.33`), else in
floating point with a relative tolerance of 1e-9 (`sqrt(2)/2` = `1/sqrt(2)`). Answers with
variables are compared at random points (polynomial identity testing: `3x+2` = `2 + 3*x`);
the points are drawn afresh on every call, so no answer can be tuned to them.

Why no sympy and no `eval`: model text is untrusted. `9^9^9`, `1e999999999` or a
100k-digit number kept the old check (Fraction, then sympy) busy for minutes, synchronously
on the event loop, which froze every trajectory and the trainer. A worker thread cannot be
killed and still holds the GIL, so the check is made cheap instead: the answer's length, a
literal's digits and exponent, the nesting depth, every power (by the size of its result)
and the bits of every exact intermediate are capped before anything is computed, and a
deadline (`CHECK_TIME_LIMIT_S`) aborts whatever is left. An answer over any cap is "not
shown equal" and scores 0.
"""

from __future__ import annotations

import cmath
import math
import operator
import random
import re
import time
from collections.abc import Callable
from fractions import Fraction

MAX_ANSWER_CHARS = 1000  # a longer predicted answer is refused before normalisation
MAX_EXPRESSION_CHARS = 200  # normalised text the parser accepts
MAX_DIGITS = 100  # digits of one number literal
MAX_LITERAL_EXPONENT = 100  # |e| of a literal like 1e5
MAX_DEPTH = 20  # nesting of parentheses, powers and signs
MAX_BITS = 4096  # numerator/denominator size of every exact intermediate (2^1000 still fits)
MAX_MAGNITUDE = 1e300  # floating-point intermediates beyond this are refused (overflow)
REL_TOL = 1e-9  # floating-point comparison, relative to max(1, |gold|)
RANDOM_POINTS = 4  # evaluations of answers with variables
CHECK_TIME_LIMIT_S = 0.05  # deadline of one is_equivalent call

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
# prose around exactly one number ("The answer is 17.", "12 apples"): graded by that number
_PROSE_NUMBER = re.compile(r"[A-Za-z\s:=']*?(-?\d+(?:\.\d+)?(?:/\d+)?)[A-Za-z\s.!']*")
_TOKEN = re.compile(
    r"\s*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z]+)|(?P<op>\*\*|[-+*/(),]))"
)
_FUNCTIONS: dict[str, Callable[[complex], complex]] = {
    "sqrt": cmath.sqrt,
    "exp": cmath.exp,
    "log": cmath.log,
    "ln": cmath.log,
    "sin": cmath.sin,
    "cos": cmath.cos,
    "tan": cmath.tan,
}
_CONSTANTS: dict[str, complex] = {"pi": complex(math.pi), "E": complex(math.e), "I": 1j}
_RNG = random.Random()  # seeded from the OS: evaluation points cannot be predicted

_OPERATORS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}

Value = Fraction | complex  # an exact rational, or a floating-point approximation
# ("num", Fraction) | ("var", name) | ("const", name) | ("neg", node) | ("call", function, node)
# | (operator, left, right) | ("tuple", [node, ...])
Node = tuple


class Refused(Exception):
    """The answer is outside the bounded grammar or over a cost cap: not shown equal."""


# -- extraction ---------------------------------------------------------------------------


def extract_tagged(text: str, tag: str) -> str | None:
    """Content of the last `<tag>...</tag>`, stripped; the whole text when `tag` is empty.

    Two `rfind` calls, linear in the text: a regex over many openings and no closing is quadratic.
    """
    if not tag:
        return text.strip() or None
    close = text.rfind(f"</{tag}>")
    start = text.rfind(f"<{tag}>", 0, max(close, 0))
    if close < 0 or start < 0:
        return None
    return text[start + len(tag) + 2 : close].strip()


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (nested braces allowed).

    The scan stops MAX_ANSWER_CHARS after the brace: a longer box is returned cut there
    (still too long, so it scores 0) instead of walking a huge text character by character.
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    end = min(len(text), brace + MAX_ANSWER_CHARS + 2)
    depth = 0
    for i in range(brace, end):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i].strip()
    return text[brace + 1 : end] if end < len(text) else None


def final_number(text: str) -> str | None:
    """The last number in `text` (commas as thousands separators allowed).

    The regex only scans the 2 * MAX_ANSWER_CHARS before the last digit (ten `rfind` calls
    find it): over a whole megabyte reply it alone took a quarter of a second. A number
    longer than that window is cut, and still too long to score.
    """
    last = max(text.rfind(digit) for digit in "0123456789")
    if last < 0:
        return None
    matches = _NUMBER.findall(text, max(0, last - 2 * MAX_ANSWER_CHARS), last + 1)
    return matches[-1].rstrip(",") if matches else None


def extract_answer(text: str, tag: str = "answer") -> tuple[str | None, bool]:
    """(answer text, format_ok). format_ok means the answer tag or a \\boxed{} was used."""
    tagged = extract_tagged(text, tag)
    if tagged is not None:
        boxed = extract_boxed(tagged)
        return (boxed if boxed is not None else tagged), True
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed, True
    return final_number(text), False


# -- normalisation ------------------------------------------------------------------------


_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_SQRT = re.compile(r"\\sqrt\s*\{([^{}]*)\}")


def _replace_frac_and_sqrt(text: str) -> str:
    """\\frac{a}{b} -> ((a)/(b)) and \\sqrt{a} -> sqrt(a), innermost first, so either may
    nest in the other (`\\frac{\\sqrt{2}}{2}`); also the brace-less \\frac12 and \\sqrt2."""
    text = re.sub(r"\\[dt]?frac\s*(\d)\s*(\d)", r"((\1)/(\2))", text)
    text = re.sub(r"\\sqrt\s*(\d+)", r"sqrt(\1)", text)
    previous = None
    while previous != text:  # each pass removes a level of braces: at most len(text) passes
        previous, text = text, _SQRT.sub(r"sqrt(\1)", _FRAC.sub(r"((\1)/(\2))", text))
    return text


def normalize(answer: str) -> str:
    """Strip LaTeX decoration, units of formatting and a leading `x =`."""
    s = answer.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\mathrm\{([^{}]*)\}", r"\1", s)
    for token in (
        "\\$",
        "$",
        "\\!",
        "\\,",
        "\\;",
        "\\ ",
        "\\left",
        "\\right",
        "^\\circ",
        "^{\\circ}",
        "\\%",
        "%",
        "\\displaystyle",
    ):
        s = s.replace(token, "")
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    s = _replace_frac_and_sqrt(s)
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("\\pi", "pi")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    s = s.rstrip(".").strip()
    return re.sub(r"\s+", " ", s)


# -- bounded parsing ----------------------------------------------------------------------


def _tokenize(text: str) -> list[tuple[str, str]]:
    """(kind, text) pairs; anything outside the grammar's alphabet is refused."""
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise Refused(f"unexpected character {text[position]!r}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


def _literal(text: str) -> Fraction:
    """A number literal as an exact rational, with its digits and exponent capped first
    (Fraction('1e999999999') alone builds a billion-digit integer)."""
    mantissa, _, exponent = text.lower().partition("e")
    whole, _, decimals = mantissa.partition(".")
    if len(whole) + len(decimals) > MAX_DIGITS or len(exponent) > 4:
        raise Refused("number literal too long")
    power = int(exponent or 0)
    if abs(power) > MAX_LITERAL_EXPONENT:
        raise Refused("literal exponent too large")
    return Fraction(int(whole + decimals or "0")) * Fraction(10) ** (power - len(decimals))


class _Parser:
    """Recursive descent over the tokens, with the nesting depth capped.

    tuple := expr (',' expr)* ; expr := term (('+'|'-') term)* ;
    term := unary (('*'|'/') unary | implicit unary)* ; unary := ('+'|'-') unary | power ;
    power := atom ('**' unary)? ; atom := number | name | function atom | '(' tuple ')'.
    Implicit multiplication (`3x`, `2sqrt(2)`, `(x-1)(x+1)`) needs a name or parenthesis on
    the right: `2 3` is refused rather than read as 6.
    """

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.position, self.depth = tokens, 0, 0

    def parse(self) -> Node:
        node = self.tuple()
        if self.position != len(self.tokens):
            raise Refused(f"unexpected {self.peek()[1]!r}")
        return node

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.position] if self.position < len(self.tokens) else ("end", "")

    def take(self, text: str) -> bool:
        if self.peek() == ("op", text):
            self.position += 1
            return True
        return False

    def nested(self, parse: Callable[[], Node]) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Refused("nested too deeply")
        try:
            return parse()
        finally:
            self.depth -= 1

    def tuple(self) -> Node:
        items = [self.expr()]
        while self.take(","):
            items.append(self.expr())
        return items[0] if len(items) == 1 else ("tuple", items)

    def expr(self) -> Node:
        node = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.tokens[self.position][1]
            self.position += 1
            node = ("add" if op == "+" else "sub", node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while True:
            kind, text = self.peek()
            if (kind, text) in (("op", "*"), ("op", "/")):
                self.position += 1
                node = ("mul" if text == "*" else "div", node, self.unary())
            elif kind == "name" or (kind, text) == ("op", "("):
                node = ("mul", node, self.unary())
            else:
                return node

    def unary(self) -> Node:
        if self.take("-"):
            return ("neg", self.nested(self.unary))
        if self.take("+"):
            return self.nested(self.unary)
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        if self.take("**"):
            return ("pow", base, self.nested(self.unary))
        return base

    def atom(self) -> Node:
        kind, text = self.peek()
        self.position += 1
        if kind == "number":
            return ("num", _literal(text))
        if kind == "name":
            if text in _FUNCTIONS:
                return ("call", text, self.nested(self.atom))
            if text in _CONSTANTS:
                return ("const", text)
            if len(text) == 1:
                return ("var", text)
            raise Refused(f"unknown name {text!r}")
        if (kind, text) == ("op", "("):
            node = self.nested(self.tuple)
            if not self.take(")"):
                raise Refused("unbalanced parentheses")
            return node
        raise Refused(f"unexpected {text or 'end of answer'!r}")


def parse(text: str) -> Node:
    """The expression tree of a normalised answer; raises Refused outside the bounded grammar."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise Refused("answer too long")
    return _Parser(_tokenize(text)).parse()


# -- bounded evaluation -------------------------------------------------------------------


class _Clock:
    """The check's deadline, consulted at every node (a cooperative time limit)."""

    def __init__(self, limit_s: float):
        self.deadline = time.perf_counter() + limit_s

    def tick(self) -> None:
        if time.perf_counter() > self.deadline:
            raise Refused("time limit")


def _exact(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise Refused("exact value too large")
    return value


def _approx(value: Value) -> complex:
    try:
        result = complex(value)
    except OverflowError:
        raise Refused("value too large for floating point") from None
    if not (cmath.isfinite(result) and abs(result) <= MAX_MAGNITUDE):
        raise Refused("value too large for floating point")
    return result


def _power(base: Value, exponent: Value) -> Value:
    """base ** exponent; exact only while the result stays under MAX_BITS, judged before computing it."""
    if isinstance(base, Fraction) and isinstance(exponent, Fraction) and exponent.denominator == 1:
        return _exact_power(base, exponent.numerator)
    left, right = _approx(base), _approx(exponent)
    if abs(right) > MAX_BITS:
        raise Refused("exponent too large")
    if left == 0:
        if right.real <= 0:
            raise Refused("zero to a non-positive power")
        return 0j
    try:
        return _approx(cmath.exp(right * cmath.log(left)))
    except (OverflowError, ValueError):
        raise Refused("power overflows") from None


def _exact_power(base: Fraction, n: int) -> Fraction:
    if base == 0:
        if n < 0:
            raise Refused("division by zero")
        return Fraction(0 if n else 1)
    if abs(base) == 1:
        return base ** (n % 2)
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if abs(n) > MAX_BITS or bits * abs(n) > MAX_BITS:
        raise Refused("power too large")
    return _exact(base**n)


def _arithmetic(op: str, left: Value, right: Value) -> Value:
    if op == "pow":
        return _power(left, right)
    if op == "div" and right == 0:
        raise Refused("division by zero")
    if isinstance(left, Fraction) and isinstance(right, Fraction):
        return _exact(_OPERATORS[op](left, right))
    return _approx(_OPERATORS[op](_approx(left), _approx(right)))


def _call(name: str, argument: Value) -> Value:
    if name == "sqrt" and isinstance(argument, Fraction) and argument >= 0:
        num, den = math.isqrt(argument.numerator), math.isqrt(argument.denominator)
        if num * num == argument.numerator and den * den == argument.denominator:
            return Fraction(num, den)  # sqrt(4) stays exact: it is 2, not 2.0000000001
    try:
        return _approx(_FUNCTIONS[name](_approx(argument)))
    except (OverflowError, ValueError):
        raise Refused(f"{name} out of range") from None


def evaluate(node: Node, point: dict[str, float], clock: _Clock) -> Value:
    """The value of `node` with variables at `point`; raises Refused over any cap."""
    clock.tick()
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "const":
        return _CONSTANTS[node[1]]
    if kind == "var":
        return complex(point[node[1]])
    if kind == "neg":
        value = evaluate(node[1], point, clock)
        return -value
    if kind == "call":
        return _call(node[1], evaluate(node[2], point, clock))
    if kind == "tuple":
        raise Refused("a tuple is not a number")
    return _arithmetic(kind, evaluate(node[1], point, clock), evaluate(node[2], point, clock))


def _variables(node: Node) -> set[str]:
    if node[0] == "var":
        return {node[1]}
    children = node[1] if node[0] == "tuple" else [c for c in node[1:] if isinstance(c, tuple)]
    return set().union(*(_variables(c) for c in children))


def _close(left: Value, right: Value) -> bool:
    """Exact rationals compare exactly; anything approximate within REL_TOL of the gold value."""
    if isinstance(left, Fraction) and isinstance(right, Fraction):
        return left == right
    a, b = _approx(left), _approx(right)
    return abs(a - b) <= REL_TOL * max(1.0, abs(b))


def same_value(predicted: Node, gold: Node, clock: _Clock) -> bool:
    """Whether two parsed answers denote the same number, tuple or function of their variables."""
    if predicted[0] == "tuple" or gold[0] == "tuple":
        return (
            predicted[0] == gold[0] == "tuple"
            and len(predicted[1]) == len(gold[1])
            and all(same_value(p, g, clock) for p, g in zip(predicted[1], gold[1]))
        )
    names = sorted(_variables(predicted) | _variables(gold))
    for _ in range(RANDOM_POINTS if names else 1):
        point = {name: _RNG.uniform(0.5, 2.5) for name in names}
        if not _close(evaluate(predicted, point, clock), evaluate(gold, point, clock)):
            return False
    return True


def _prose_number(text: str) -> str | None:
    """The one number in prose like "The answer is 17" (no operators: `2**5` is not 5)."""
    match = _PROSE_NUMBER.fullmatch(text)
    return match.group(1) if match else None


def is_equivalent(predicted: str | None, gold: str, *, time_limit_s: float = CHECK_TIME_LIMIT_S) -> bool:
    """Whether `predicted` denotes the same value as `gold`, at bounded cost (see module docstring).

    Anything refused (too long, too large, too deep, past `time_limit_s`) is not equivalent.
    """
    if predicted is None or len(predicted) > MAX_ANSWER_CHARS:
        return False
    p, g = normalize(predicted), normalize(gold)
    if not p:
        return False
    if p == g or p.replace(" ", "") == g.replace(" ", ""):
        return True
    clock = _Clock(time_limit_s)
    try:
        gold_tree = parse(g)
    except Refused:
        return False
    for candidate in (p, _prose_number(p)):
        if candidate is None:
            continue
        try:
            return same_value(parse(candidate), gold_tree, clock)
        except Refused:
            continue
    return False
