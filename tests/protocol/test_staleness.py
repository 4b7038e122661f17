"""The staleness predicate is one expression for Python ints and for SQL: the heartbeat's
statement and the learner's claim must agree with it on every value."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import bindparam, create_engine, literal_column, select

from protocol.staleness import outside_window, staleness

GRID = list(itertools.product(range(0, 5), range(0, 5), range(0, 4)))


def test_staleness_is_versions_published_since() -> None:
    assert staleness(7, 4) == 3
    assert staleness(4, 4) == 0


@pytest.mark.parametrize(
    "current,version,window,outside",
    [(5, 3, 2, False), (5, 2, 2, True), (0, 0, 0, False), (1, 0, 0, True), (4, 4, 1, False)],
)
def test_outside_window_only_above_max_staleness(
    current: int, version: int, window: int, outside: bool
) -> None:
    """A batch exactly max_staleness versions behind is still trained on; one more is not."""
    assert outside_window(current, version, window) is outside


def test_sql_rendering_agrees_with_python(db_url: str) -> None:
    """On both databases, as SQL over columns and a bound parameter."""
    engine = create_engine(db_url)
    expr = outside_window(literal_column("c"), literal_column("v"), bindparam("w"))
    try:
        with engine.connect() as conn:
            for current, version, window in GRID:
                row = conn.execute(
                    select(expr).select_from(
                        select(
                            literal_column(str(current)).label("c"),
                            literal_column(str(version)).label("v"),
                        ).subquery()
                    ),
                    {"w": window},
                ).scalar_one()
                assert bool(row) is outside_window(current, version, window), (
                    current,
                    version,
                    window,
                )
    finally:
        engine.dispose()
