"""Engine and sessions. Only the request's session dependency commits or rolls back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.orm import Session, sessionmaker

from server.db_types import db_now

SQLITE_BUSY_TIMEOUT_MS = 30_000


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "isolation_level": None}, **kwargs
        )
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_size", 20)
    kwargs.setdefault("max_overflow", 20)
    # No ping per checkout (a round trip on every request): after a database restart the first
    # request on a dead connection fails with a disconnect error, SQLAlchemy invalidates the
    # whole pool, and the app answers 503 + Retry-After (server/errors.py) for clients to retry.
    kwargs.setdefault("pool_pre_ping", False)
    return create_engine(url, **kwargs)


def _configure_sqlite(engine: Engine) -> None:
    """WAL, a busy timeout, foreign keys; transactions start with BEGIN IMMEDIATE so the one
    writer holds the lock for the whole lease transaction (the single-writer path)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=True)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """The one transaction boundary: commit on success, roll back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def ping(session: Session) -> None:
    session.execute(text("SELECT 1"))


def db_time(session: Session) -> datetime:
    """The database's current time (jobs and derived states never use the local clock)."""
    now: datetime = session.execute(select(db_now())).scalar_one()
    return now
