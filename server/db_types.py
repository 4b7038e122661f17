"""Column types and database-time expressions that behave the same on Postgres and SQLite."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    DateTime,
    Float,
    Integer,
    String,
    cast,
    func,
    types,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

BigIntPK = BigInteger().with_variant(Integer(), "sqlite")
JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(types.TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps; stored naive (UTC) on SQLite, timestamptz on Postgres."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        if dialect.name == "sqlite":
            return value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class db_now(FunctionElement[datetime]):  # noqa: N801 - reads like SQL's now()
    """The database's current time with sub-second precision (never the client's clock)."""

    type = UTCDateTime()
    inherit_cache = True


@compiles(db_now)
def _now_default(element: Any, compiler: Any, **kw: Any) -> str:
    return "clock_timestamp()"


@compiles(db_now, "sqlite")
def _now_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "strftime('%Y-%m-%d %H:%M:%f','now')"


class db_now_plus(FunctionElement[datetime]):  # noqa: N801
    """Database time plus a number of seconds (a bound float)."""

    type = UTCDateTime()
    inherit_cache = True


@compiles(db_now_plus)
def _now_plus_default(element: Any, compiler: Any, **kw: Any) -> str:
    (seconds,) = list(element.clauses)
    return f"clock_timestamp() + make_interval(secs => {compiler.process(seconds, **kw)})"


@compiles(db_now_plus, "sqlite")
def _now_plus_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    (seconds,) = list(element.clauses)
    sec = compiler.process(seconds, **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f','now', printf('%+.3f seconds', {sec}))"


class db_time_of(FunctionElement[datetime]):  # noqa: N801
    """A bound time as the database writes its own (db_now), to compare with stored times:
    on SQLite db_now's text has milliseconds, a bound datetime's text microseconds, so the
    same instant would compare as two (`'…06.201' < '…06.201000'`)."""

    type = UTCDateTime()
    inherit_cache = True


@compiles(db_time_of)
def _time_of_default(element: Any, compiler: Any, **kw: Any) -> str:
    (value,) = list(element.clauses)
    return str(compiler.process(value, **kw))


@compiles(db_time_of, "sqlite")
def _time_of_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    (value,) = list(element.clauses)
    return f"strftime('%Y-%m-%d %H:%M:%f', {compiler.process(value, **kw)})"


def postgres_text(expression: Any) -> str:
    """A SQL expression as Postgres text with its constants inlined, for the statements kept as
    text (docs/decisions/0020-hot-statements-once.md): one rule, rendered, not rewritten."""
    return str(
        expression.compile(dialect=psycopg_dialect(), compile_kwargs={"literal_binds": True})
    )


class psycopg_param(ColumnElement[Any]):  # noqa: N801
    """A named psycopg parameter, `%(name)s`, inside an expression rendered by postgres_text
    for a statement kept as text: the expression's rule rendered around it."""

    inherit_cache = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.type = String()


@compiles(psycopg_param)
def _psycopg_param(element: Any, compiler: Any, **kw: Any) -> str:
    return f"%({element.name})s"


class json_has(FunctionElement[bool]):  # noqa: N801
    """Whether a JSON array column holds this string: jsonb's `?` on Postgres, json_each on
    SQLite (a worker's registered models)."""

    type = Boolean()
    inherit_cache = True


@compiles(json_has)
def _json_has_default(element: Any, compiler: Any, **kw: Any) -> str:
    array, value = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"({array} ? {value})"


@compiles(json_has, "sqlite")
def _json_has_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    array, value = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"EXISTS (SELECT 1 FROM json_each({array}) WHERE json_each.value = {value})"


def new_uuid() -> uuid.UUID:
    return uuid.uuid4()


class epoch_seconds(FunctionElement[float]):  # noqa: N801
    """A timestamp column as Unix seconds (a float), on either database."""

    type = Float()
    inherit_cache = True


@compiles(epoch_seconds)
def _epoch_default(element: Any, compiler: Any, **kw: Any) -> str:
    (value,) = list(element.clauses)
    return f"extract(epoch FROM {compiler.process(value, **kw)})"


@compiles(epoch_seconds, "sqlite")
def _epoch_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    (value,) = list(element.clauses)
    return f"((julianday({compiler.process(value, **kw)}) - 2440587.5) * 86400.0)"


def epoch_bucket(column: Any, bucket_s: int) -> Any:
    """The index of the `bucket_s`-second interval a timestamp falls in (× bucket_s = Unix s)."""
    return cast(func.floor(epoch_seconds(column) / bucket_s), Integer)
