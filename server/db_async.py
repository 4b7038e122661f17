"""The async Postgres pool that serves the worker calls' common case on the event loop
(server/leases/fast_service.py). SQLite has none: its single writer takes the portable path."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool
from sqlalchemy.engine import make_url

from server.config import Settings


def libpq_url(database_url: str) -> str:
    """postgresql+psycopg://… (SQLAlchemy's spelling) as the libpq URL psycopg connects with."""
    url = make_url(database_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


async def open_pool(settings: Settings) -> AsyncConnectionPool | None:
    if not (settings.worker_calls_on_event_loop and settings.database_url.startswith("postgresql")):
        return None
    pool = AsyncConnectionPool(
        libpq_url(settings.database_url),
        min_size=1,
        max_size=settings.database_async_pool_size,
        open=False,
        timeout=30.0,
        name="asyncgrpo-worker-calls",
        # Each write of the event-loop path is one statement: its own transaction, with no
        # BEGIN or COMMIT round trip (server/leases/fast_repository.py).
        kwargs={"autocommit": True},
    )
    await pool.open()
    return pool
