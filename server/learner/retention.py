"""Retention of adapter and checkpoint objects (invariant 13): never delete versions
≥ current − max_staleness − 1, versions named by an active lease or an unconsumed batch, the
final version, the best version (server/runs/best.py), the latest version that carries
checkpoint files (versions between checkpoints carry none; attach resumes from that one), or a
multiple of the run's retention.keep_every. Everything older goes. Scheduled by the
jobs."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.staleness import staleness
from protocol.storage import ObjectNotFound, ObjectStore
from server.errors import NotFound
from server.learner import repository as repo
from server.learner.service import run_config
from server.models import AdapterVersion


def protected_versions(
    session: Session, run_id: uuid.UUID, versions: list[AdapterVersion]
) -> set[int]:
    run = repo.get_run(session, run_id)
    if run is None:
        raise NotFound("run not found", code=ErrorCode.run_not_found)
    # Invariant 13: every version inside the staleness window, and one more.
    config = run_config(session, run_id)
    within = config.max_staleness + 1
    keep = {v.version for v in versions if staleness(run.current_version, v.version) <= within}
    keep |= {v.version for v in versions if v.final}
    keep |= repo.versions_in_use(session, run_id)
    if run.best_version is not None:  # the best version by the run's best metric
        keep.add(run.best_version)
    every = config.retention.keep_every
    if every is not None:
        keep |= {v.version for v in versions if v.version % every == 0}
    # The resume checkpoint: the latest version with checkpoint files, not the latest version.
    with_checkpoint = [v.version for v in versions if v.checkpoint_files]
    if with_checkpoint:
        keep.add(max(with_checkpoint))
    return keep


def apply_retention(session: Session, store: ObjectStore, run_id: uuid.UUID) -> list[str]:
    """Delete the objects of unprotected versions, mark them deleted; returns the keys."""
    versions = repo.live_versions(session, run_id)
    keep = protected_versions(session, run_id, versions)
    doomed = [v for v in versions if v.version not in keep]
    repo.mark_deleted(session, [v.id for v in doomed])
    deleted: list[str] = []
    for version in doomed:
        for meta in [*version.files.values(), *version.checkpoint_files.values()]:
            key = str(meta["key"])
            try:
                store.delete(key)
            except ObjectNotFound:
                pass
            deleted.append(key)
    return deleted
