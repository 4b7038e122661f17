"""The bucket at start and while the server runs (docs/architecture/bucket.md, "Startup and
readiness").

At start a bucket that does not exist ends the start of a server (and of `asyncgrpo jobs` or the
Celery app) with one line saying how to create it, unless ASYNCGRPO_S3__CREATE_BUCKET lets the
server create it; a local folder is always created. A bucket that cannot be reached (the
endpoint is down) lets a server start and answer 503 until it can. Each server process then
checks its bucket every `bucket_check_interval_s` (BucketWatch): GET /readyz reports the last
check, and the first check that reaches the bucket again binds it to the database
(server/installation.py), so a bucket created or repaired after the start is used without a
restart."""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from protocol.storage import ObjectStore, StoreError
from server.config import Settings
from server.db import make_engine, make_sessionmaker
from server.installation import (
    BucketMismatch,
    BucketUnreachable,
    bind_bucket,
    mismatch_message,
    recorded_bucket,
)
from server.storage_factory import make_store

log = logging.getLogger("asyncgrpo.server")


class BucketNotFound(RuntimeError):
    """The configured bucket does not exist and this process may not create it."""


def describe(settings: Settings) -> str:
    """The bucket and where it is, as an operator would look for it."""
    if not settings.bucket_url.startswith("s3://"):
        return f"the folder {settings.bucket_url}"
    endpoint = settings.s3.endpoint_url or f"AWS S3, region {settings.s3.region}"
    return f"the bucket {_bucket_name(settings)} ({settings.bucket_url}) at {endpoint}"


def _bucket_name(settings: Settings) -> str:
    return settings.bucket_url[len("s3://") :].partition("/")[0]


def missing_message(settings: Settings) -> str:
    if not settings.bucket_url.startswith("s3://"):
        return (
            f"{describe(settings)} does not exist: `asyncgrpo server` creates it; give every "
            "process the server's ASYNCGRPO_BUCKET_URL"
        )
    name = _bucket_name(settings)
    endpoint = settings.s3.endpoint_url
    aws = f"aws s3 mb s3://{name}" + (f" --endpoint-url {endpoint}" if endpoint else "")
    return (
        f"{describe(settings)} does not exist: create it (`{aws}`, or MinIO's `mc mb "
        f"ALIAS/{name}`) or set ASYNCGRPO_S3__CREATE_BUCKET=true to let the server create it"
    )


def ensure_bucket(store: ObjectStore, settings: Settings, *, may_create: bool) -> None:
    """BucketNotFound when the bucket does not exist and `may_create` (a server) does not allow
    creating it here; StoreError when the store cannot tell."""
    if store.bucket_exists():
        return
    local = not settings.bucket_url.startswith("s3://")
    if may_create and (local or settings.s3.create_bucket):
        store.create_bucket()
        log.info("created %s", describe(settings))
        return
    raise BucketNotFound(missing_message(settings))


def check_bucket(
    factory: sessionmaker[Session], store: ObjectStore, settings: Settings, *, first: bool
) -> None:
    """The start check of every process that touches the bucket: it exists (or is created),
    and it is the database's (bind_bucket). BucketNotFound, BucketMismatch or BucketUnreachable.
    `first`: a server, which may create the bucket and be the first to record it."""
    try:
        ensure_bucket(store, settings, may_create=first)
    except (StoreError, BotoCoreError, OSError) as exc:
        raise BucketUnreachable(f"cannot reach {describe(settings)}: {exc}") from exc
    except BucketNotFound:
        expected = recorded_bucket(factory)
        if expected is not None and expected != settings.bucket_url:  # the wrong one, named
            raise BucketMismatch(
                mismatch_message(expected, settings.bucket_url, "does not exist")
            ) from None
        raise
    bind_bucket(factory, store, settings.bucket_url, first=first)


def start_refusal(settings: Settings, engine: Engine, *, first: bool) -> str | None:
    """Why this process must not start (one line), or None. A server (`first`) starts while
    its bucket cannot be reached (it answers 503 and binds the bucket once it can); the jobs do
    not, since they would account for and delete objects of a bucket they cannot check."""
    try:
        check_bucket(make_sessionmaker(engine), make_store(settings), settings, first=first)
    except BucketUnreachable as exc:
        if first:
            log.warning("%s; starting without the check (GET /readyz says when it is done)", exc)
            return None
        return str(exc)
    except (BucketNotFound, BucketMismatch) as exc:
        return str(exc)
    except DBAPIError as exc:
        return f"cannot read the database ({exc.orig}); has `asyncgrpo db upgrade` run?"
    return None


def exit_unless_bucket_ok(settings: Settings) -> None:
    """For the Celery app started directly: the same start check as `asyncgrpo jobs`, and an
    exit with one line (status 2) when it fails."""
    try:
        engine = make_engine(settings.database_url)
    except (SQLAlchemyError, ImportError) as exc:
        refusal: str | None = f"ASYNCGRPO_DATABASE_URL is not a usable database URL ({exc})"
    else:
        try:
            refusal = start_refusal(settings, engine, first=False)
        finally:
            engine.dispose()
    if refusal is not None:
        # the real stderr: celery beat has already redirected sys.stderr into its log
        print(f"error: {refusal}", file=sys.__stderr__, flush=True)
        raise SystemExit(2)


@dataclass(frozen=True)
class BucketState:
    ready: bool
    reason: str  # "ok", or why the bucket is not ready


NOT_CHECKED = BucketState(False, "not checked yet")


class BucketWatch:
    """One server process's view of its bucket, refreshed every `interval_s` by a thread."""

    def __init__(
        self, factory: sessionmaker[Session], store: ObjectStore, settings: Settings
    ) -> None:
        self._factory, self._store, self._settings = factory, store, settings
        self.state = NOT_CHECKED
        self._bound = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start_check(self) -> None:
        """The check at start: BucketNotFound and BucketMismatch end the start; a bucket that
        cannot be reached leaves the state not ready until a later check reaches it."""
        try:
            check_bucket(self._factory, self._store, self._settings, first=True)
        except BucketUnreachable as exc:
            log.warning("%s; starting without the check (GET /readyz says when it is done)", exc)
            self.state = BucketState(False, str(exc))
            return
        self._bound = True
        self.state = BucketState(True, "ok")

    def check(self) -> BucketState:
        """Check the bucket once; bind it when it is reached after being missing or down."""
        try:
            if not self._store.bucket_exists():
                self._bound = False  # recreated later: bind (and mark) it again
                state = BucketState(False, missing_message(self._settings))
            else:
                if not self._bound:
                    bind_bucket(self._factory, self._store, self._settings.bucket_url, first=True)
                    self._bound = True
                    log.info("%s is reachable and recorded", describe(self._settings))
                state = BucketState(True, "ok")
        except BucketMismatch as exc:
            state = BucketState(False, str(exc))
        except (BucketUnreachable, StoreError, BotoCoreError, OSError, SQLAlchemyError) as exc:
            self._bound = False
            state = BucketState(False, f"cannot reach {describe(self._settings)}: {exc}")
        if state != self.state and not state.ready:
            log.warning("bucket not ready: %s", state.reason)
        self.state = state
        return state

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bucket-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._settings.bucket_check_interval_s):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
