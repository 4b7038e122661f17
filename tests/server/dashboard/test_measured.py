"""What a run measured, for the planner (server/dashboard/measured.py), on Postgres and SQLite.

make_measured_run: the L4 worker's batches in the window carry 2000 + 2000 tokens, its earliest
lease among them started 100 s ago and its last upload was 20 s ago: 4000 / 80 = 50 tokens/s.
The A10G worker: 600 tokens from a lease 40 s ago uploaded 20 s ago: 600 / 20 = 30 tokens/s.
Samples: 3 batches × 4 = 12, 4 of them rejected: accepted 8 / 12; completion tokens 4600 / 12.
Learner: mean of 100 and 200 (a point without tokens_per_s is skipped) = 150."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.dashboard.measured import measure
from server.db import transaction
from tests.conftest import make_settings
from tests.server.dashboard.measured_run import make_measured_run


@pytest.fixture
def any_app(db_url: str, tmp_path: Path) -> Iterator[Any]:
    from server.app import create_app

    application = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    yield application
    application.state.engine.dispose()


def test_measure_a_run(any_app: Any) -> None:
    run = make_measured_run(any_app)
    with transaction(any_app.state.sessionmaker) as session:
        m = measure(session, run.id)
    assert m.worker_tokens_per_s == pytest.approx({"A10G": 30.0, "L4": 50.0}, rel=1e-3)
    assert m.accept_fraction == pytest.approx(8 / 12)
    assert m.completion_tokens == pytest.approx(4600 / 12)
    assert m.learner_tokens_per_s == pytest.approx(150.0)
    assert (m.group_size, m.bound_groups) == (2, 10)


def test_unknown_run(any_app: Any) -> None:
    with transaction(any_app.state.sessionmaker) as session, pytest.raises(LookupError):
        measure(session, uuid.uuid4())
