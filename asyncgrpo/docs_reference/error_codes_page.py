"""docs/reference/error-codes.md: every error code with its HTTP status and meaning, from their
one home, protocol/error_codes.py (`ErrorCode`, `STATUS`, `MEANING`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from asyncgrpo.docs_reference.markdown import cell, code, page, table

K = TypeVar("K", bound=str)
HEADERS = ("Code", "HTTP status", "Meaning")
OWN_STATUS = "the framework's own"


def rows(status: Mapping[K, int | None], meaning: Mapping[K, str]) -> list[tuple[str, str, str]]:
    """One row per code, by status then code; a code with no status keeps the framework's."""
    ordered = sorted(status, key=lambda c: (status[c] is None, status[c] or 0, str(c)))
    return [
        (code(str(c)), OWN_STATUS if status[c] is None else str(status[c]), cell(meaning[c]))
        for c in ordered
    ]


INTRO = """
Every error answer of the API is JSON: `detail`, a message for people that may be reworded, and
`code`, a stable snake_case code for programs, plus `errors` (one entry per refused field) with
`validation_failed` and any fields the error names (`field`, `status`, `current_version`, …).
Branch on `code` and the status, never on `detail`. A code keeps its status and meaning once
listed. The codes come from `protocol/error_codes.py`; the operations that answer them are in
[the HTTP API reference](http-api.md).
"""


def render() -> str:
    from protocol.error_codes import MEANING, STATUS

    return page("Error codes", INTRO, [table(HEADERS, rows(STATUS, MEANING))])
