"""The lease grant in one statement on Postgres (the hot path of `acquire`).

Locking the first queued rows (SKIP LOCKED), the admission compare-and-set on the run row (which
also takes the grant's fencing token), the lease insert and marking the rows leased are four
round trips on the portable path (service._grant). Every acquire on a run serialises on its run
row from the admission update until commit, so here they are one statement: the run row is
locked for one round trip and the commit. The lease seed is service.lease_seed computed in SQL
(the first 8 bytes of sha256("{run seed}:{run id}:{fencing}") as a non-negative bigint).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Float, Integer, String, Uuid, bindparam, text
from sqlalchemy.orm import Session

from server.db_types import JSONType

_GRANT = (
    text(
        """
WITH picked AS (
    SELECT id, dataset_row_id, epoch, queue_pos FROM prompt_rows
    WHERE run_id = :run_id AND state = 'queued'
    ORDER BY queue_pos LIMIT :n
    FOR UPDATE SKIP LOCKED
), admitted AS (
    UPDATE runs SET groups_in_flight = groups_in_flight + (SELECT count(*) FROM picked),
                    fencing_seq = fencing_seq + 1,
                    last_lease_at = clock_timestamp()
    WHERE id = :run_id AND status = 'running'
      AND (SELECT count(*) FROM picked) > 0
      AND groups_in_flight + (SELECT count(*) FROM picked) <= :bound
    RETURNING fencing_seq, current_version, tokenizer_fingerprint,
              (SELECT count(*) FROM picked) AS n_rows
), lease AS (
    INSERT INTO leases (id, run_id, worker_id, adapter_version, fencing, state, expires_at,
                        seed, n_prompts, group_size, created_at)
    SELECT :lease_id, :run_id, :worker_id, current_version, fencing_seq, 'active',
           clock_timestamp() + make_interval(secs => :ttl_s),
           ('x' || left(encode(sha256(convert_to(:seed_prefix || fencing_seq::text, 'UTF8')),
                               'hex'), 16))::bit(64)::bigint & 9223372036854775807,
           n_rows, :group_size, clock_timestamp()
    FROM admitted
    RETURNING fencing, seed, adapter_version
), marked AS (
    UPDATE prompt_rows SET state = 'leased', lease_id = :lease_id
    WHERE id IN (SELECT id FROM picked) AND EXISTS (SELECT 1 FROM lease)
)
SELECT picked.id, picked.dataset_row_id, picked.epoch, dataset_rows.prompt,
       lease.fencing, lease.seed, lease.adapter_version, admitted.tokenizer_fingerprint
FROM picked
JOIN dataset_rows ON dataset_rows.id = picked.dataset_row_id
CROSS JOIN lease CROSS JOIN admitted
ORDER BY picked.queue_pos
"""
    )
    .bindparams(
        bindparam("run_id", type_=Uuid),
        bindparam("worker_id", type_=Uuid),
        bindparam("lease_id", type_=Uuid),
        bindparam("n", type_=Integer),
        bindparam("bound", type_=BigInteger),
        bindparam("ttl_s", type_=Float),
        bindparam("group_size", type_=Integer),
        bindparam("seed_prefix", type_=String),
    )
    .columns(
        id=BigInteger,
        dataset_row_id=BigInteger,
        epoch=Integer,
        prompt=JSONType,
        fencing=BigInteger,
        seed=BigInteger,
        adapter_version=Integer,
        tokenizer_fingerprint=String,
    )
)


@dataclass(frozen=True)
class Granted:
    """What one grant decided: its token, seed, version and rows (in queue order)."""

    fencing: int
    seed: int
    version: int
    fingerprint: str | None
    rows: list[Any]


def in_one_statement(
    session: Session,
    *,
    run_id: uuid.UUID,
    worker_id: uuid.UUID,
    lease_id: uuid.UUID,
    n: int,
    bound: int,
    ttl_s: float,
    group_size: int,
    run_seed: int,
) -> Granted | None:
    """Lease up to n queued rows of the run to the worker, or None (no queued row, the run is
    not running, or the admission bound refuses)."""
    rows = session.execute(
        _GRANT,
        {
            "run_id": run_id,
            "worker_id": worker_id,
            "lease_id": lease_id,
            "n": n,
            "bound": bound,
            "ttl_s": ttl_s,
            "group_size": group_size,
            "seed_prefix": f"{run_seed}:{run_id}:",
        },
    ).all()
    if not rows:
        return None
    first = rows[0]
    return Granted(
        fencing=first.fencing,
        seed=first.seed,
        version=first.adapter_version,
        fingerprint=first.tokenizer_fingerprint,
        rows=list(rows),
    )
