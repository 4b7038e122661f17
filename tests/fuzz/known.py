"""5xx the fuzzer found in code that is still being written by its owners (server/leases/,
server/learner/ and the protocol request models they take). Each entry matches exactly the
requests that trigger it; the fuzz test lets a 5xx through only for a matching request and
keeps checking every other request. Remove an entry once its cause is fixed: the test warns
when a matching request no longer gets a 5xx."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BIGINT_MAX = 2**63 - 1


@dataclass(frozen=True)
class KnownFinding:
    name: str
    matches: Callable[[Any], bool]
    cause: str


def _fencing_outside_bigint(case: Any) -> bool:
    body = case.body
    if not isinstance(body, dict):
        return False
    fencing = body.get("fencing")
    return type(fencing) is int and not -BIGINT_MAX - 1 <= fencing <= BIGINT_MAX


KNOWN_FINDINGS = [
    KnownFinding(
        name="fencing-outside-bigint",
        matches=_fencing_outside_bigint,
        cause=(
            "FencedRequest.fencing is `int, ge=0` with no upper bound (protocol/schemas.py, "
            "worker calls) and `int` with no bound at all (protocol/schemas_learner.py); a "
            "fencing token outside the BIGINT range reaches the compare-and-set "
            "`... AND fencing = :t` and Postgres raises NumericValueOutOfRange -> 500 "
            "(server/leases/service.py _fence, server/learner/ heartbeat). Fix: "
            "ge=0, le=2**63-1 on both fields."
        ),
    ),
]


def known_finding(case: Any) -> KnownFinding | None:
    return next((k for k in KNOWN_FINDINGS if k.matches(case)), None)
