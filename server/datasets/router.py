"""Datasets API (admin and project tokens, server/tokens/access.py): upload a JSONL or Parquet
file, list, read, delete."""

from __future__ import annotations

import uuid
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Query, Request, Response, status

from protocol.schemas import BIGINT_MAX
from server.audit.recorder import AuditDep
from server.datasets import service, upload
from server.datasets.schemas import DatasetFormat, DatasetOut
from server.db import transaction
from server.deps import SessionDep, SettingsDep, StoreDep
from server.projects import service as projects
from server.projects.params import ProjectQuery
from server.routing import TransactionalRoute
from server.tokens.access import (
    Caller,
    DatasetDeleter,
    DatasetReader,
    DatasetUploader,
    Reader,
)
from server.wake import wake

DATASETS_PATH = "/api/v1/datasets"
router = APIRouter(prefix=DATASETS_PATH, tags=["datasets"], route_class=TransactionalRoute)


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=DatasetOut)
async def upload_dataset(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    caller: DatasetUploader,
    audit: AuditDep,
    name: Annotated[
        str,
        Query(
            min_length=1,
            max_length=200,
            pattern=r"^[^\x00]*$",
            description="File name (its suffix gives the format); no NUL.",
        ),
    ] = "dataset.jsonl",
    format: Annotated[  # noqa: A002 - the public query parameter's name
        DatasetFormat | None, Query(description="jsonl or parquet; default: from the name.")
    ] = None,
    project: ProjectQuery = None,
) -> DatasetOut:
    """Upload a dataset file as the raw request body (JSONL: one JSON object per line, UTF-8;
    or Parquet) into `project` (only its runs may read it). Streamed to the bucket with its
    sha256; 413 over `datasets.max_upload_bytes` (before reading when Content-Length says so);
    422 with the reason (naming the line) for a file that cannot be a dataset, 422
    unknown_project before reading for a project that does not exist, and nothing is kept.
    Answers 202 with the dataset `pending`: the `datasets` job makes it `ready` (rows, columns,
    fingerprint) or `failed` (reason)."""
    limits = settings.datasets
    upload.refuse_declared(request.headers.get("content-length"), limits)
    fmt = upload.format_of(name, format)
    project_id = await to_thread.run_sync(_project_of, request, caller, project)
    created = await upload.receive(
        request.stream(),
        name=name,
        fmt=fmt,
        store=store,
        factory=request.app.state.sessionmaker,
        limits=limits,
        project_id=project_id,
        on_recorded=lambda session, dataset: audit.record(
            session, caller.token.id, "dataset", dataset.id, detail={"name": dataset.name}
        ),
    )
    wake(request.app.state, "datasets")
    return created


def _project_of(request: Request, caller: Caller, project: str | None) -> uuid.UUID:
    """The upload's project (within the caller's reach), resolved before the body is read
    (the upload records its row in a transaction of its own, after the file is stored)."""
    with transaction(request.app.state.sessionmaker) as session:
        return projects.resolve_for(session, caller, project)


@router.get("", response_model=list[DatasetOut])
def list_datasets(
    session: SessionDep,
    caller: Reader,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 100,
    offset: Annotated[
        int, Query(ge=0, le=BIGINT_MAX, description="Datasets to skip (newest first).")
    ] = 0,
    project: ProjectQuery = None,
) -> list[DatasetOut]:
    """Datasets, newest first, with status, row counts, columns and project; of one project
    when `project` is given (a project token's: its own project's only)."""
    project_id = projects.listing_scope(session, caller, project)
    return service.list_datasets(session, limit, offset, project_id)


@router.get("/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: uuid.UUID, session: SessionDep, _caller: DatasetReader) -> DatasetOut:
    """One dataset with its status, row count and columns (and why a failed one failed)."""
    return DatasetOut.model_validate(service.get(session, dataset_id))


@router.delete("/{dataset_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_dataset(
    dataset_id: uuid.UUID,
    session: SessionDep,
    store: StoreDep,
    caller: DatasetDeleter,
    audit: AuditDep,
) -> Response:
    """Delete a dataset and its file; 409 while a run uses it."""
    project_id = service.get(session, dataset_id).project_id
    service.delete(session, store, dataset_id)
    audit.record(session, caller.token, "dataset", dataset_id, project_id=project_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
