"""Admin reads of a run's adapter versions, with short-lived download URLs."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.storage import ObjectStore
from server.adapters import repository
from server.adapters.schemas import (
    AdapterFileDownload,
    AdapterFileInfo,
    AdapterVersionDetail,
    AdapterVersionOut,
)
from server.errors import AppError, NotFound
from server.models import AdapterVersion
from server.runs import service as runs


class Gone(AppError):
    status_code = 410


def _files(row: AdapterVersion) -> list[AdapterFileInfo]:
    return [
        AdapterFileInfo(
            name=name, key=meta["key"], sha256=meta.get("sha256"), size=meta.get("bytes")
        )
        for name, meta in sorted(row.files.items())
    ]


def _out_fields(row: AdapterVersion) -> dict[str, Any]:
    return {
        "run_id": row.run_id,
        "version": row.version,
        "sha256": row.sha256,
        "bytes": row.bytes,
        "learner_step": row.learner_step,
        "final": row.final,
        "deleted": row.deleted,
        "created_at": row.created_at,
        "metrics": row.metrics or {},
    }


def list_versions(session: Session, run_id: uuid.UUID) -> list[AdapterVersionOut]:
    best = runs.get_run(session, run_id).best_version
    return [
        AdapterVersionOut(**_out_fields(row), best=row.version == best, files=_files(row))
        for row in repository.list_versions(session, run_id)
    ]


def _best(session: Session, run_id: uuid.UUID) -> str:
    """The best version's number, as `_find` takes it (404 while none is ranked or while the
    base model is the best)."""
    run = runs.get_run(session, run_id)
    metric = runs.get_config(run).best_metric
    if run.best_version is None:
        raise NotFound(
            f"no version has been ranked by {metric} yet", code=ErrorCode.version_not_found
        )
    if run.best_version == 0:
        raise NotFound(
            f"the best version by {metric} is version 0, the base model ({run.best_value:.4g}); "
            "it has no adapter files",
            code=ErrorCode.version_not_found,
        )
    return str(run.best_version)


def _find(session: Session, run_id: uuid.UUID, version: str) -> AdapterVersion:
    """`version` is an integer, `latest`, `final` or `best` (the router checks the syntax)."""
    if version == "best":
        version = _best(session, run_id)
    if version == "latest":
        row = repository.latest(session, run_id)
        missing = "no adapter version has been published yet"
    elif version == "final":
        row = repository.final(session, run_id)
        missing = "no final adapter version has been published yet"
    else:
        number = int(version)
        if number == 0:
            raise NotFound(
                "version 0 is the base model; it has no adapter files",
                code=ErrorCode.version_not_found,
            )
        row = repository.by_version(session, run_id, number)
        missing = f"adapter version {number} does not exist"
    if row is None:
        raise NotFound(missing, code=ErrorCode.version_not_found)
    return row


def get_version(
    session: Session, store: ObjectStore, run_id: uuid.UUID, version: str, ttl_s: int
) -> AdapterVersionDetail:
    run = runs.get_run(session, run_id)
    row = _find(session, run_id, version)
    if row.deleted:
        raise Gone(
            f"adapter version {row.version} was deleted by retention",
            code=ErrorCode.version_deleted,
        )
    files = [
        AdapterFileDownload(
            **f.model_dump(), url=store.presign_get(f.key, ttl_s), expires_in_s=ttl_s
        )
        for f in _files(row)
    ]
    return AdapterVersionDetail(
        **_out_fields(row),
        best=row.version == run.best_version,
        base_model=run.base_model,
        files=files,
    )
