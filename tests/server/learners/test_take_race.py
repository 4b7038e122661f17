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


def _concurrent_takes(app, learners: list[uuid.UUID], n: int) -> list[list[uuid.UUID]]:  # type: ignore[no-untyped-def]
    """Each learner's take of up to n runs, all started at once (one thread each)."""
    settings: Settings = app.state.settings
    barrier = threading.Barrier(len(learners), timeout=30)
    got: dict[int, list[uuid.UUID]] = {}
    errors: list[BaseException] = []

    def take(i: int, learner_id: uuid.UUID) -> None:
        try:
            token = Token(kind="pool_learner", scope_id=learner_id)
            barrier.wait()
            with transaction(app.state.sessionmaker) as session:
                answer = service.take(session, settings, token, TakeRequest(max=n))
            got[i] = [r.run_id for r in answer.runs]
        except BaseException as exc:  # reported below: a thread's failure fails the test
            errors.append(exc)

    threads = [threading.Thread(target=take, args=pair) for pair in enumerate(learners)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and len(got) == len(learners)
    return [got[i] for i in range(len(learners))]


def test_two_concurrent_takes_never_share_a_run(runs_app, runs_client) -> None:
    runs = [make_run(runs_app) for _ in range(6)]
    learners = [register(runs_client, runs_app, name=f"p{i}", max_runs=6)[0] for i in range(2)]
    first, second = _concurrent_takes(runs_app, learners, 6)
    got = dict(zip(learners, (first, second), strict=True))
    assert set(first).isdisjoint(second)
    assert set(first) | set(second) == {r.id for r in runs}
    for learner_id, ids in got.items():
        assert all(run_row(runs_app, i).pool_learner_id == learner_id for i in ids)


def test_two_concurrent_takes_of_one_pool_learner_keep_its_max_runs(runs_app, runs_client) -> None:
    for _ in range(4):
        make_run(runs_app)
    learner_id, _ = register(runs_client, runs_app, max_runs=2)
    first, second = _concurrent_takes(runs_app, [learner_id, learner_id], 2)
    assert len(first) + len(second) == 2 and set(first).isdisjoint(second)
