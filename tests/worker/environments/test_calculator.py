"""The calculator's whitelist parser: exact big-integer arithmetic, refusals with reasons."""

from __future__ import annotations

import pytest

from worker.environments.calculator import MAX_BITS, CalculatorError, calculator

A, B = 98765432109876543210, 12345678901234567890


@pytest.mark.parametrize(
    ("expression", "want"),
    [
        ("123456789 * 987654321", str(123456789 * 987654321)),
        (f"{A} * {B}", str(A * B)),
        ("(2 + 3) * -4", "-20"),
        ("2 ** 100", str(2**100)),
        ("7 / 2", "3.5"),
        ("10**30 / 10**10", str(10**20)),  # exact when it divides
        ("17 // 5 + 17 % 5", "5"),
        ("1.5 * 4", "6"),
        ("0.1 + 0.2", repr(0.1 + 0.2)),
        ("+-+3", "-3"),
    ],
)
def test_values(expression: str, want: str) -> None:
    assert calculator(expression) == want


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        ("__import__('os')", "Call is not allowed"),
        ("os.system('id')", "Call is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("'a' * 10", "only numbers are allowed (got str)"),
        ("True + 1", "only numbers are allowed (got bool)"),
        ("[1] * 3", "List is not allowed"),
        ("(1).__class__", "Attribute is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 5000", f"more than {MAX_BITS} bits"),
        (f"{10**600} * {10**700}", f"more than {MAX_BITS} bits"),
        ("10.0 ** 400", "too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "not an arithmetic expression"),
        ("1 << 4", "LShift is not allowed"),
        ("1 +" * 1000 + "1", "longer than"),
        ("(" * 500 + "1" + ")" * 500, "nested"),
        ("1 1", "not an arithmetic expression"),
    ],
)
def test_refusals(expression: str, needle: str) -> None:
    with pytest.raises(CalculatorError) as info:
        calculator(expression)
    assert needle in str(info.value)
