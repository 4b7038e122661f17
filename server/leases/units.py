"""How a worker call reaches the database (docs/architecture.md, "The lease engine"): the whole
call runs in one request thread (one thread-pool hop), as one or more *units*, each its own
transaction committed before the next starts. A call's compare-and-set is always inside one
unit, so a refusal changes nothing; a call never holds one unit's locks while it runs another.

A `statement` unit holds one statement on Postgres and runs autocommitted there: the locks it
takes (the run row of a grant, which every grant on the run waits for) are held for that
statement only, not across a COMMIT round trip. On SQLite a statement unit is a `BEGIN
IMMEDIATE` transaction like any other, since the helpers that run several statements where
Postgres needs one (server/leases/statements.py) run in it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from server.db import make_sessionmaker, transaction

T = TypeVar("T")


@dataclass(frozen=True)
class WorkerDb:
    """The lease engine's two kinds of unit on one database."""

    sessions: sessionmaker[Session]
    statements: sessionmaker[Session]
    postgres: bool

    @classmethod
    def of(cls, engine: Engine, sessions: sessionmaker[Session]) -> WorkerDb:
        postgres = engine.dialect.name == "postgresql"
        single = engine.execution_options(isolation_level="AUTOCOMMIT") if postgres else engine
        return cls(sessions, make_sessionmaker(single) if postgres else sessions, postgres)

    @contextmanager
    def unit(self) -> Iterator[Session]:
        """A transaction (BEGIN IMMEDIATE on SQLite), committed on leaving, rolled back on error."""
        with transaction(self.sessions) as session:
            yield session

    @contextmanager
    def statement(self) -> Iterator[Session]:
        """A unit of one statement: autocommitted on Postgres, a transaction on SQLite."""
        with transaction(self.statements) as session:
            yield session


class WorkerCalls(Counter[str]):
    """How many worker calls this process answered, by call: exported on /metrics."""


async def in_thread(calls: WorkerCalls, name: str, call: Callable[[], T], count: int = 1) -> T:
    """The call's one thread-pool hop, counted (answered or refused) under its name."""
    try:
        return await run_in_threadpool(call)
    finally:
        calls[name] += count
