"""Answer extraction and equivalence checking for verifiable math rewards.

Extraction order: the last `\\boxed{...}` inside the answer tag, else the tag's content,
else (format not followed) the last `\\boxed{...}` or the final number anywhere in the text.
Equivalence: identical after normalisation, equal as exact rationals, or equal under sympy
(so `1/2`, `0.5`, `\\frac{1}{2}` and `\\dfrac12` all match).

Model text is untrusted and sympy's parser evaluates Python, so only a whitelist of
characters and names ever reaches it, and huge powers are refused before evaluation.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

from rollhub.envs.base import extract_action

logger = logging.getLogger(__name__)

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_SAFE_CHARS = re.compile(r"^[0-9a-zA-Z+\-*/().,\s]*$")
_ALLOWED_NAMES = {"sqrt", "pi", "oo", "log", "ln", "exp", "sin", "cos", "tan", "E", "I"}
_MAX_EXPRESSION_CHARS = 120


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (nested braces allowed)."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i].strip()
    return None


def final_number(text: str) -> str | None:
    """The last number in `text` (commas as thousands separators allowed)."""
    matches = _NUMBER.findall(text)
    return matches[-1].rstrip(",") if matches else None


def extract_answer(text: str, tag: str = "answer") -> tuple[str | None, bool]:
    """(answer text, format_ok). format_ok means the answer tag or a \\boxed{} was used."""
    tagged = extract_action(text, tag)
    if tagged is not None:
        boxed = extract_boxed(tagged)
        return (boxed if boxed is not None else tagged), True
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed, True
    return final_number(text), False


def _replace_frac(text: str) -> str:
    """\\frac{a}{b} -> ((a)/(b)), also the brace-less \\frac12 form."""
    text = re.sub(r"\\[dt]?frac\s*(\d)\s*(\d)", r"((\1)/(\2))", text)
    pattern = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
    previous = None
    while previous != text:
        previous, text = text, pattern.sub(r"((\1)/(\2))", text)
    return text


def normalize(answer: str) -> str:
    """Strip LaTeX decoration, units of formatting and a leading `x =`."""
    s = answer.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\mathrm\{([^{}]*)\}", r"\1", s)
    for token in (
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
    s = _replace_frac(s)
    s = re.sub(r"\\sqrt\s*\{([^{}]*)\}", r"sqrt(\1)", s)
    s = re.sub(r"\\sqrt\s*(\d+)", r"sqrt(\1)", s)
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("\\pi", "pi")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    s = s.rstrip(".").strip()
    return re.sub(r"\s+", " ", s)


def _as_fraction(s: str) -> Fraction | None:
    try:
        return Fraction(s.replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _safe_for_sympy(s: str) -> bool:
    if len(s) > _MAX_EXPRESSION_CHARS or not _SAFE_CHARS.match(s):
        return False
    if re.search(r"[a-zA-Z_]\s*\.", s):  # attribute access
        return False
    names = re.findall(r"[a-zA-Z]+", s)
    if any(len(n) > 1 and n not in _ALLOWED_NAMES for n in names):
        return False
    # refuse towers and big exponents (9**9**9 would hang the trainer)
    if s.count("**") > 2 or re.search(r"\*\*\s*\(?\s*-?\d{3,}", s):
        return False
    return True


def _sympy_equal(a: str, b: str) -> bool:
    if not (_safe_for_sympy(a) and _safe_for_sympy(b)):
        return False
    import sympy
    from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

    transformations = standard_transformations + (implicit_multiplication_application,)
    names = {"ln": sympy.log, "E": sympy.E, "I": sympy.I, "pi": sympy.pi}
    try:
        left = parse_expr(a, transformations=transformations, local_dict=names)
        right = parse_expr(b, transformations=transformations, local_dict=names)
        if isinstance(left, tuple) or isinstance(right, tuple):
            return (
                isinstance(left, tuple)
                and isinstance(right, tuple)
                and len(left) == len(right)
                and all(sympy.simplify(x - y) == 0 for x, y in zip(left, right))
            )
        difference = sympy.simplify(left - right)
        if difference == 0:
            return True
        if difference.is_number:
            return abs(complex(difference)) <= 1e-6 * max(1.0, abs(complex(right)))
    except Exception:  # any parse/eval failure means "not shown equal"
        logger.debug("sympy could not compare %r and %r", a, b, exc_info=True)
    return False


def is_equivalent(predicted: str | None, gold: str) -> bool:
    """Whether `predicted` denotes the same value as `gold`."""
    if predicted is None:
        return False
    p, g = normalize(predicted), normalize(gold)
    if not p:
        return False
    if p == g or p.replace(" ", "") == g.replace(" ", ""):
        return True
    pf, gf = _as_fraction(p), _as_fraction(g)
    if pf is not None and gf is not None:
        return pf == gf
    if _sympy_equal(p, g):
        return True
    # "The answer is 42" inside the tag: fall back to its final number
    number = final_number(p)
    return number is not None and number != p and gf is not None and _as_fraction(number) == gf
