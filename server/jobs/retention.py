"""Retention (docs/architecture/contract.md, invariant 13), scheduled per run: what may go is
decided by server.learner.retention.apply_retention."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from protocol.storage import ObjectStore
from protocol.storage_local import STALE_TEMP_S, LocalStore
from server.db import transaction
from server.doctor.service import sweep_probes
from server.learner.retention import apply_retention
from server.models import Run


def apply_all(factory: sessionmaker[Session], store: ObjectStore) -> dict[uuid.UUID, list[str]]:
    """Apply retention to every run, one transaction per run; returns the deleted keys. A
    local bucket also loses the temp files of uploads that never finished, and every bucket the
    bucket probes of `asyncgrpo doctor` left behind."""
    if isinstance(store, LocalStore):
        store.sweep_stale_temps(STALE_TEMP_S)
    with transaction(factory) as session:
        run_ids = list(session.execute(select(Run.id).order_by(Run.id)).scalars())
    deleted: dict[uuid.UUID, list[str]] = {}
    for run_id in run_ids:
        with transaction(factory) as session:
            keys = apply_retention(session, store, run_id)
        if keys:
            deleted[run_id] = list(keys)
    sweep_probes(store)
    return deleted
