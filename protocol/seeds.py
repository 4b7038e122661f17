"""Seeds derived from a sha256: the one formula behind the lease seed the server grants and every
seed the worker derives from a lease's seed (per prompt and completion, per batch of calls, per
turn). The first 8 bytes of sha256 of the parts joined by ":", big-endian, with the top bit
masked off: a non-negative 64-bit integer (it fits a Postgres bigint)."""

from __future__ import annotations

import hashlib

from protocol.schemas import BIGINT_MAX


def derived_seed(*parts: object) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") & BIGINT_MAX


def seed_prefix(*leading: object) -> str:
    """The joined text of every part but the last, ready for `seed_sql` to append the last."""
    return "".join(f"{part}:" for part in leading)


def seed_sql(text: str) -> str:
    """derived_seed in Postgres SQL, for `text` a SQL text expression of the joined parts (e.g.
    `:seed_prefix || fencing_seq::text`): the one-statement grant computes the lease seed so."""
    return (
        f"('x' || left(encode(sha256(convert_to({text}, 'UTF8')), 'hex'), 16))::bit(64)::bigint"
        f" & {BIGINT_MAX}"
    )
