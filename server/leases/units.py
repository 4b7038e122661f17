"""How a worker call reaches the database (docs/architecture/lease-engine.md, "The lease engine").

A call is an async function written once for both databases. It runs its work as *units*, each
its own transaction committed before the next starts, so a call never holds one unit's locks
while it runs another, and a refusal changes nothing:

- `one(statement, params)`: a unit of one `Statement`. On Postgres it is one autocommitted
  statement on psycopg's async pool (or, without the pool, the same statement in a session's
  transaction), answered on the event loop (no thread hop, no BEGIN or
  COMMIT round trip, and the locks it takes, such as the run row of a grant, held for the
  statement only). On SQLite, whose single writer serialises anyway, it is the statement's
  SQLite form (the same rule as one or a few statements) in a `BEGIN IMMEDIATE` transaction in a
  request thread.
- `unit(work)`: a unit of any number of statements (the rarer branches: a heartbeat's abort, a
  rejected batch, a release, a sweep, an eval grant, the refusal's diagnosis), `work(session)`
  in one transaction in a request thread, on both databases.

A call made under an Idempotency-Key runs on a `PinnedDb` instead: all its units in one
transaction, with its stored answer (server/leases/keyed.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from fastapi.concurrency import run_in_threadpool
from psycopg.rows import namedtuple_row
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.orm import Session, sessionmaker

from server.db import transaction

T = TypeVar("T")
SqliteForm = Callable[[Session, dict[str, Any]], Sequence[Any]]


@dataclass(frozen=True)
class Statement:
    """One unit's SQL on both databases: the Postgres text (psycopg's parameter style) with the
    constants its compilation bound, and the SQLite form run on a session."""

    postgres: str
    sqlite: SqliteForm
    constants: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, statement: Any, sqlite: SqliteForm | None = None) -> Statement:
        """A SQLAlchemy statement: compiled once for psycopg, executed as it is on SQLite
        (unless `sqlite` gives the SQLite form)."""
        compiled = statement.compile(dialect=psycopg_dialect())
        constants = {k: v for k, v in compiled.params.items() if v is not None}

        def as_is(session: Session, params: dict[str, Any]) -> Sequence[Any]:
            return session.execute(statement, params).all()

        return cls(str(compiled), sqlite or as_is, constants)


@dataclass
class WorkerDb:
    """The lease engine's database: the sessions of its units and, on Postgres, the async pool
    of its one-statement units (opened by the app's lifespan, server/db_async.py)."""

    sessions: sessionmaker[Session]
    postgres: bool
    pool: AsyncConnectionPool | None = None

    async def one(self, statement: Statement, params: dict[str, Any]) -> list[Any]:
        """The statement's rows, in a unit of its own."""
        if self.pool is None:  # SQLite; or Postgres without its pool (a script, a test's session)
            return await self.unit(lambda session: self._in_session(session, statement, params))
        try:
            async with self.pool.connection() as conn:
                cursor = conn.cursor(row_factory=namedtuple_row)
                await cursor.execute(statement.postgres, {**statement.constants, **params})
                return await cursor.fetchall() if cursor.description else []
        except psycopg.OperationalError:
            # The database dropped its connections (a restart): test the idle ones now, so
            # that one request answers 503 rather than one per dead pooled connection.
            await self.pool.check()
            raise

    def _in_session(
        self, session: Session, statement: Statement, params: dict[str, Any]
    ) -> list[Any]:
        if not self.postgres:
            return list(statement.sqlite(session, params))
        values = {**statement.constants, **params}
        return list(session.connection().exec_driver_sql(statement.postgres, values).all())

    async def first(self, statement: Statement, params: dict[str, Any]) -> Any:
        rows = await self.one(statement, params)
        return rows[0] if rows else None

    async def unit(self, work: Callable[[Session], T]) -> T:
        """`work` in one transaction (BEGIN IMMEDIATE on SQLite) in a request thread."""

        def run() -> T:
            with transaction(self.sessions) as session:
                return work(session)

        return await run_in_threadpool(run)


@dataclass
class PinnedDb(WorkerDb):
    """Every unit of one call in the one transaction of `session`, each unit a SAVEPOINT (its
    refusal rolls back only itself), run in the calling thread: the calls made under an
    Idempotency-Key, whose answer is stored in the transaction of their change, each in a
    request thread of its own (server/leases/keyed.py). Its one-statement units are the
    session's, never the pool's."""

    session: Session | None = None

    async def unit(self, work: Callable[[Session], T]) -> T:
        session = self.session
        assert session is not None
        with session.begin_nested():
            return work(session)


class WorkerCalls(Counter[str]):
    """How many worker calls this process answered, by call: exported on /metrics."""


async def counted(calls: WorkerCalls, name: str, call: Awaitable[T], count: int = 1) -> T:
    """The call's answer, counted (answered or refused) under its name."""
    try:
        return await call
    finally:
        calls[name] += count
