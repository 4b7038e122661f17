"""Idempotency keys (protocol/idempotency.py): UUIDv7s whose time the server reads."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from protocol.idempotency import key_time, new_key


def test_a_new_key_is_a_uuid7_carrying_its_time_to_the_millisecond() -> None:
    key = new_key(1_800_000_000.1234)
    parsed = uuid.UUID(key)
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert key_time(key) == datetime.fromtimestamp(1_800_000_000.123, UTC)
    assert key_time(key.upper()) == key_time(key)


def test_keys_differ_and_order_by_time() -> None:
    keys = [new_key(1_800_000_000.0 + i / 1000) for i in range(50)]
    assert len(set(keys)) == 50
    times = [key_time(k) for k in keys]
    assert times == sorted(times)  # type: ignore[type-var]


def test_what_is_not_a_canonical_uuid7_has_no_time() -> None:
    v7 = new_key()
    for other in ("", "not-a-key", str(uuid.uuid4()), str(uuid.uuid1()), v7.replace("-", ""),
                  "{" + v7 + "}", "urn:uuid:" + v7):  # fmt: skip
        assert key_time(other) is None, other
