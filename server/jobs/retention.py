"""Retention (design.md invariant 13), scheduled per run: the learner engineer's
`server.learner.retention.apply_retention(session, store, run_id)` decides what may go."""

from __future__ import annotations

import importlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from protocol.storage import ObjectStore
from server.db import transaction
from server.models import Run

log = logging.getLogger("asyncgrpo.jobs.retention")


def retention_function() -> Callable[[Session, ObjectStore, uuid.UUID], list[str]] | None:
    """apply_retention, or None while server.learner.retention has not landed."""
    try:
        module: Any = importlib.import_module("server.learner.retention")
    except ModuleNotFoundError:
        return None
    fn = getattr(module, "apply_retention", None)
    return fn if callable(fn) else None


def apply_all(factory: sessionmaker[Session], store: ObjectStore) -> dict[uuid.UUID, list[str]]:
    """Apply retention to every run, one transaction per run; returns the deleted keys."""
    fn = retention_function()
    if fn is None:
        log.info("retention skipped: server.learner.retention.apply_retention is not available")
        return {}
    with transaction(factory) as session:
        run_ids = list(session.execute(select(Run.id).order_by(Run.id)).scalars())
    deleted: dict[uuid.UUID, list[str]] = {}
    for run_id in run_ids:
        with transaction(factory) as session:
            keys = fn(session, store, run_id)
        if keys:
            deleted[run_id] = list(keys)
    return deleted
