"""The `datasets` job: every pending dataset becomes ready or failed. An upload's rows were all
checked in its request (JSONL lines as they streamed, Parquet rows from the received file), so
it is only confirmed in the bucket; an hf dataset is loaded with the `datasets` library
(imported here only: it is slow to import), written to the bucket as Parquet and read the same
way. One dataset at a time, each finished by a compare-and-set on `pending`; a bucket error
(S3 unreachable, 5xx) leaves it pending for the next pass."""

from __future__ import annotations

import hashlib
import logging
import tempfile
import uuid
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError
from sqlalchemy.orm import Session, sessionmaker

from protocol.datasets import DatasetError
from protocol.storage import (
    InvalidKey,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    sha256_file,
)
from server.config import DatasetSettings
from server.datasets import files, repository
from server.db import transaction
from server.events.service import raise_event

log = logging.getLogger("asyncgrpo.jobs.datasets")
MAX_REASON = 2000


def check_pending(
    factory: sessionmaker[Session], store: ObjectStore, limits: DatasetSettings
) -> int:
    """Finish every pending dataset; returns how many changed status."""
    with transaction(factory) as session:
        ids = repository.pending_ids(session)
    return sum(_finish_one(factory, store, limits, dataset_id) for dataset_id in ids)


def _finish_one(
    factory: sessionmaker[Session],
    store: ObjectStore,
    limits: DatasetSettings,
    dataset_id: uuid.UUID,
) -> bool:
    with transaction(factory) as session:
        dataset = repository.get(session, dataset_id)
        if dataset is None or dataset.status != "pending":
            return False
        kind, key = dataset.kind, dataset.bucket_key
        spec, expected = dataset.spec, (dataset.size_bytes, dataset.sha256, dataset.row_count)
    try:
        if kind == "hf":
            values = _load_hf(store, limits, key, spec or {})
        else:
            values = _confirm(store, key, expected)
        values["status"] = "ready"
    except Exception as exc:  # any failure is the dataset's reason, never the job's crash
        if _bucket_trouble(exc):  # not the data's fault: keep it (and its file), retry later
            log.warning("dataset %s: bucket error, tried again next pass: %s", dataset_id, exc)
            return False
        log.info("dataset %s failed: %s", dataset_id, exc)
        values = {"status": "failed", "reason": _reason(exc)}
        if kind == "uploaded":
            store.delete(key)
    with transaction(factory) as session:
        moved = repository.finish(session, dataset_id, **values)
        if moved:
            _event(session, dataset_id, values)
    return moved


def _bucket_trouble(exc: BaseException) -> bool:
    """An object-store failure that says nothing about the file (S3 unreachable, a 5xx, a
    timeout): failing the dataset for it would delete an upload that is fine. A missing object
    is the dataset's failure."""
    if isinstance(exc, ObjectNotFound | InvalidKey):
        return False
    return isinstance(exc, StoreError | BotoCoreError)


def _reason(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, DatasetError) else f"{type(exc).__name__}: {exc}"
    return text[:MAX_REASON]


def _event(session: Session, dataset_id: uuid.UUID, values: dict[str, Any]) -> None:
    ready = values["status"] == "ready"
    raise_event(
        session,
        kind="dataset.status",
        severity="info" if ready else "warning",
        message=f"dataset {dataset_id} is {values['status']}"
        + ("" if ready else f": {values['reason']}"),
        data={"dataset_id": str(dataset_id), "status": values["status"]},
    )


def _confirm(store: ObjectStore, key: str, expected: tuple[Any, ...]) -> dict[str, Any]:
    """An upload was checked row by row in its request: its object must be there."""
    size, sha256, _rows = expected
    info = store.head(key)
    if info is None or info.size != size:
        raise DatasetError(f"the uploaded file is missing from the bucket ({key})")
    return {"fingerprint": sha256}


def _count_rows(path: Path, limits: DatasetSettings) -> int:
    """Read every row of a Parquet file (each checked as an upload's is); how many."""
    return sum(1 for _row in files.iter_rows(path, "parquet", limits.max_row_bytes))


def _load_hf(
    store: ObjectStore, limits: DatasetSettings, key: str, spec: dict[str, Any]
) -> dict[str, Any]:
    import datasets as hf  # the `datasets` library, not this package: slow to import

    kwargs = {k: spec[k] for k in ("name", "revision", "data_files") if spec.get(k) is not None}
    try:
        loaded = hf.load_dataset(
            spec["path"], split=spec.get("split", "train"), cache_dir=limits.hf_cache_dir, **kwargs
        )
    except StopIteration:  # the json loader on empty data files says only this
        raise DatasetError("the dataset holds no rows (a dataset needs at least one)") from None
    if not isinstance(loaded, hf.Dataset):
        raise DatasetError(f"split {spec.get('split')!r} did not give one dataset")
    if loaded.num_rows == 0:
        raise DatasetError("the dataset holds no rows (a dataset needs at least one)")
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-hf-") as folder:
        path = Path(folder) / "data.parquet"
        loaded.to_parquet(str(path), **files.SMALL_PAGE_WRITE)  # pages read back bounded
        count = _count_rows(path, limits)
        digest = sha256_file(path)
        size = path.stat().st_size
        store.put_file(key, path)
    fingerprint = (
        getattr(loaded, "_fingerprint", None) or hashlib.sha256(digest.encode()).hexdigest()
    )
    return {
        "fingerprint": str(fingerprint)[:128],
        "sha256": digest,
        "size_bytes": size,
        "row_count": count,
        "columns": list(loaded.column_names),
    }
