"""5xx the fuzzer found in code that is still being written by its owners (server/leases/,
server/learner/ and the protocol request models they take). Each entry matches exactly the
requests that trigger it; the fuzz test lets a 5xx through only for a matching request and
keeps checking every other request. Remove an entry once its cause is fixed: the test warns
when a matching request no longer gets a 5xx."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KnownFinding:
    name: str
    matches: Callable[[Any], bool]
    cause: str


# Empty: every 5xx found so far is fixed (tests/fuzz/test_numeric_bounds.py guards them).
KNOWN_FINDINGS: list[KnownFinding] = []


def known_finding(case: Any) -> KnownFinding | None:
    return next((k for k in KNOWN_FINDINGS if k.matches(case)), None)
