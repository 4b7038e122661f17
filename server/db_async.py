"""The async Postgres pool of the lease engine's one-statement units (server/leases/units.py),
answered on the event loop. SQLite has none: its units run in a request thread."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool
from sqlalchemy.engine import make_url

from server.config import Settings


def libpq_url(database_url: str) -> str:
    """postgresql+psycopg://… (SQLAlchemy's spelling) as the libpq URL psycopg connects with."""
    url = make_url(database_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


async def open_pool(settings: Settings) -> AsyncConnectionPool | None:
    if not settings.database_url.startswith("postgresql"):
        return None
    pool = AsyncConnectionPool(
        libpq_url(settings.database_url),
        min_size=1,
        max_size=settings.database_async_pool_size,
        open=False,
        timeout=30.0,
        name="asyncgrpo-worker-calls",
        # Each of these units is one statement: its own transaction, with no BEGIN or COMMIT
        # round trip (server/leases/units.py).
        kwargs={"autocommit": True},
    )
    await pool.open()
    return pool
