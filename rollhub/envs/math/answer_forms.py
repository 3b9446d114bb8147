"""Final answers read as literals of the form the problem states, never as expressions.

Why: a checker that evaluates whatever the answer writes pays for copying the question. With
`<answer>4821 * 377</answer>` graded by value, echoing the question's expression scored 1 on most
procedural problems without any work (and on MathTool without calling the tool). So every
procedural problem states the form of its answer (`FORM_STATEMENTS`, shown after the question)
and the answer must be a literal of that form; its value is then compared exactly.

Forms:
* `integer`: `-?digits`, thousands separators allowed only as correctly grouped commas
  (`1,817,517`): a grouping real models write, and unambiguous (`5,6` is two answers, refused).
* `fraction` (a reduced fraction): `a/b` or `\\frac{a}{b}` in lowest terms with b > 0 and the sign
  in front, or an integer (a fraction whose denominator is 1). `6/8` is not reduced: refused.
* `decimal`: an integer or `digits.digits`.
* `number` (a dataset gold that is a plain number, where the problem states no form): any one
  of the above, unreduced fractions included, compared by value.
* `expression` (a dataset gold that is no plain number, e.g. MATH's `2\\sqrt{2}`): the bounded
  evaluating checker `answers.is_equivalent`, since there the answer's form is an expression; but
  an answer that restates one of the question's own math spans (`$\\sqrt{50}$` answered
  `\\sqrt{50}`) is 0 however it evaluates, unless it is the gold itself: "simplify" and "expand"
  questions are equivalent to their answers by construction, so evaluating would pay the copy.

Harmless wrapping a real model writes is removed first: surrounding whitespace, one trailing full
stop, paired `$...$`, `\\(...\\)`, `\\[...\\]` or `**...**`, a dollar sign in front (`$12`), and,
when the problem asks for an unknown, `x =` in front (`x = 5` for "Solve for x"), and an opening
"The answer is" or "Answer:" (the untagged reading accepts that prose too). Characters: ASCII
digits only; the one non-ASCII character read is the minus sign U+2212 (typeset minus). Fullwidth,
Arabic-Indic, superscript or other look-alike digits, spaces inside a number, several answers
(`5, 6`, `5 or 6`), prose, units, parentheses, operators and an empty answer are no answer: 0.
"""

from __future__ import annotations

import re
from fractions import Fraction
from math import gcd

from rollhub.envs.math.answers import is_equivalent

FORMS = ("integer", "fraction", "decimal", "number", "expression")
#: the sentence shown after a procedural question, so the model knows the form it is graded on
FORM_STATEMENTS = {
    "integer": "Give the answer as an integer.",
    "fraction": "Give the answer as a reduced fraction.",
    "decimal": "Give the answer as a decimal number.",
}
MAX_LITERAL_CHARS = 120  # a longer answer is no literal of ours (golds here have under 20 digits)
UNICODE_MINUS = "\u2212"

_INTEGER = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
_INTEGER_RE = re.compile(rf"(?P<sign>-?)(?P<int>{_INTEGER})", re.ASCII)
_DECIMAL_RE = re.compile(rf"(?P<sign>-?)(?P<int>{_INTEGER})?\.(?P<frac>\d+)", re.ASCII)
_SLASH_RE = re.compile(r"(?P<sign>-?)(?P<num>\d+)/(?P<den>\d+)", re.ASCII)
_LATEX_RE = re.compile(r"(?P<sign>-?)\\[dt]?frac\{(?P<num>\d+)\}\{(?P<den>\d+)\}", re.ASCII)
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))
#: "The answer is 42." / "Answer: 42" inside the tag: refusing it would teach a policy to drop the tag,
#: which untagged grading reads the same way
_ANSWER_PHRASE = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:)\s*", re.IGNORECASE)


def _unwrap(text: str, unknown: str) -> str:
    """The answer without the harmless wrapping listed in the module docstring."""
    text = _ANSWER_PHRASE.sub("", text.strip(), count=1)
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1].rstrip()
    for opening, closing in _WRAPPERS:
        if len(text) > len(opening) + len(closing) and text.startswith(opening) and text.endswith(closing):
            text = text[len(opening) : -len(closing)].strip()
            break
    if text.startswith("$") and "$" not in text[1:]:  # a price: $12
        text = text[1:]
    if unknown:
        match = re.fullmatch(rf"{re.escape(unknown)}[ \t]*=[ \t]*(.*)", text, flags=re.DOTALL)
        if match:
            text = match.group(1)
    return text.replace(UNICODE_MINUS, "-")


def _integer(match: re.Match[str]) -> int:
    return int(match.group("int").replace(",", ""))


def _signed(sign: str, value: Fraction) -> Fraction:
    return -value if sign else value


def read_literal(answer: str | None, form: str, unknown: str = "") -> Fraction | None:
    """The value of `answer` when it is one literal of `form`, else None (never raises)."""
    if answer is None or len(answer) > MAX_LITERAL_CHARS or form not in FORMS or form == "expression":
        return None
    text = _unwrap(answer, unknown)
    if not text.isascii():
        return None
    match = _INTEGER_RE.fullmatch(text)
    if match:
        return _signed(match.group("sign"), Fraction(_integer(match)))
    if form in ("decimal", "number"):
        match = _DECIMAL_RE.fullmatch(text)
        if match:
            whole = _integer(match) if match.group("int") else 0
            digits = match.group("frac")
            return _signed(match.group("sign"), whole + Fraction(int(digits), 10 ** len(digits)))
    if form in ("fraction", "number"):
        match = _SLASH_RE.fullmatch(text) or _LATEX_RE.fullmatch(text)
        if match:
            numerator, denominator = int(match.group("num")), int(match.group("den"))
            if denominator == 0 or (form == "fraction" and gcd(numerator, denominator) != 1):
                return None  # not a number, or not the reduced fraction the problem asks for
            return _signed(match.group("sign"), Fraction(numerator, denominator))
    return None


def infer_form(gold: str) -> str:
    """The form of a dataset gold, whose problem states none: `number` when the gold is a plain
    number (GSM8K's `72`, `1,250`, `0.75`, `\\frac{3}{4}`), else `expression`."""
    return "number" if read_literal(gold, "number") is not None else "expression"


def answer_is_correct(
    answer: str | None,
    gold: str,
    form: str = "",
    unknown: str = "",
    *,
    time_limit_s: float = 0.05,
    question: str = "",
) -> bool:
    """Whether `answer` is the gold in the problem's form (`form` "" = inferred from the gold)."""
    form = form or infer_form(gold)
    if form == "expression":
        if answer is not None and restates_question_math(answer, question) and _squeezed(answer) != _squeezed(gold):
            return False
        return is_equivalent(answer, gold, time_limit_s=time_limit_s)
    value = read_literal(answer, form, unknown)
    return value is not None and value == read_literal(gold, form, unknown)


#: the math a question writes: `$$...$$`, `$...$`, `\\(...\\)`, `\\[...\\]`
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)


def _squeezed(text: str) -> str:
    return "".join(text.split()).strip("$").removeprefix("\\(").removesuffix("\\)").rstrip(".")


def restates_question_math(answer: str, question: str) -> bool:
    """Whether `answer` (spaces ignored, harmless wrapping removed) is one of `question`'s math spans."""
    if not question:
        return False
    spans = {_squeezed(next(g for g in match.groups() if g)) for match in _MATH_SPAN.finditer(question[:4000])}
    return _squeezed(answer) in spans - {""}
