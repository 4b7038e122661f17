"""SQL of the worker calls' common case on Postgres, on psycopg's async driver (the event loop,
no request thread). The connections are in autocommit mode and every write is one statement
that authenticates the worker's token, checks the lease and changes everything the call changes:
one round trip, its own transaction, no BEGIN or COMMIT to wait for. A statement that finds
nothing to do changed nothing, and fast_service hands the call to the portable path."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb
from sqlalchemy import bindparam, literal_column
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.orm import aliased

from protocol.schemas import LEASING_RUN_STATUSES
from protocol.staleness import outside_window
from server.db_types import postgres_text
from server.leases.queue import GRANT_SQL_PSYCOPG, Granted, granted_from_rows
from server.models import Token
from server.tokens.repository import usable
from server.workers.repository import touch_sql

Conn = AsyncConnection[Any]


# A usable worker token (t: tokens.repository.usable, rendered) of an active worker (w; the
# portable path answers for a quarantined one); tokens.service._check and
# workers.service._active on the portable path say which of these failed.
_USABLE = postgres_text(usable(aliased(Token, name="t")))
_AUTHENTICATED = f"""
    t.digest = %(digest)s AND t.kind = 'worker' AND {_USABLE}
    AND w.id = t.scope_id AND w.status = 'active'
"""

_LEASING = ", ".join(f"'{status}'" for status in LEASING_RUN_STATUSES)

# Touching the worker first is safe here: this statement is its own transaction and locks
# nothing else. A quarantined or revoked worker matches nothing (the portable path answers).
# The worker is waiting from its first try until a grant clears it (queue._GRANT), so after the
# try waiting_since is set exactly when it granted nothing, as on the portable path.
_SEEN_FOR_ACQUIRE = f"""
UPDATE workers w SET {touch_sql("w", waiting=True, environments="%(environments)s")}
FROM tokens t
WHERE {_AUTHENTICATED} AND w.models @> %(asked)s
RETURNING w.id AS worker_id, w.environments, w.trusted,
    EXISTS (SELECT 1 FROM leases
            WHERE state = 'active' AND expires_at <= clock_timestamp()) AS any_expired,
    (SELECT coalesce(json_agg(json_build_object('id', r.id, 'base_model', r.base_model,
                                                'current_version', r.current_version,
                                                'groups_in_flight', r.groups_in_flight)
                              ORDER BY r.priority DESC, r.last_lease_at ASC NULLS FIRST, r.id),
                     '[]')
     FROM runs r
     WHERE r.status IN ({_LEASING})
       AND r.base_model IN (SELECT jsonb_array_elements_text(w.models))) AS runs
"""

_RUN_OF_LEASE = "SELECT run_id FROM leases WHERE id = %(lease_id)s"

# The lease (l) of this worker, still held: the fenced compare-and-set of every call.
_HELD = """
    l.id = %(lease_id)s AND l.fencing = %(fencing)s AND l.state = 'active'
    AND l.expires_at > clock_timestamp() AND l.worker_id = w.id
"""

# The staleness predicate itself (protocol/staleness.py), rendered for this statement.
_OUTSIDE_WINDOW = str(
    outside_window(
        literal_column("r.current_version"),
        literal_column("l.adapter_version"),
        bindparam("max_staleness"),
    ).compile(dialect=psycopg_dialect())
)

# service.heartbeat's extend branch: the run runs and the lease's version is inside the window
# (else the portable path aborts). Lock order as there: the lease first, the worker row last.
_HEARTBEAT = f"""
WITH extended AS (
    UPDATE leases l SET expires_at = clock_timestamp() + make_interval(secs => %(ttl_s)s),
                        last_heartbeat_at = clock_timestamp()
    FROM tokens t, workers w, runs r
    WHERE {_HELD} AND {_AUTHENTICATED}
      AND r.id = l.run_id AND r.status = 'running'
      AND NOT (%(admission)s AND {_OUTSIDE_WINDOW})
    RETURNING l.worker_id, r.current_version
), touched AS (
    UPDATE workers SET {touch_sql()}
    WHERE id = (SELECT worker_id FROM extended)
)
SELECT current_version FROM extended
"""

_UPLOAD = f"""
UPDATE leases l SET last_heartbeat_at = clock_timestamp()
FROM tokens t, workers w
WHERE {_HELD} AND {_AUTHENTICATED}
RETURNING l.fencing
"""

# service.complete's accept branch (the object's existence and size were checked before): the
# sample count fits the lease's rows, all still leased to it.
_ACCEPT = f"""
WITH completed AS (
    UPDATE leases l SET state = 'completed', ended_at = clock_timestamp(),
                        end_reason = 'completed'
    FROM tokens t, workers w, runs r
    WHERE {_HELD} AND {_AUTHENTICATED} AND r.id = l.run_id
      AND l.n_prompts * l.group_size = %(n_samples)s
      AND l.kind = 'train'
      AND (SELECT count(*) FROM prompt_rows p
           WHERE p.lease_id = l.id AND p.state = 'leased') = l.n_prompts
    RETURNING l.id, l.run_id, l.worker_id, l.adapter_version, l.n_prompts,
              r.tokenizer_fingerprint
), batch AS (
    INSERT INTO rollout_batches (id, run_id, lease_id, worker_id, adapter_version, bucket_key,
                                 sha256, bytes, n_samples, n_tokens, n_groups,
                                 tokenizer_fingerprint, state, generation_seconds, manifest)
    SELECT %(batch_id)s, run_id, id, worker_id, adapter_version, %(key)s, %(sha256)s,
           %(bytes)s, %(n_samples)s, %(n_tokens)s, n_prompts, tokenizer_fingerprint,
           'accepted', %(generation_seconds)s, %(manifest)s
    FROM completed RETURNING id
), accepted AS (
    UPDATE prompt_rows SET state = 'accepted', batch_id = %(batch_id)s
    WHERE lease_id = %(lease_id)s AND state = 'leased' AND EXISTS (SELECT 1 FROM batch)
), touched AS (
    UPDATE workers SET {touch_sql(counters=("accepted_batches",))}
    WHERE id = (SELECT worker_id FROM completed)
)
SELECT id FROM batch
"""


async def _one(conn: Conn, sql: str, params: dict[str, Any]) -> Any:
    cursor = conn.cursor(row_factory=namedtuple_row)
    await cursor.execute(sql, params)
    return await cursor.fetchone()


async def seen_for_acquire(
    conn: Conn, digest: str, asked: list[str] | None, environments: list[str] | None = None
) -> Any:
    """Mark the authenticated active worker seen (and waiting), storing the environments it
    declares now (None: keep them); its id, the environments it can run, whether it is
    trusted, whether any lease has expired, and the running runs of its base models, fairest
    first ([{id, base_model, current_version, groups_in_flight}]). None: not a live token of
    an active worker, or one that asked for a model it did not register (the portable path
    refuses that)."""
    params = {
        "digest": digest,
        "asked": Jsonb(asked or []),
        "environments": None if environments is None else Jsonb(environments),
    }
    return await _one(conn, _SEEN_FOR_ACQUIRE, params)


async def grant(conn: Conn, params: dict[str, Any]) -> Granted | None:
    cursor = conn.cursor(row_factory=namedtuple_row)
    await cursor.execute(GRANT_SQL_PSYCOPG, params)
    return granted_from_rows(await cursor.fetchall())


async def run_of_lease(conn: Conn, lease_id: uuid.UUID) -> uuid.UUID | None:
    row = await _one(conn, _RUN_OF_LEASE, {"lease_id": lease_id})
    return None if row is None else row.run_id


def _held(digest: str, lease_id: uuid.UUID, fencing: int) -> dict[str, Any]:
    return {"digest": digest, "lease_id": lease_id, "fencing": fencing}


async def extend(
    conn: Conn,
    digest: str,
    lease_id: uuid.UUID,
    fencing: int,
    *,
    ttl_s: float,
    admission: bool,
    max_staleness: int,
) -> int | None:
    """The heartbeat of a held lease whose run runs and whose version is inside the window:
    extended by ttl_s, the worker seen. The run's current version, or None (nothing changed)."""
    params = {
        **_held(digest, lease_id, fencing),
        "ttl_s": ttl_s,
        "admission": admission,
        "max_staleness": max_staleness,
    }
    row = await _one(conn, _HEARTBEAT, params)
    return None if row is None else int(row.current_version)


async def mark_uploading(conn: Conn, digest: str, lease_id: uuid.UUID, fencing: int) -> bool:
    return await _one(conn, _UPLOAD, _held(digest, lease_id, fencing)) is not None


async def accept(
    conn: Conn, digest: str, lease_id: uuid.UUID, fencing: int, batch: dict[str, Any]
) -> bool:
    """End the held lease `completed`, insert its batch `accepted` (when the sample count fits
    the lease), mark its rows accepted and count the worker's batch. False: nothing changed."""
    params = {**_held(digest, lease_id, fencing), **batch, "manifest": Jsonb(batch["manifest"])}
    return await _one(conn, _ACCEPT, params) is not None
