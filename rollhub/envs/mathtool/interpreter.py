"""A bounded arithmetic interpreter over Python's `ast`: the tool backend that needs no Docker.

Why not `eval`: the code comes from a policy that is paid for whatever it gets away with, and
`eval` (even with empty builtins) reaches the host through attribute chains
(`().__class__.__base__.__subclasses__()`), never ends on `while True: pass` and builds
`9**9**9` synchronously on the event loop, freezing every other trajectory. So nothing here is
compiled or executed: the tree is walked by a small evaluator that knows only numbers, strings
for printing, names, `+ - * / // % **`, unary signs and a short list of pure functions.
Everything with a cost is capped *before* it is computed:

* source length (`MAX_SOURCE_CHARS`) and statement count, before and after parsing; the parser
  itself refuses deep nesting (SyntaxError / RecursionError are caught);
* the size of every integer (`MAX_INT_BITS`), judged from the operands before a `*` or `**`
  happens (a power's result size is estimated as the exponent times log2 of the base); floats
  that overflow are errors, not `inf`;
* three-argument `pow` by its exponent's and modulus' bits (`MAX_MODULAR_POW_BITS`): its cost
  grows with their product, so a cap on the result alone let one call run 0.5 s;
* nodes visited (`MAX_STEPS`) and a CPU-time deadline (`time_limit_s`), checked every 8 nodes
  (no node costs more than about 3 ms, so a run stops within a few ms of its limit);
* string sizes, and printed text: one printed or `str()`'d value is rendered piece by piece and
  refused the moment it passes `MAX_STRING_CHARS` (names of tuples of names describe 10^10
  characters in 140), everything a run prints is capped at `MAX_PRINTED_CHARS`, and what comes
  back is cut to `max_output_chars` (head and tail kept).

The env never calls this module on its event loop: `tool_worker.py` runs it in worker processes
with a memory limit and kills one that overruns, the backstop for any cost a cap here misses.

What typical model-written code looks like is accepted: `print(4821 * 377)`, assignments
(`a = 4821; b = 377; print(a * b)`), augmented assignments, `import math` and `math.sqrt(...)`,
f-strings with plain fields, and a bare last expression, whose value is printed like a
notebook cell does (a 135M model often writes `4821 * 377` without `print`). Loops,
definitions, attribute access beyond `math.<name>`, imports of anything else, and so on are
refused with a one-line error in Python's words (`NotImplementedError: ...`), which the tool
returns as its output: the episode goes on.
"""

from __future__ import annotations

import ast
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_SOURCE_CHARS = 4000
MAX_STATEMENTS = 64
MAX_STEPS = 20_000  # nodes visited per run
MAX_INT_BITS = 4096  # about 1233 decimal digits: far beyond any problem here, far below a stall
MAX_STRING_CHARS = 10_000  # every string, and the text of one printed or str()'d value
MAX_PRINTED_CHARS = 100_000  # everything one run prints, before the head-and-tail cut
MAX_PRINT_DEPTH = 50  # nesting of a printed container
MAX_MODULAR_POW_BITS = 1024  # exponent and modulus of pow(a, b, m): a 4096-bit one takes 0.5 s
MAX_FACTORIAL = 300
DEFAULT_TIME_LIMIT_S = 0.2
DEFAULT_MAX_OUTPUT_CHARS = 2000


class ToolError(Exception):
    """An error the code caused; its text (Python's exception name and message) is the tool's output."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass
class RunResult:
    """What one run printed, and the error that stopped it (None when it ran to the end)."""

    output: str
    error: str | None = None
    truncated: bool = False
    steps: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    def text(self) -> str:
        """The output as a terminal would show it: what was printed, then the error line."""
        parts = [self.output.rstrip("\n")] if self.output.strip() else []
        if self.error:
            parts.append(self.error)
        return "\n".join(parts)


Number = int | float


def _check_int(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError("OverflowError", f"integer result over {MAX_INT_BITS} bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("OverflowError", "float result out of range")
    return value


def _number(value: Any, what: str) -> Number:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError("TypeError", f"{what} must be a number, got {type(value).__name__}")
    return value


def _bits(value: Number) -> int:
    if isinstance(value, float):
        return 64
    return max(1, abs(value).bit_length())


def _power(base: Any, exponent: Any, modulus: Any = None) -> Number:
    base, exponent = _number(base, "base"), _number(exponent, "exponent")
    if modulus is not None:  # three-argument pow: cost bounded by the modulus' size, not the exponent
        modulus = _number(modulus, "modulus")
        if not all(isinstance(v, int) for v in (base, exponent, modulus)):
            raise ToolError("TypeError", "pow() 3rd argument not allowed unless all arguments are integers")
        if modulus == 0:
            raise ToolError("ValueError", "pow() 3rd argument cannot be 0")
        if _bits(base) > MAX_INT_BITS:
            raise ToolError("OverflowError", f"pow() argument over {MAX_INT_BITS} bits")
        if _bits(exponent) > MAX_MODULAR_POW_BITS or _bits(modulus) > MAX_MODULAR_POW_BITS:
            # its cost grows with the exponent's bits times the modulus' bits squared: judged here
            raise ToolError("OverflowError", f"pow() exponent or modulus over {MAX_MODULAR_POW_BITS} bits")
        try:
            return pow(base, exponent, modulus)
        except ValueError as exc:  # base not invertible for a negative exponent
            raise ToolError("ValueError", str(exc)) from None
    if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
        if abs(base) > 1 and exponent * math.log2(abs(base)) > MAX_INT_BITS:  # judged before computing
            raise ToolError("OverflowError", f"integer result over {MAX_INT_BITS} bits")
        return base**exponent
    try:
        result = float(base) ** float(exponent) if isinstance(exponent, float) or exponent < 0 else base**exponent
    except ZeroDivisionError:
        raise ToolError("ZeroDivisionError", "0.0 cannot be raised to a negative power") from None
    except OverflowError:
        raise ToolError("OverflowError", "result too large") from None
    if isinstance(result, complex):
        raise ToolError("ValueError", "negative number to a fractional power (complex result)")
    return _check_int(result)


def _binary(op: ast.operator, left: Any, right: Any) -> Any:
    if isinstance(op, ast.Add) and isinstance(left, str) and isinstance(right, str):
        if len(left) + len(right) > MAX_STRING_CHARS:
            raise ToolError("MemoryError", "string too long")
        return left + right
    if isinstance(op, ast.Mult) and {type(left), type(right)} == {str, int}:
        text, count = (left, right) if isinstance(left, str) else (right, left)
        if len(text) * max(count, 0) > MAX_STRING_CHARS:
            raise ToolError("MemoryError", "string too long")
        return text * count
    left, right = _number(left, "operand"), _number(right, "operand")
    if isinstance(op, ast.Pow):
        return _power(left, right)
    if isinstance(op, ast.Mult) and _bits(left) + _bits(right) > MAX_INT_BITS + 1:
        raise ToolError("OverflowError", f"integer result over {MAX_INT_BITS} bits")
    try:
        if isinstance(op, ast.Add):
            return _check_int(left + right)
        if isinstance(op, ast.Sub):
            return _check_int(left - right)
        if isinstance(op, ast.Mult):
            return _check_int(left * right)
        if isinstance(op, ast.Div):
            return _check_int(left / right)
        if isinstance(op, ast.FloorDiv):
            return _check_int(left // right)
        if isinstance(op, ast.Mod):
            return _check_int(left % right)
    except ZeroDivisionError as exc:
        raise ToolError("ZeroDivisionError", str(exc)) from None
    except OverflowError as exc:
        raise ToolError("OverflowError", str(exc)) from None
    symbol = {ast.BitXor: "^", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>"}
    name = symbol.get(type(op), type(op).__name__)
    hint = " (for powers write **)" if isinstance(op, ast.BitXor) else ""
    raise ToolError("NotImplementedError", f"operator {name} is not supported{hint}")


def _factorial(n: Any) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ToolError("ValueError", "factorial() only accepts non-negative integers")
    if n > MAX_FACTORIAL:
        raise ToolError("OverflowError", f"factorial() argument over {MAX_FACTORIAL}")
    return math.factorial(n)


def _sqrt(x: Any) -> float:
    x = _number(x, "sqrt() argument")
    if x < 0:
        raise ToolError("ValueError", "math domain error")
    return math.sqrt(x)


def _isqrt(x: Any) -> int:
    if not isinstance(x, int) or x < 0:
        raise ToolError("ValueError", "isqrt() argument must be a non-negative integer")
    return math.isqrt(x)


def _int(x: Any = 0) -> int:
    if isinstance(x, str):
        text = x.strip().replace("_", "")
        if len(text) > 400 or not text.lstrip("+-").isdigit():
            raise ToolError("ValueError", f"invalid literal for int(): {x[:40]!r}")
        return int(text)
    x = _number(x, "int() argument")
    return int(x)


def _float(x: Any = 0.0) -> float:
    if isinstance(x, str):
        try:
            return _check_int(float(x[:400]))
        except ValueError:
            raise ToolError("ValueError", f"could not convert string to float: {x[:40]!r}") from None
    x = _number(x, "float() argument")
    try:
        return float(x)
    except OverflowError:
        raise ToolError("OverflowError", "int too large to convert to float") from None


def _round(x: Any, digits: Any = None) -> Number:
    x = _number(x, "round() argument")
    if digits is None:
        return round(x)
    if not isinstance(digits, int) or abs(digits) > 100:
        raise ToolError("ValueError", "round() digits must be an integer in -100..100")
    return round(x, digits)


def _divmod(a: Any, b: Any) -> tuple[Number, Number]:
    return (_binary(ast.FloorDiv(), a, b), _binary(ast.Mod(), a, b))


def _gcd(*values: Any) -> int:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ToolError("TypeError", "gcd() arguments must be integers")
    return math.gcd(*values)


def _numbers(args: tuple[Any, ...], name: str) -> list[Number]:
    items = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
    if not items:
        raise ToolError("ValueError", f"{name}() arg is an empty sequence")
    return [_number(v, f"{name}() argument") for v in items]


def _sum(items: Any, start: Any = 0) -> Number:
    if not isinstance(items, (list, tuple)):
        raise ToolError("TypeError", "sum() takes a list or tuple of numbers")
    total = _number(start, "sum() start")
    for value in items:
        total = _binary(ast.Add(), total, value)
    return total


#: pure functions the code may call: name -> implementation (arguments are checked inside)
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": lambda x: abs(_number(x, "abs() argument")),
    "round": _round,
    "int": _int,
    "float": _float,
    "pow": _power,
    "divmod": _divmod,
    "min": lambda *a: min(_numbers(a, "min")),
    "max": lambda *a: max(_numbers(a, "max")),
    "sum": _sum,
    "str": lambda x="": _show(x),
}
MATH_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": _sqrt,
    "isqrt": _isqrt,
    "floor": lambda x: math.floor(_number(x, "floor() argument")),
    "ceil": lambda x: math.ceil(_number(x, "ceil() argument")),
    "gcd": _gcd,
    "factorial": _factorial,
    "pow": lambda x, y: _check_int(float(_power(float(_number(x, "base")), _number(y, "exponent")))),
    "fabs": lambda x: math.fabs(_number(x, "fabs() argument")),
}
MATH_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _show(value: Any, limit: int = MAX_STRING_CHARS) -> str:
    """`str(value)` as Python writes it, refused as soon as it would pass `limit` characters.

    Judged piece by piece before each piece is made: a tuple of ten names of a tuple of ten
    names... is 140 characters of code and 10^10 characters of text, so rendering first and
    cutting after would take gigabytes and seconds. An integer's digits are bounded from its
    bits before `str` runs."""
    pieces: list[str] = []
    room = [limit]

    def emit(text: str) -> None:
        room[0] -= len(text)
        if room[0] < 0:
            raise ToolError("MemoryError", f"value too large to print (over {limit} characters)")
        pieces.append(text)

    def render(item: Any, depth: int, quoted: bool) -> None:
        if depth > MAX_PRINT_DEPTH:
            raise ToolError("RecursionError", "value nested too deeply to print")
        if isinstance(item, bool) or item is None or isinstance(item, float):
            emit(str(item))
        elif isinstance(item, int):
            if item.bit_length() > MAX_INT_BITS:
                raise ToolError("OverflowError", "integer too large to print")
            if (item.bit_length() - 1) * 0.30102 > room[0]:  # its digits, at least, judged before str()
                raise ToolError("MemoryError", f"value too large to print (over {limit} characters)")
            emit(str(item))
        elif isinstance(item, str):
            if len(item) > room[0]:
                raise ToolError("MemoryError", f"value too large to print (over {limit} characters)")
            emit(repr(item) if quoted else item)
        elif isinstance(item, (list, tuple)):
            tuple_like = isinstance(item, tuple)
            emit("(" if tuple_like else "[")
            for index, element in enumerate(item):
                if index:
                    emit(", ")
                render(element, depth + 1, True)
            emit(",)" if tuple_like and len(item) == 1 else ")" if tuple_like else "]")
        else:
            raise ToolError("TypeError", f"cannot print a {type(item).__name__}")

    render(value, 0, False)
    return "".join(pieces)


@dataclass(frozen=True)
class _MathFunction:
    """A function bound by `from math import name` (only names of MATH_FUNCTIONS are ever made)."""

    name: str


class _Output:
    """Printed text, kept head and tail once over the cap, so huge output costs bounded memory."""

    def __init__(self, limit: int):
        self.limit = limit
        self.head: list[str] = []
        self.size = 0
        self.tail = ""
        self.dropped = 0
        self.written = 0

    def write(self, text: str) -> None:
        self.written += len(text)
        if self.written > MAX_PRINTED_CHARS:
            raise ToolError("RuntimeError", f"more than {MAX_PRINTED_CHARS} characters printed")
        half = self.limit // 2
        if self.size < half:
            take = text[: half - self.size]
            self.head.append(take)
            self.size += len(take)
            text = text[len(take) :]
        if text:
            joined = self.tail + text
            self.dropped += max(0, len(joined) - half)
            self.tail = joined[-half:] if half else ""

    def value(self) -> tuple[str, bool]:
        head = "".join(self.head)
        if not self.dropped:
            return head + self.tail, False
        return f"{head}\n... [{self.dropped} characters truncated] ...\n{self.tail}", True


class _Interpreter:
    def __init__(self, time_limit_s: float, max_output_chars: int):
        self.names: dict[str, Any] = {}
        self.math_imported = False
        self.steps = 0
        self.deadline = time.thread_time() + time_limit_s
        self.out = _Output(max_output_chars)

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ToolError("TimeoutError", f"more than {MAX_STEPS} evaluation steps")
        if self.steps % 8 == 0 and time.thread_time() > self.deadline:  # no step costs over ~3 ms
            raise ToolError("TimeoutError", "time limit exceeded")

    # --- statements ---------------------------------------------------------------------

    def run(self, tree: ast.Module, echo_last: bool) -> None:
        for index, statement in enumerate(tree.body):
            self.tick()
            last = index == len(tree.body) - 1
            if isinstance(statement, ast.Expr):
                value = self.eval(statement.value)
                if last and echo_last and not _is_print(statement.value) and value is not None:
                    self.out.write(_show(value) + "\n")
            elif isinstance(statement, ast.Assign):
                value = self.eval(statement.value)
                for target in statement.targets:
                    self.assign(target, value)
            elif isinstance(statement, ast.AugAssign):
                if not isinstance(statement.target, ast.Name):
                    raise ToolError("NotImplementedError", "only names can be assigned")
                current = self.lookup(statement.target.id)
                self.names[statement.target.id] = _binary(statement.op, current, self.eval(statement.value))
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                self.assign(statement.target, self.eval(statement.value))
            elif isinstance(statement, (ast.Import, ast.ImportFrom)):
                self.do_import(statement)
            elif isinstance(statement, ast.Pass):
                continue
            else:
                raise ToolError(
                    "NotImplementedError",
                    f"{type(statement).__name__.lower()} statements are not supported: "
                    "use assignments and print(...) of arithmetic",
                )

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            if target.id in FUNCTIONS or target.id == "print":
                raise ToolError("NotImplementedError", f"cannot assign to the built-in {target.id}")
            self.names[target.id] = value
            return
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)):
            if len(target.elts) != len(value):
                raise ToolError("ValueError", f"cannot unpack {len(value)} values into {len(target.elts)} names")
            for element, item in zip(target.elts, value, strict=True):
                self.assign(element, item)
            return
        raise ToolError("NotImplementedError", "only names can be assigned")

    def do_import(self, statement: ast.Import | ast.ImportFrom) -> None:
        if isinstance(statement, ast.Import) and all(a.name == "math" and a.asname is None for a in statement.names):
            self.math_imported = True
            return
        if isinstance(statement, ast.ImportFrom) and statement.module == "math" and not statement.level:
            for alias in statement.names:
                if alias.name in MATH_FUNCTIONS or alias.name in MATH_CONSTANTS:
                    key = alias.asname or alias.name
                    self.names[key] = MATH_CONSTANTS.get(alias.name) or _MathFunction(alias.name)
                else:
                    raise ToolError("ImportError", f"cannot import name {alias.name!r} from 'math'")
            return
        raise ToolError("ImportError", "only the math module is available")

    # --- expressions --------------------------------------------------------------------

    def lookup(self, name: str) -> Any:
        if name in self.names:
            return self.names[name]
        raise ToolError("NameError", f"name {name!r} is not defined")

    def eval(self, node: ast.expr) -> Any:
        self.tick()
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ToolError("NotImplementedError", f"{type(value).__name__} literals are not supported")
            if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
                raise ToolError("MemoryError", "string too long")
            return _check_int(value)
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.BinOp):
            return _binary(node.op, self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand)
            if isinstance(node.op, ast.USub):
                return -_number(operand, "operand")
            if isinstance(node.op, ast.UAdd):
                return +_number(operand, "operand")
            raise ToolError("NotImplementedError", f"operator {type(node.op).__name__} is not supported")
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, (ast.Tuple, ast.List)):
            if len(node.elts) > 1000:
                raise ToolError("MemoryError", "sequence too long")
            items = [self.eval(e) for e in node.elts]
            return tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "math" and self.math_imported:
                if node.attr in MATH_CONSTANTS:
                    return MATH_CONSTANTS[node.attr]
            raise ToolError("NotImplementedError", "attribute access is not supported (only math.<function>)")
        if isinstance(node, ast.JoinedStr):
            return self.fstring(node)
        raise ToolError("NotImplementedError", f"{type(node).__name__} expressions are not supported")

    def fstring(self, node: ast.JoinedStr) -> str:
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue) and value.format_spec is None and value.conversion == -1:
                parts.append(_show(self.eval(value.value)))
            else:
                raise ToolError("NotImplementedError", "f-string format specs and conversions are not supported")
            if sum(len(p) for p in parts) > MAX_STRING_CHARS:
                raise ToolError("MemoryError", "string too long")
        return "".join(parts)

    def function(self, func: ast.expr) -> tuple[str, Callable[..., Any] | None]:
        """(name, implementation) of a call's target; None for print."""
        if isinstance(func, ast.Name):
            if func.id == "print":
                return "print", None
            bound = self.names.get(func.id)
            if isinstance(bound, _MathFunction):  # from math import sqrt
                return bound.name, MATH_FUNCTIONS[bound.name]
            if func.id in FUNCTIONS and func.id not in self.names:
                return func.id, FUNCTIONS[func.id]
            raise ToolError("NameError", f"name {func.id!r} is not defined")
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math":
            if not self.math_imported:
                raise ToolError("NameError", "name 'math' is not defined (write import math first)")
            if func.attr in MATH_FUNCTIONS:
                return f"math.{func.attr}", MATH_FUNCTIONS[func.attr]
            raise ToolError("AttributeError", f"module 'math' has no supported function {func.attr!r}")
        raise ToolError("NotImplementedError", "only calls of built-in arithmetic functions are supported")

    def call(self, node: ast.Call) -> Any:
        name, implementation = self.function(node.func)
        if len(node.args) > 1000:
            raise ToolError("TypeError", "too many arguments")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise ToolError("NotImplementedError", "*arguments are not supported")
        args = [self.eval(a) for a in node.args]
        keywords = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise ToolError("NotImplementedError", "**keywords are not supported")
            keywords[keyword.arg] = self.eval(keyword.value)
        if implementation is None:
            sep, end = keywords.pop("sep", " "), keywords.pop("end", "\n")
            if keywords or not isinstance(sep, str) or not isinstance(end, str):
                raise ToolError("TypeError", "print() takes values and the sep= and end= strings")
            if len(sep) > MAX_STRING_CHARS or len(end) > MAX_STRING_CHARS:
                raise ToolError("MemoryError", "string too long")
            for index, arg in enumerate(args):  # one argument at a time: each is bounded when made
                self.out.write((sep if index else "") + _show(arg))
            self.out.write(end)
            return None
        if keywords:
            raise ToolError("TypeError", f"{name}() takes no keyword arguments here")
        try:
            return _check_int(implementation(*args))
        except ToolError:
            raise
        except TypeError as exc:  # wrong number of arguments
            raise ToolError("TypeError", f"{name}(): {str(exc).split(': ')[-1][:80]}") from None
        except (ValueError, OverflowError, ZeroDivisionError) as exc:
            raise ToolError(type(exc).__name__, str(exc)[:120]) from None


def _is_print(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"


def _parse(source: str, mode: str) -> ast.AST:
    if len(source) > MAX_SOURCE_CHARS:
        raise ToolError("ValueError", f"code of {len(source)} characters is over the limit of {MAX_SOURCE_CHARS}")
    if "\x00" in source:
        raise ToolError("SyntaxError", "source code cannot contain null bytes")
    try:
        return ast.parse(source, mode=mode)
    except SyntaxError as exc:
        line = f" (line {exc.lineno})" if exc.lineno else ""
        raise ToolError("SyntaxError", f"{exc.msg}{line}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ToolError("SyntaxError", "code nested too deeply") from None


def run_code(
    source: str,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    echo_last: bool = True,
) -> RunResult:
    """Run `source` (a small Python program of arithmetic) under every cap; never raises.

    The printed text comes back with the error that stopped the program, if any, as a terminal
    would show them (what was printed before an error stays)."""
    interpreter = _Interpreter(time_limit_s, max_output_chars)
    error = None
    try:
        tree = _parse(source, "exec")
        assert isinstance(tree, ast.Module)
        if len(tree.body) > MAX_STATEMENTS:
            raise ToolError("ValueError", f"more than {MAX_STATEMENTS} statements")
        interpreter.run(tree, echo_last)
    except ToolError as exc:
        error = str(exc)
    except RecursionError:  # a deep expression tree that the parser still accepted
        error = "RecursionError: expression nested too deeply"
    except (MemoryError, OverflowError, ValueError, TypeError, ArithmeticError) as exc:  # defensive: never raise
        error = f"{type(exc).__name__}: {str(exc)[:120]}"
    output, truncated = interpreter.out.value()
    return RunResult(output, error, truncated, interpreter.steps)


def evaluate_expression(expression: str, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> RunResult:
    """The calculator: one expression, its value as the output (`math.` functions need no import)."""
    if not isinstance(expression, str):
        return RunResult("", "TypeError: the expression must be a string")
    interpreter = _Interpreter(time_limit_s, DEFAULT_MAX_OUTPUT_CHARS)
    interpreter.math_imported = True
    interpreter.names.update(MATH_CONSTANTS)
    interpreter.names.update({name: _MathFunction(name) for name in MATH_FUNCTIONS if name not in FUNCTIONS})
    try:
        tree = _parse(expression.strip(), "eval")
        assert isinstance(tree, ast.Expression)
        value = interpreter.eval(tree.body)
        return RunResult(_show(value), None, False, interpreter.steps)
    except ToolError as exc:
        return RunResult("", str(exc), False, interpreter.steps)
    except RecursionError:
        return RunResult("", "RecursionError: expression nested too deeply")
    except (MemoryError, OverflowError, ValueError, TypeError, ArithmeticError) as exc:
        return RunResult("", f"{type(exc).__name__}: {str(exc)[:120]}")
