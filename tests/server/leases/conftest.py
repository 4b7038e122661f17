from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session


@pytest.fixture
def any_session(db_url: str) -> Iterator[Session]:
    """A session on a fresh migrated database, Postgres or SQLite (the single-writer path)."""
    from server.db import make_engine, make_sessionmaker
    from server.migrate import upgrade

    engine = make_engine(db_url)
    if db_url.startswith("sqlite"):
        upgrade(engine)
    session = make_sessionmaker(engine)()
    yield session
    session.rollback()
    session.close()
    engine.dispose()
