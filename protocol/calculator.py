"""The `calculator` tool: arithmetic on numbers, read by a whitelist parser (never `eval`).

The expression is parsed with `ast.parse(mode="eval")` and only these nodes are walked:
numbers (int, float), + - * / // % ** and unary + -, and parentheses (which the parser turns
into nesting). Everything else (names, calls, attributes, subscripts, strings, comparisons)
is refused with the node's kind. Integers may be big, up to MAX_BITS bits: a product or power
whose result would be bigger is refused before it is computed.

Pure and deterministic, so it lives here: a worker runs it in its tool sandbox's child
processes (worker/environments/calculator.py wraps it), the learner re-runs it on the calls a
trajectory records and rejects the batch `env_mismatch` when a result differs
(learner/env_check.py).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

MAX_EXPRESSION_CHARS = 2000
MAX_BITS = 4096  # about 1233 decimal digits; Python prints ints up to 4300 digits
MAX_FLOAT = 1e300

Number = int | float


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is shown to the model."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _check_int(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalculatorError(f"the result has more than {MAX_BITS} bits")
    if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= MAX_FLOAT):
        raise CalculatorError("the result is too large for a float")
    return value


def _bits(value: Number) -> float:
    if isinstance(value, int):
        return value.bit_length()
    return math.log2(abs(value)) + 1 if value else 0.0


def _power(base: Number, exp: Number) -> Number:
    if isinstance(exp, int) and abs(exp) > 100_000:
        raise CalculatorError(f"the exponent {exp} is too large")
    if isinstance(exp, int | float) and exp > 0 and _bits(base) * exp > MAX_BITS + 1:
        raise CalculatorError(f"the result has more than {MAX_BITS} bits")
    if base == 0 and exp < 0:
        raise CalculatorError("division by zero")
    result = base**exp
    if isinstance(result, complex):
        raise CalculatorError("the result is not a real number")
    return result


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b  # exact for big integers, where a float would round
    return a / b


def _binary(node: ast.BinOp) -> Number:
    left, right = _eval(node.left), _eval(node.right)
    op = type(node.op)
    if op is ast.Pow:
        return _power(left, right)
    if op is ast.Div:
        return _divide(left, right)
    if op is ast.Mult and _bits(left) + _bits(right) > MAX_BITS + 1:
        raise CalculatorError(f"the result has more than {MAX_BITS} bits")
    if op in (ast.FloorDiv, ast.Mod) and right == 0:
        raise CalculatorError("division by zero")
    if op not in _BINARY:
        raise CalculatorError(f"the operator {op.__name__} is not allowed")
    return _BINARY[op](left, right)  # type: ignore[no-any-return]


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculatorError(f"only numbers are allowed (got {type(value).__name__})")
        return _check_int(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        return _check_int(_binary(node))
    raise CalculatorError(f"{type(node).__name__} is not allowed: only numbers and + - * / // % **")


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; CalculatorError when refused."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        why = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise CalculatorError(f"not an arithmetic expression: {why}") from None
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None
    try:
        return _eval(tree.body)
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None
    except OverflowError:
        raise CalculatorError("the result is too large for a float") from None


def calculator(expression: str) -> str:
    """The tool: the value as text (integers exact, floats with repr's precision)."""
    if not isinstance(expression, str):
        raise CalculatorError("expression must be a string")
    value = evaluate(expression)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


SCHEMA = {
    "type": "object",
    "properties": {
        "expression": {
            "type": "string",
            "description": "Arithmetic with numbers, + - * / // % ** and parentheses, "
            "e.g. 12345 * 6789.",
        }
    },
    "required": ["expression"],
}
DESCRIPTION = "Evaluate an arithmetic expression exactly (big integers allowed)."
