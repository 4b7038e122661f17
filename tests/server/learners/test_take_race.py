"""Two pool learners taking at once never both get a run: each run is one compare-and-set
(Postgres: the second UPDATE waits on the row and re-checks its WHERE; SQLite: one writer)."""

from __future__ import annotations

import threading
import uuid

import pytest

from server.config import Settings
from server.db import transaction
from server.learners import service
from server.learners.schemas import TakeRequest
from server.models import Token
from tests.server.learner.support import make_run, run_row
from tests.server.learners.conftest import register

pytestmark = pytest.mark.timeout(120)


def test_two_concurrent_takes_never_share_a_run(runs_app, runs_client) -> None:
    runs = [make_run(runs_app) for _ in range(6)]
    learners = [register(runs_client, runs_app, name=f"p{i}", max_runs=6)[0] for i in range(2)]
    settings: Settings = runs_app.state.settings
    barrier = threading.Barrier(2, timeout=30)
    got: dict[uuid.UUID, list[uuid.UUID]] = {}
    errors: list[BaseException] = []

    def take(learner_id: uuid.UUID) -> None:
        try:
            token = Token(kind="pool_learner", scope_id=learner_id)
            barrier.wait()
            with transaction(runs_app.state.sessionmaker) as session:
                answer = service.take(session, settings, token, TakeRequest(max=6))
            got[learner_id] = [r.run_id for r in answer.runs]
        except BaseException as exc:  # reported below: a thread's failure fails the test
            errors.append(exc)

    threads = [threading.Thread(target=take, args=(i,)) for i in learners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and len(got) == 2
    first, second = (got[i] for i in learners)
    assert set(first).isdisjoint(second)
    assert set(first) | set(second) == {r.id for r in runs}
    for learner_id, ids in got.items():
        assert all(run_row(runs_app, i).pool_learner_id == learner_id for i in ids)
