"""Idempotency keys of state-changing calls (docs/architecture/protocol.md, "Safe retries").

A key is a UUIDv7 (RFC 9562): its first 48 bits are the Unix time in milliseconds at which the
caller made it, so the server can tell a key older than anything it has let go of from a new
one. The typed client makes one key per logical call and sends it on every retry of that call.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime

IDEMPOTENCY_HEADER = "Idempotency-Key"


def new_key(now_s: float | None = None) -> str:
    """A fresh UUIDv7 (48 bits of Unix milliseconds, version 7, the RFC variant, 74 random)."""
    ms = int((time.time() if now_s is None else now_s) * 1000) & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) & 0xFFF) << 64
    value |= (0b10 << 62) | (rand & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


def key_time(key: str) -> datetime | None:
    """When the caller made the key (its UUIDv7 timestamp), or None for a string that is not a
    UUIDv7 in its canonical (hyphenated, lower-case or upper-case) form."""
    try:
        parsed = uuid.UUID(key)
    except ValueError:
        return None
    if parsed.version != 7 or parsed.variant != uuid.RFC_4122 or str(parsed) != key.lower():
        return None
    return datetime.fromtimestamp((parsed.int >> 80) / 1000, UTC)
