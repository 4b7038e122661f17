"""The `calculator` tool on a worker: protocol/calculator.py's pure calculator, whose refusals
are `ToolFailed` here so the sandbox shows their message to the model as the tool's error."""

from __future__ import annotations

from protocol import calculator as _pure
from protocol.calculator import DESCRIPTION, MAX_BITS, MAX_EXPRESSION_CHARS, SCHEMA, evaluate
from worker.environments.sandbox import ToolFailed

__all__ = [
    "DESCRIPTION",
    "MAX_BITS",
    "MAX_EXPRESSION_CHARS",
    "SCHEMA",
    "CalculatorError",
    "calculator",
    "evaluate",
]


class CalculatorError(ToolFailed, _pure.CalculatorError):
    """An expression the calculator refuses; the message is shown to the model."""


def calculator(expression: str) -> str:
    """The tool: the value as text (integers exact, floats with repr's precision)."""
    try:
        return _pure.calculator(expression)
    except _pure.CalculatorError as exc:
        raise CalculatorError(str(exc)) from None
