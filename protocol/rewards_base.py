"""What every built-in reward shares (protocol/rewards.py lists them): the error type, a
completion as text and the last number of a text."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")


class RewardError(ValueError):
    """A reward that cannot be resolved or returned something unusable. `code` (snake_case)
    and `kwarg` (the keyword argument at fault) let run validation say where and what."""

    def __init__(self, message: str, *, code: str = "config_rule", kwarg: str | None = None):
        super().__init__(message)
        self.code = code
        self.kwarg = kwarg


def text_of(completion: Any) -> str:
    """A completion as text: a string, or TRL's conversational [{role, content}] form (the
    last message's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def to_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        return None


def last_number_text(text: str) -> str | None:
    """The last integer or decimal number in `text` as written (thousands separators kept)."""
    found = NUMBER.findall(text)
    return found[-1] if found else None


def last_number(text: str) -> Decimal | None:
    """The last integer or decimal number in `text` (thousands separators allowed)."""
    found = last_number_text(text)
    return to_decimal(found) if found is not None else None
