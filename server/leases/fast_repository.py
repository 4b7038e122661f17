"""SQL of the worker calls' common case on Postgres, on psycopg's async driver (the event loop,
no request thread): each function is one statement. Every statement authenticates the worker's
token in the same round trip; finding nothing means "not the common case" (fast_service)."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb

from server.leases.repository import GRANT_SQL_PSYCOPG, Granted, granted_from_rows

Conn = AsyncConnection[Any]

# A live worker token of a worker that is not revoked (tokens.service._check and
# workers.service._active on the portable path say which of these failed).
_AUTHENTICATED = """
    t.digest = %(digest)s AND t.kind = 'worker' AND t.revoked_at IS NULL
    AND (t.expires_at IS NULL OR t.expires_at > clock_timestamp()) AND w.status <> 'revoked'
"""

_WORKER_AND_RUNS = f"""
SELECT w.id AS worker_id, w.status,
       EXISTS (SELECT 1 FROM leases
               WHERE state = 'active' AND expires_at <= clock_timestamp()) AS any_expired,
       (SELECT coalesce(json_agg(json_build_object('id', r.id, 'base_model', r.base_model)
                                 ORDER BY r.priority DESC, r.last_lease_at ASC NULLS FIRST, r.id),
                        '[]')
        FROM runs r
        WHERE r.status = 'running'
          AND r.base_model IN (SELECT jsonb_array_elements_text(w.models))) AS runs
FROM tokens t JOIN workers w ON w.id = t.scope_id
WHERE {_AUTHENTICATED}
"""

_LEASE_OF_WORKER = f"""
SELECT w.id AS worker_id, l.run_id, l.fencing, l.adapter_version, l.group_size, l.n_prompts,
       r.status AS run_status, r.current_version, r.tokenizer_fingerprint
FROM tokens t
JOIN workers w ON w.id = t.scope_id
JOIN leases l ON l.id = %(lease_id)s AND l.worker_id = w.id
JOIN runs r ON r.id = l.run_id
WHERE {_AUTHENTICATED}
"""

_FENCED = """
    id = %(lease_id)s AND worker_id = %(worker_id)s AND fencing = %(fencing)s
    AND state = 'active' AND expires_at > clock_timestamp()
"""

# Lock order as on the portable path: lease, then prompt rows, then the worker row last.
_HEARTBEAT = f"""
WITH fenced AS (
    UPDATE leases SET expires_at = clock_timestamp() + make_interval(secs => %(ttl_s)s),
                      last_heartbeat_at = clock_timestamp()
    WHERE {_FENCED} RETURNING id
)
UPDATE workers SET last_seen_at = clock_timestamp()
WHERE id = %(worker_id)s AND EXISTS (SELECT 1 FROM fenced) RETURNING id
"""

_UPLOAD = f"UPDATE leases SET last_heartbeat_at = clock_timestamp() WHERE {_FENCED} RETURNING id"

_ACCEPT = f"""
WITH fenced AS (
    UPDATE leases SET state = 'completed', ended_at = clock_timestamp(), end_reason = 'completed'
    WHERE {_FENCED} RETURNING id, run_id, adapter_version
), batch AS (
    INSERT INTO rollout_batches (id, run_id, lease_id, worker_id, adapter_version, bucket_key,
                                 sha256, bytes, n_samples, n_tokens, n_groups,
                                 tokenizer_fingerprint, state, generation_seconds, manifest)
    SELECT %(batch_id)s, run_id, id, %(worker_id)s, adapter_version, %(key)s, %(sha256)s,
           %(bytes)s, %(n_samples)s, %(n_tokens)s, %(n_groups)s, %(fingerprint)s, 'accepted',
           %(generation_seconds)s, %(manifest)s
    FROM fenced RETURNING id
), accepted AS (
    UPDATE prompt_rows SET state = 'accepted', batch_id = %(batch_id)s
    WHERE lease_id = %(lease_id)s AND state = 'leased' AND EXISTS (SELECT 1 FROM batch)
    RETURNING id
), touched AS (
    UPDATE workers SET last_seen_at = clock_timestamp(), accepted_batches = accepted_batches + 1
    WHERE id = %(worker_id)s AND EXISTS (SELECT 1 FROM batch)
)
SELECT (SELECT count(*) FROM fenced) AS fenced, (SELECT count(*) FROM accepted) AS accepted
"""

_TOUCH_WORKER = "UPDATE workers SET last_seen_at = clock_timestamp() WHERE id = %(worker_id)s"


async def _one(conn: Conn, sql: str, params: dict[str, Any]) -> Any:
    cursor = conn.cursor(row_factory=namedtuple_row)
    await cursor.execute(sql, params)
    return await cursor.fetchone()


async def worker_and_runs(conn: Conn, digest: str) -> Any:
    """The authenticated worker (id, status), whether any lease has expired, and the running
    runs of its base models, fairest first (list of {id, base_model}); None if not authenticated."""
    return await _one(conn, _WORKER_AND_RUNS, {"digest": digest})


async def grant(conn: Conn, params: dict[str, Any]) -> Granted | None:
    cursor = conn.cursor(row_factory=namedtuple_row)
    await cursor.execute(GRANT_SQL_PSYCOPG, params)
    return granted_from_rows(await cursor.fetchall())


async def touch_worker(conn: Conn, worker_id: uuid.UUID) -> None:
    await conn.execute(_TOUCH_WORKER, {"worker_id": worker_id})


async def lease_of_worker(conn: Conn, digest: str, lease_id: uuid.UUID) -> Any:
    """The lease and its run's fields, if the token is a live worker's and the worker holds
    this lease; else None."""
    return await _one(conn, _LEASE_OF_WORKER, {"digest": digest, "lease_id": lease_id})


def _fence_params(lease_id: uuid.UUID, worker_id: uuid.UUID, fencing: int) -> dict[str, Any]:
    return {"lease_id": lease_id, "worker_id": worker_id, "fencing": fencing}


async def extend(
    conn: Conn, lease_id: uuid.UUID, worker_id: uuid.UUID, fencing: int, ttl_s: float
) -> bool:
    """The heartbeat's compare-and-set (and the worker's last_seen_at); False: nothing changed."""
    params = {**_fence_params(lease_id, worker_id, fencing), "ttl_s": ttl_s}
    return await _one(conn, _HEARTBEAT, params) is not None


async def mark_uploading(
    conn: Conn, lease_id: uuid.UUID, worker_id: uuid.UUID, fencing: int
) -> bool:
    return await _one(conn, _UPLOAD, _fence_params(lease_id, worker_id, fencing)) is not None


async def accept(
    conn: Conn, lease_id: uuid.UUID, worker_id: uuid.UUID, fencing: int, batch: dict[str, Any]
) -> tuple[int, int]:
    """End the lease `completed`, insert its batch `accepted`, mark its rows accepted and count
    the worker's batch, in one statement. Returns (leases fenced, rows accepted)."""
    params = {
        **_fence_params(lease_id, worker_id, fencing),
        **batch,
        "manifest": Jsonb(batch["manifest"]),
    }
    row = await _one(conn, _ACCEPT, params)
    return row.fenced, row.accepted
