"""POST /api/v1/datasets: the body is streamed to a temp file (hashed and size-bounded as it
arrives, each JSONL line checked as it arrives), then put in the bucket and recorded `pending`.

Checked here, in the request (a refusal is 413/422 and leaves nothing behind: no temp file, no
object, no row): the declared and actual size, and for JSONL every line (UTF-8, one JSON object,
finite numbers, at most `datasets.max_row_bytes`) and at least one row; for Parquet the footer
(readable, at least one row, its columns and their types) and then every row (JSON values, UTF-8
text, row size), read from the temp file in batches bounded by bytes; the row count stored is
the rows read (a footer claiming another count is refused). The `datasets` job
checks the stored object again before the dataset is `ready`."""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from anyio import to_thread
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import ClientDisconnect

from protocol import layout
from protocol.datasets import DatasetError
from protocol.error_codes import ErrorCode
from protocol.storage import ObjectStore
from protocol.storage_local import LocalStore
from server.config import DatasetSettings
from server.datasets import files, repository
from server.datasets.schemas import DatasetOut
from server.db import transaction
from server.errors import BadRequest, PayloadTooLarge, Unprocessable
from server.models import Dataset
from server.models.project import DEFAULT_PROJECT_ID

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def format_of(name: str, fmt: str | None) -> str:
    """The format given, else the file name's suffix; 422 naming the field otherwise."""
    if fmt is not None:
        return fmt
    found = SUFFIXES.get(Path(name).suffix.lower())
    if found is None:
        raise Unprocessable(
            f"cannot tell the format of {name!r}: name a .jsonl or .parquet file, or pass "
            "format=jsonl|parquet",
            field="format",
            code=ErrorCode.invalid_value,
        )
    return found


def refuse_declared(content_length: str | None, limits: DatasetSettings) -> None:
    """413 before reading when Content-Length is over the limit."""
    if content_length is not None and content_length.strip().isdigit():
        declared = int(content_length)
        if declared > limits.max_upload_bytes:
            raise PayloadTooLarge(
                f"dataset file of {declared:,} bytes is over the {limits.max_upload_bytes:,}-byte "
                "limit (datasets.max_upload_bytes)",
                code=ErrorCode.upload_too_large,
            )


@dataclass
class _Sink:
    """The temp file being written, its digest and size, and the JSONL check."""

    path: Path
    out: BinaryIO
    limits: DatasetSettings
    jsonl: files.JsonlCheck | None
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    size: int = 0

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limits.max_upload_bytes:
            raise PayloadTooLarge(
                f"dataset file over the {self.limits.max_upload_bytes:,}-byte limit "
                "(datasets.max_upload_bytes)",
                code=ErrorCode.upload_too_large,
            )
        self.digest.update(chunk)
        self.out.write(chunk)
        if self.jsonl is not None:
            self.jsonl.feed(chunk)

    def shape(self) -> tuple[int, list[str]]:
        self.out.close()
        if self.jsonl is not None:
            self.jsonl.finish()
            return self.jsonl.rows, self.jsonl.columns.as_list()
        footer_rows, columns = files.parquet_shape(self.path)
        # each row raises DatasetError naming itself, as a JSONL line does
        rows = files.parquet_rows_read(self.path, self.limits.max_row_bytes, footer_rows)
        return rows, columns


def _temp(store: ObjectStore) -> Path:
    if isinstance(store, LocalStore):
        return store.new_temp()  # same filesystem as the objects: committed by a rename
    fd, name = tempfile.mkstemp(prefix="asyncgrpo-dataset-")
    os.close(fd)
    return Path(name)


async def _chunks(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in body:
            if chunk:
                yield chunk
    except ClientDisconnect:
        raise BadRequest(
            "client disconnected before the file was complete", code=ErrorCode.body_incomplete
        ) from None


async def receive(
    body: AsyncIterator[bytes],
    *,
    name: str,
    fmt: str,
    store: ObjectStore,
    factory: sessionmaker[Session],
    limits: DatasetSettings,
    project_id: uuid.UUID = DEFAULT_PROJECT_ID,
    on_recorded: Callable[[Session, Dataset], object] | None = None,
) -> DatasetOut:
    """Stream, check, store and record the upload (pending, in `project_id`); nothing is left
    on a refusal. `on_recorded` runs in the recording transaction (the upload's audit entry)."""
    tmp = _temp(store)
    jsonl = files.JsonlCheck(limits.max_row_bytes) if fmt == "jsonl" else None
    sink = _Sink(tmp, open(tmp, "wb"), limits, jsonl)  # noqa: SIM115 - closed in finally
    try:
        async for chunk in _chunks(body):
            await to_thread.run_sync(sink.feed, chunk)
        rows, columns = await to_thread.run_sync(sink.shape)
        dataset_id = uuid.uuid4()
        key = layout.dataset_key(dataset_id, fmt)
        await to_thread.run_sync(_put, store, key, tmp)
    except DatasetError as exc:
        raise Unprocessable(
            str(exc), field="file", code=exc.code or ErrorCode.invalid_dataset_file
        ) from None
    finally:
        sink.out.close()
        tmp.unlink(missing_ok=True)

    def record() -> DatasetOut:
        with transaction(factory) as session:
            dataset = repository.insert(
                session,
                id=dataset_id,
                name=name,
                kind="uploaded",
                status="pending",
                format=fmt,
                bucket_key=key,
                sha256=sink.digest.hexdigest(),
                size_bytes=sink.size,
                row_count=rows,
                columns=columns,
                project_id=project_id,
            )
            session.refresh(dataset)  # created_at, from the database
            if on_recorded is not None:
                on_recorded(session, dataset)
            return DatasetOut.model_validate(dataset)

    try:
        return await to_thread.run_sync(record)
    except BaseException:
        await to_thread.run_sync(store.delete, key)
        raise


def _put(store: ObjectStore, key: str, tmp: Path) -> None:
    if isinstance(store, LocalStore):
        store.commit_temp(tmp, key, if_none_match=True)
    else:
        store.put_file(key, tmp, if_none_match=True)
