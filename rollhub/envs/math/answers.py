"""Answer extraction and equivalence checking for verifiable math rewards.

Extraction order: the last `\\boxed{...}` inside the answer tag, else the tag's content,
else (format not followed) the last `\\boxed{...}`, else the number the reply's final sentence
states (`stated_number`). Equivalence: identical after normalisation, or the same value.
Values come from a small grammar (numbers, `+ - * / ^`, implicit multiplication, sqrt exp log
ln sin cos tan, pi, E, I, single-letter variables, tuples), evaluated as exact rationals where
possible (so `1/2`, `0.5`, `\\frac{1}{2}` and `\\dfrac12` all match, `1/3` is not `0.33`, and
`4^(1/2)` is exactly 2), else in floating point.

Why exact stays exact: a policy is paid for whatever the check lets through. When the gold value
is an exact rational, the answer must be that rational exactly; an approximate answer (`*pi/pi`,
`*sqrt(2)/sqrt(2)`) is not shown equal, because any relative tolerance lets a wrong large integer
through once one approximate factor is appended. A tolerance (REL_TOL of the gold's magnitude,
the rounding of our bounded evaluator and nothing more) applies only when the gold itself is
approximate (irrational or complex), so nothing the policy writes can widen it. Answers with
variables are compared at random rational points drawn afresh on every call (polynomial
identity testing, exact where the expressions are rational: `3x+2` = `2 + 3*x`, and
`x*(1+1e-12)` is not `x`).

Why prose is read so strictly: the tag's content, when it is no expression, is prose such as
"The answer is 17". Taking "the one number in it" credited `not 5`, `5 minus one`, `5!` and
`either 5 or six` as 5. A number counts only when the text states it plainly: the final sentence
names it after words alone (no negation, hedge, alternative, range, operator or number word) or
as the right-hand side of an `=`, and at most a few unit words follow. Anything else is no answer.

Why no sympy and no `eval`: model text is untrusted. `9^9^9`, `1e999999999` or a
100k-digit number kept the old check (Fraction, then sympy) busy for minutes, synchronously
on the event loop, which froze every trajectory and the trainer. A worker thread cannot be
killed and still holds the GIL, so the check is made cheap instead: the answer's length, a
literal's digits and exponent, the nesting depth, every power (by the size of its result)
and the bits of every exact intermediate are capped before anything is computed, values that
under- or overflow floating point are refused, and a deadline (`CHECK_TIME_LIMIT_S`) aborts
whatever is left. An answer over any cap, or one the check cannot finish for any reason, is
"not shown equal" and scores 0: the check never raises.
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
REL_TOL = 1e-12  # approximate golds only: relative to max(1, |gold|), far above float rounding here
RANDOM_POINTS = 4  # evaluations of answers with variables
MAX_ROOT = 64  # largest q of an exponent p/q computed exactly (`8^(2/3)` = 4)
MAX_TAIL_CHARS = 80  # what may follow a stated number: a few unit words and a full stop
CHECK_TIME_LIMIT_S = 0.05  # deadline of one is_equivalent call

# ASCII digits only: a look-alike digit (Arabic-Indic, fullwidth, mathematical bold) is no number
_TOKEN = re.compile(
    r"[ \t\n\r]*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z]+)|(?P<op>\*\*|[-+*/(),]))",
    re.ASCII,
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


# A number as prose writes it: thousands commas, a decimal part, a fraction (ASCII digits only).
_STATED = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?", re.ASCII)
# where a sentence ends: the statement must be in the reply's last one
_SENTENCE_END = re.compile(r"[.!?;](?:\s|$)|\n")
_WORD = re.compile(r"[A-Za-z]+(?:['\u2019][A-Za-z]+)?")
_MARKUP = "*$`"  # emphasis or math delimiters around the number: **17**, $17$
# prose words that change, hedge or contradict the number next to them
_NEGATIONS = frozenset(
    "not no nope nah nor neither never none nothing cannot without except excluding unless instead wait "
    "wrong incorrect false impossible unlikely".split()
)
_HEDGES = frozenset(
    "or either maybe perhaps possibly possible probably likely might may could guess unsure uncertain "
    "approximately approx about around roughly nearly almost circa close estimate estimated between range "
    "ish somewhere least most under over above below exceeds exceeding beyond within".split()
)
_OPERATIONS = frozenset(
    "plus minus times divided multiplied added subtracted add subtract less more fewer greater than "
    "squared cubed square cube power powers exponent factorial sqrt root roots log ln exp sin cos tan mod "
    "modulo negative positive opposite inverse reciprocal double twice triple thrice half halves percent "
    "percentage fraction floor ceiling rounded round".split()
)
_NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred "
    "hundreds thousand thousands million millions billion billions trillion dozen dozens score third "
    "thirds quarter quarters fourth fourths fifth fifths tenth tenths hundredth hundredths thousandth "
    "thousandths point".split()
)
# after the number only unit words may follow: no connective that starts another value
_JOINS = frozenset("and to through thru till until versus vs by".split())


def _words(text: str) -> list[str]:
    return [word.lower().replace("\u2019", "'") for word in _WORD.findall(text)]


def _negated(words: list[str]) -> bool:
    return any(word in _NEGATIONS or word.endswith("n't") for word in words)


def _prose_ok(window: str) -> bool:
    """Words alone before the number ("So, the answer is"): nothing that changes or hedges it."""
    if window.count("**") % 2:  # bold comes in pairs (**Answer:** 17); a lone ** is a power
        return False
    bare = re.sub(r"(?<=[A-Za-z])-(?=[A-Za-z])", "", window.replace("**", ""))  # well-known
    if re.fullmatch(r"[A-Za-z \t\r\n,:'\u2019$]*", bare) is None:
        return False
    words = _words(bare)
    return not (_negated(words) or any(w in _HEDGES or w in _OPERATIONS or w in _NUMBER_WORDS for w in words))


# a variable inside arithmetic (`3x`, `x + 2`, `2*(x`): the left side is an equation, not a computation
_ALGEBRA = re.compile(r"\d[ \t]*[A-Za-z]|[A-Za-z][ \t]*[-+*/^(]|[-+*/^)][ \t]*[A-Za-z]", re.ASCII)


def _equation_ok(window: str) -> bool:
    """An equation whose right-hand side is the number ("23 + 19 = 42", "x = -3")."""
    left = window.rstrip(" \t" + _MARKUP)
    if not left.endswith("=") or left.endswith(("!=", "<=", ">=", "==")):
        return False
    left = left[:-1]
    if re.fullmatch(r"[A-Za-z0-9 \t+\-*/^().,:=]*", left) is None or re.search(r",(?!\d{3})", left):
        return False  # a list (x = 1, y = 2) or a symbol the grammar does not know (~, <, !)
    if _ALGEBRA.search(left):
        return False  # an equation restated (`3x + 2 = 17`): its right-hand side is no solution
    words = _words(left)
    return not (_negated(words) or any(word in _HEDGES for word in words))


def _tail_ok(tail: str) -> bool:
    """After the number: at most three unit words and one full stop (`12 apples.`)."""
    match = re.fullmatch(r"((?:[ \t]+[A-Za-z]{2,}){0,3})[ \t\r\n]*\.?[ \t\r\n]*", tail)
    if match is None:
        return False
    words = _words(match.group(1))
    return not (
        _negated(words) or any(w in _HEDGES or w in _OPERATIONS or w in _NUMBER_WORDS or w in _JOINS for w in words)
    )


def stated_number(text: str) -> str | None:
    """The number `text` plainly states as its answer, or None when it states none unambiguously.

    The last number counts only if the final sentence states it: after words alone (`The answer
    is 17`, `Answer: 17`) or as the right-hand side of an `=` (`23 + 19 = 42`), with no negation,
    hedge, alternative, range, operator or number word in that sentence, nothing but a few unit
    words and a full stop after it, and no other number standing just before it (`5. 6`).
    `not 5`, `5 minus one`, `5!`, `either 5 or six`, `between 5 and 7`, `5, 6`, `~5` and `5?`
    state nothing. Cheap on a huge reply: ten `rfind` calls, then a window of
    2 * MAX_ANSWER_CHARS before the last digit.
    """
    last = max(text.rfind(digit) for digit in "0123456789")
    if last < 0 or len(text) - last - 1 > MAX_TAIL_CHARS:
        return None
    start = max(0, last - 2 * MAX_ANSWER_CHARS)
    head = text[start : last + 1]
    match = next(reversed(list(_STATED.finditer(head))), None)
    if match is None or match.end() != len(head):
        return None
    number, before, tail = match.group(), head[: match.start()], text[last + 1 :]
    if before and before[-1] not in " \t\r\n:=" + _MARKUP:
        return None  # glued to something: 5-1, x5, (5, ~5
    ends = [m.end() for m in _SENTENCE_END.finditer(before)]
    if not ends and start > 0:
        return None  # a final sentence longer than the window: nothing plain about it
    window = before[ends[-1] :] if ends else before
    core = window.rstrip(_MARKUP)
    markup = window[len(core) :]
    if markup and tail.startswith(markup):  # **17** / $17$: the same delimiters close it
        tail = tail[len(markup) :]
    elif markup and markup != "$":  # $12 is a price; a lone ** or ` is not markup
        return None
    if not _tail_ok(tail):
        return None
    if not window.strip(" \t\r\n:" + _MARKUP) and ends:
        previous = before[: ends[-1]].rstrip(" \t\r\n.!?;" + _MARKUP)
        if previous[-1:].isdigit():
            return None  # a list of numbers, one a line or a sentence: 5. 6
    return number if _prose_ok(core) or _equation_ok(core) else None


def extract_answer(text: str, tag: str = "answer") -> tuple[str | None, bool]:
    """(answer text, format_ok). format_ok means the answer tag or a \\boxed{} was used; an
    untagged reply without one answers only with the number it plainly states (`stated_number`)."""
    tagged = extract_tagged(text, tag)
    if tagged is not None:
        boxed = extract_boxed(tagged)
        return (boxed if boxed is not None else tagged), True
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed, True
    return stated_number(text), False


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
    """The check's deadline, consulted at every node (a cooperative time limit).

    Measured in this thread's CPU time: what the answer costs, not what other processes take
    from a loaded machine (on wall time an ordinary answer missed 50 ms now and then there,
    and an honest reply scored 0)."""

    def __init__(self, limit_s: float):
        self.deadline = time.thread_time() + limit_s

    def tick(self) -> None:
        if time.thread_time() > self.deadline:
            raise Refused("time limit")


def _exact(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise Refused("exact value too large")
    return value


def _approx(value: Value) -> complex:
    """`value` in floating point; refused when it over- or underflows (10^-400 is not 0)."""
    try:
        result = complex(value)
    except OverflowError:
        raise Refused("value too large for floating point") from None
    if not (cmath.isfinite(result) and abs(result) <= MAX_MAGNITUDE):
        raise Refused("value too large for floating point")
    if result == 0 and value != 0:
        raise Refused("value too small for floating point")
    return result


def _power(base: Value, exponent: Value) -> Value:
    """base ** exponent; exact only while the result stays under MAX_BITS, judged before computing it."""
    if isinstance(base, Fraction) and isinstance(exponent, Fraction):
        if exponent.denominator == 1:
            return _exact_power(base, exponent.numerator)
        root = _exact_root(base, exponent.denominator)
        if root is not None:
            return _exact_power(root, exponent.numerator)
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


def _integer_root(n: int, q: int) -> int | None:
    """The integer r with r**q == n (n >= 0), or None."""
    if n < 2:
        return n
    root = 1 << -(-n.bit_length() // q)  # at least the root; Newton's steps descend to it
    while True:
        step = ((q - 1) * root + n // root ** (q - 1)) // q
        if step >= root:
            return root if root**q == n else None
        root = step


def _exact_root(base: Fraction, q: int) -> Fraction | None:
    """base ** (1/q) when it is rational (`8^(1/3)` = 2), so a root of a perfect power stays exact."""
    if base < 0 or q > MAX_ROOT:
        return None  # a negative base has a complex principal root
    num, den = _integer_root(base.numerator, q), _integer_root(base.denominator, q)
    return None if num is None or den is None else Fraction(num, den)


def _exact_power(base: Fraction, n: int) -> Fraction:
    if base == 0:
        if n <= 0:
            raise Refused("zero to a non-positive power")  # 0^0 is indeterminate, 0^-1 undefined
        return Fraction(0)
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
    try:
        return _approx(_OPERATORS[op](_approx(left), _approx(right)))
    except (ArithmeticError, ValueError):  # complex division by zero, overflow
        raise Refused(f"{op} out of range") from None


def _call(name: str, argument: Value) -> Value:
    if isinstance(argument, Fraction):
        if name == "sqrt" and argument >= 0:
            num, den = math.isqrt(argument.numerator), math.isqrt(argument.denominator)
            if num * num == argument.numerator and den * den == argument.denominator:
                return Fraction(num, den)  # sqrt(4) stays exact: it is 2, not 2.0000000001
        exact = _EXACT_CALLS.get((name, argument))
        if exact is not None:
            return exact
    try:
        return _approx(_FUNCTIONS[name](_approx(argument)))
    except (ArithmeticError, ValueError):
        raise Refused(f"{name} out of range") from None


# the rational values of the functions at rational points (exp(0) is 1, not 1.0)
_EXACT_CALLS = {
    ("exp", Fraction(0)): Fraction(1),
    ("log", Fraction(1)): Fraction(0),
    ("ln", Fraction(1)): Fraction(0),
    ("sin", Fraction(0)): Fraction(0),
    ("cos", Fraction(0)): Fraction(1),
    ("tan", Fraction(0)): Fraction(0),
}


def evaluate(node: Node, point: dict[str, Fraction], clock: _Clock) -> Value:
    """The value of `node` with variables at `point`; raises Refused over any cap."""
    clock.tick()
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "const":
        return _CONSTANTS[node[1]]
    if kind == "var":
        return point[node[1]]
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


def _close(predicted: Value, gold: Value) -> bool:
    """An exact gold is matched only exactly; an approximate gold within REL_TOL of its own
    magnitude. The tolerance depends on the gold alone, so no factor the policy appends
    (`*pi/pi`, `*sqrt(2)/sqrt(2)`) can widen it or make an exact comparison approximate."""
    if isinstance(gold, Fraction):
        return isinstance(predicted, Fraction) and predicted == gold
    a, b = _approx(predicted), _approx(gold)
    return abs(a - b) <= REL_TOL * max(1.0, abs(b))


def _random_point() -> Fraction:
    """A random rational in [0.5, 2.5] (positive: sqrt and log stay real), 2^21 in the denominator."""
    return Fraction(_RNG.randint(2**20, 5 * 2**20), 2**21)


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
        point = {name: _random_point() for name in names}
        if not _close(evaluate(predicted, point, clock), evaluate(gold, point, clock)):
            return False
    return True


def is_equivalent(predicted: str | None, gold: str, *, time_limit_s: float = CHECK_TIME_LIMIT_S) -> bool:
    """Whether `predicted` denotes the same value as `gold`, at bounded cost (see module docstring).

    Anything refused (too long, too large, too deep, past `time_limit_s`, ambiguous prose) is not
    equivalent, and so is anything the check fails on: a reward check never raises into the env.
    """
    if predicted is None or len(predicted) > MAX_ANSWER_CHARS:
        return False
    try:
        return _equivalent(predicted, gold, _Clock(time_limit_s))
    except (Refused, ArithmeticError, ValueError, TypeError, RecursionError):
        return False


def _equivalent(predicted: str, gold: str, clock: _Clock) -> bool:
    p, g = normalize(predicted), normalize(gold)
    if not p:
        return False
    if p == g or p.replace(" ", "") == g.replace(" ", ""):
        return True
    gold_tree = parse(g)
    try:
        tree = parse(p)
    except Refused:  # prose: graded by the number it plainly states, if any
        number = stated_number(p)
        if number is None:
            return False
        tree = parse(number.replace(",", ""))
    return same_value(tree, gold_tree, clock)
