"""One database, one bucket. Every process that touches the bucket (the server's processes,
`asyncgrpo jobs`) must use the bucket the database's objects live in: a jobs process left on the
default ./bucket would mark versions deleted in the database while their S3 objects stay.

The first server to start records the database's id and its bucket URL in the `installation`
row and writes the id into the bucket's marker object (MARKER_KEY). Every later start reads the
marker of its own bucket: the same id means the same bucket; another id, or no marker while the
database already has a bucket, refuses the start with both buckets named."""

from __future__ import annotations

import json
import time
import uuid

from botocore.exceptions import BotoCoreError, ClientError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from protocol.storage import ObjectExists, ObjectNotFound, ObjectStore, StoreError
from server.db import transaction
from server.models import Installation

MARKER_KEY = ".asyncgrpo/database.json"
ROW_ID = 1
# How long a start that finds a marked bucket and no record waits for a sibling process (which
# marked it a moment ago) to insert the record.
SIBLING_WAIT_S = 3.0


class BucketMismatch(RuntimeError):
    """This process's bucket is not the one the database's objects live in."""


class BucketUnreachable(RuntimeError):
    """The marker could not be read or written (the bucket is down or refuses us)."""


def bind_bucket(
    factory: sessionmaker[Session], store: ObjectStore, bucket_url: str, *, first: bool
) -> uuid.UUID:
    """Check (and, for the first server, record) that `store` is the database's bucket; the
    database's id. `first`: this process may be the first to start on the database (the
    server); `asyncgrpo jobs` may not, so a misconfigured jobs process cannot claim a bucket.
    Nothing is recorded unless the check passes: a refused start leaves the database as it was."""
    record = _record(factory)
    if record is None and not first:
        raise BucketMismatch(
            "no server has recorded its bucket on this database yet: start `asyncgrpo server` "
            "first; a server that runs records it once it reaches the bucket (its GET /readyz "
            f"says why it has not) (this process has the bucket {bucket_url})"
        )
    try:
        marked = _read_marker(store)
        if record is None:
            record = _first_start(factory, store, bucket_url, marked)
        elif marked is None and record[1] == bucket_url:  # the marker was lost: write it again
            marked = _write_marker(store, record[0])
    except (ObjectNotFound, ObjectExists, OSError, StoreError, BotoCoreError, ClientError) as exc:
        raise BucketUnreachable(
            f"cannot check the marker {MARKER_KEY} of the bucket {bucket_url}: {exc}"
        ) from exc
    database_id, expected = record
    if marked is None and record[1] != bucket_url:
        raise BucketMismatch(mismatch_message(expected, bucket_url, "holds no marker"))
    if marked is not None and marked != database_id:
        raise BucketMismatch(
            mismatch_message(expected, bucket_url, f"belongs to another database (id {marked})")
        )
    if expected != bucket_url:  # the same bucket under another URL (moved folder, new endpoint)
        _update_url(factory, bucket_url)
    return database_id


def _first_start(
    factory: sessionmaker[Session], store: ObjectStore, bucket_url: str, marked: uuid.UUID | None
) -> tuple[uuid.UUID, str]:
    """No record yet. An unmarked bucket is marked with a new id and the record inserted; a
    marked one may be a sibling process's doing a moment ago (its record appears), otherwise it
    belongs to another database."""
    if marked is None:
        new_id = uuid.uuid4()
        if _write_marker(store, new_id) == new_id:
            return _insert(factory, new_id, bucket_url)
    deadline = time.monotonic() + SIBLING_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.1)
        record = _record(factory)
        if record is not None:
            return record
    theirs = _read_marker(store)
    raise BucketMismatch(
        f"the bucket {bucket_url} belongs to another database (id {theirs}, its {MARKER_KEY}); "
        "this database has no bucket yet: point ASYNCGRPO_BUCKET_URL at an empty bucket or "
        "prefix, or at this database's own"
    )


def mismatch_message(expected: str, bucket_url: str, why: str) -> str:
    return (
        f"the database expects the bucket {expected} (ASYNCGRPO_BUCKET_URL of the first server); "
        f"this process has {bucket_url}, which {why} (its {MARKER_KEY}). Give every process the "
        "same ASYNCGRPO_BUCKET_URL and ASYNCGRPO_S3__* settings"
    )


def recorded_bucket(factory: sessionmaker[Session]) -> str | None:
    """The bucket URL the first server recorded, or None."""
    record = _record(factory)
    return None if record is None else record[1]


def _record(factory: sessionmaker[Session]) -> tuple[uuid.UUID, str] | None:
    with transaction(factory) as session:
        row = session.get(Installation, ROW_ID)
        return None if row is None else (row.database_id, row.bucket_url)


def _insert(
    factory: sessionmaker[Session], database_id: uuid.UUID, bucket_url: str
) -> tuple[uuid.UUID, str]:
    try:
        with transaction(factory) as session:
            session.add(Installation(id=ROW_ID, database_id=database_id, bucket_url=bucket_url))
    except IntegrityError:
        pass  # inserted a moment ago by a process that started on another bucket
    record = _record(factory)
    assert record is not None
    return record


def _update_url(factory: sessionmaker[Session], bucket_url: str) -> None:
    with transaction(factory) as session:
        row = session.get(Installation, ROW_ID)
        if row is not None:
            row.bucket_url = bucket_url


def _read_marker(store: ObjectStore) -> uuid.UUID | None:
    try:
        data = json.loads(store.get_bytes(MARKER_KEY))
    except ObjectNotFound:
        return None
    return uuid.UUID(str(data["database_id"]))


def _write_marker(store: ObjectStore, database_id: uuid.UUID) -> uuid.UUID:
    body = json.dumps({"database_id": str(database_id)}).encode()
    try:
        store.put_bytes(MARKER_KEY, body, if_none_match=True)
    except ObjectExists:  # another process wrote it first: its id decides
        marked = _read_marker(store)
        assert marked is not None
        return marked
    return database_id
