"""Whole rows of the tables the worker calls write, and whole answers, made comparable across two
databases on which the same thing was done: one Postgres, one SQLite (tests/server/leases/
twins.py).

Every value is compared as the models read it back (their column types, server/db_types.py
among them, give both databases the same Python values: UUIDs, aware datetimes, JSON as dicts
and lists, booleans), and only what must differ between the two is normalised, explicitly:
- random ids: a lease's, a batch's (and any id the arrangement did not fix) become labels named
  after what they identify (`lease:<run>#<fencing>`, `batch:<lease label>`), also inside text
  such as bucket keys and manifests; runs and workers get their names;
- timestamps: `as before` (unchanged by the call) or `written` (by the call; or null), each
  compared with the same database's value before the call, and a lease whose expiry the call
  wrote also gets its lifetime (expires_at minus the heartbeat or the grant that set it) in
  seconds;
- in a signed blob URL, the wall-clock expiry and the signature over it.
Prompt and dataset row ids are serials: equal when both databases were arranged the same way
(twins.empty restarts them). JSON objects compare as dicts, so the key order each database
keeps (jsonb's own, SQLite's as written) does not count; nothing else is normalised, so a
difference in a value, a null or a row's presence fails.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import Lease, PromptRow, RolloutBatch, Run, Worker

Rows = dict[str, dict[Any, dict[str, Any]]]  # table -> primary key -> the whole row

TABLES = {
    "runs": Run,
    "workers": Worker,
    "leases": Lease,
    "prompt_rows": PromptRow,
    "rollout_batches": RolloutBatch,
}
AS_BEFORE, WRITTEN = "as before", "written"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SIGNED_URL_EXPIRY = re.compile(r"(?<=[?&]exp=)\d+")
_SIGNED_URL_SIGNATURE = re.compile(r"(?<=[?&]sig=)[0-9a-f]+")


def table_rows(session: Session) -> Rows:
    """Every row of the five tables, every column (the read transaction ends)."""
    rows: Rows = {}
    for name, model in TABLES.items():
        table = model.__table__
        rows[name] = {
            row["id"]: dict(row) for row in session.execute(select(table)).mappings().all()
        }
    session.commit()
    return rows


def id_labels(rows: Rows) -> dict[str, str]:
    """A label for every run, worker, lease and batch id, from what the row is."""
    labels = {str(run_id): f"run:{run['name']}" for run_id, run in rows["runs"].items()}
    labels |= {str(w_id): f"worker:{w['name']}" for w_id, w in rows["workers"].items()}
    for lease_id, lease in rows["leases"].items():
        labels[str(lease_id)] = f"lease:{labels[str(lease['run_id'])]}#{lease['fencing']}"
    for batch_id, batch in rows["rollout_batches"].items():
        labels[str(batch_id)] = f"batch:{labels[str(batch['lease_id'])]}"
    return labels


def normalised_answer(value: Any, labels: dict[str, str]) -> Any:
    """A JSON answer (or any value) with ids labelled, and signed URLs without their expiry
    and signature."""
    if isinstance(value, dict):
        return {k: normalised_answer(v, labels) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised_answer(v, labels) for v in value]
    if isinstance(value, uuid.UUID):
        return labels.get(str(value), str(value))
    if isinstance(value, str):
        text = _UUID.sub(lambda m: labels.get(m.group(0), m.group(0)), value)
        text = _SIGNED_URL_EXPIRY.sub("<wall-clock expiry>", text)
        return _SIGNED_URL_SIGNATURE.sub("<signature>", text)
    return value


def normalised_rows(after: Rows, before: Rows) -> dict[str, list[Any]]:
    """The rows after a call, comparable across databases (see the module docstring); `before`
    are the same database's rows before the call."""
    labels = id_labels(after)
    normalised: dict[str, list[Any]] = {}
    for table, rows in after.items():
        normalised[table] = sorted(
            (
                _normalised_row(table, row, before[table].get(pk), labels)
                for pk, row in rows.items()
            ),
            key=lambda row: str(row["id"]),
        )
    return normalised


def _normalised_row(
    table: str, row: dict[str, Any], before: dict[str, Any] | None, labels: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column, value in row.items():
        if isinstance(value, datetime):
            out[column] = _timestamp(value, None if before is None else before[column])
        else:
            out[column] = normalised_answer(value, labels)
    if table == "leases" and out["expires_at"] == WRITTEN:
        out["lifetime_s"] = _lifetime_s(row, out)
    return out


def _timestamp(value: datetime, before: datetime | None) -> str:
    return AS_BEFORE if value == before else WRITTEN


def _lifetime_s(lease: dict[str, Any], normalised: dict[str, Any]) -> float | None:
    """How long past the write that set it the lease's new expiry lies (its TTL)."""
    for set_by in ("last_heartbeat_at", "created_at"):
        if normalised[set_by] == WRITTEN:
            return round((lease["expires_at"] - lease[set_by]).total_seconds(), 1)
    return None
