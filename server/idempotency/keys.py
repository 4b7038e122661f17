"""The Idempotency-Key of one call: its header, the caller it is scoped to, and the fingerprint
of the request it was first used for."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from fastapi import Header, Request
from pydantic import BaseModel

from protocol.error_codes import ErrorCode
from protocol.idempotency import IDEMPOTENCY_HEADER, key_time
from server.errors import Unprocessable

KeyHeader = Annotated[
    str | None,
    Header(
        alias=IDEMPOTENCY_HEADER,
        description="A UUIDv7 made once per logical call and sent again on each of its "
        "retries: a repeat gets the first call's answer (status and body) instead of being "
        "applied again, for `idempotency_retention_s`. Without it the call behaves as it "
        "always did (docs/architecture/protocol.md#safe-retries).",
    ),
]


@dataclass(frozen=True)
class KeyedCall:
    """A call made under a key: the caller's scope (its token's digest: one caller never sees
    another's answers), the key, when the caller made it, and what was asked."""

    scope: str
    key: uuid.UUID
    key_time: datetime
    fingerprint: str


def keyed_call(
    header: str | None, scope: Callable[[], str], request: Request, body: BaseModel | None
) -> KeyedCall | None:
    """The call's key (None without the header), scoped to `scope()` (the caller's token
    digest); 422 for a key that is not a UUIDv7."""
    if header is None:
        return None
    made = key_time(header)
    if made is None:
        raise Unprocessable(
            f"{IDEMPOTENCY_HEADER} must be a UUIDv7 (RFC 9562)",
            field=IDEMPOTENCY_HEADER,
            code=ErrorCode.idempotency_key_invalid,
        )
    return KeyedCall(scope(), uuid.UUID(header), made, fingerprint(request, body))


def fingerprint(request: Request, body: BaseModel | None) -> str:
    """sha256 of the method, the path and the body as validated (canonical JSON)."""
    asked = None if body is None else body.model_dump(mode="json")
    text = json.dumps([request.method, request.url.path, asked], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
