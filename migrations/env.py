"""Alembic environment: the URL comes from the Config (set by server.migrate) or settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from server.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from server.db import make_engine

    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from server.config import Settings

        url = Settings().database_url
    engine = make_engine(url)
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")
run_migrations_online()
