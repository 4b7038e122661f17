"""A waiting batch claim, and a waiting eval claim, is woken by the batch a worker's complete
accepts (docs/architecture/protocol.md, "Waiting without polling"), on both databases: on
Postgres through the accept's one statement (its own pg_notify), on SQLite through complete's
steps. The server polls only every 30 s, past the claim's 20 s wait, and a wait that runs out
answers its last try: batches in the answer show the claim was woken."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import make_settings
from tests.server.learner.support import attach, make_run, make_worker
from tests.server.leases.helpers import bearer, work_one_lease

pytestmark = pytest.mark.timeout(120)


def test_an_accepted_batch_wakes_a_waiting_claim(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.app import create_app
    from server.learner import service

    tried = threading.Event()
    real_claim = service.claim

    def claim_once(*args: Any, **kwargs: Any) -> Any:
        """The learner's claim; the event set once its first try found nothing."""
        answer = real_claim(*args, **kwargs)
        tried.set()
        return answer

    monkeypatch.setattr(service, "claim", claim_once)

    settings = make_settings(
        db_url, tmp_path / "bucket", lease_long_poll_s=30.0, long_poll_interval_s=30.0
    )
    app = create_app(settings, migrate=True)
    try:
        with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
            run = make_run(app)
            fencing = attach(client, run)["fencing"]
            _worker_id, token = make_worker(app)
            waiting = pool.submit(
                client.post,
                run.url("batches/claim"),
                json={"fencing": fencing, "max_groups": 100, "wait_s": 20},
                headers=run.headers,
            )
            assert tried.wait(30), "the claim did not try"
            batch_id = work_one_lease(client, bearer(token))
            answered = waiting.result(timeout=60)
    finally:
        app.state.engine.dispose()
    assert answered.status_code == 200, answered.text
    assert [b["batch_id"] for b in answered.json()["batches"]] == [str(batch_id)]


def test_an_accepted_eval_batch_wakes_a_waiting_eval_claim(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the eval claim: the eval batch a worker's complete accepts wakes it."""
    from server.app import create_app
    from server.learner import eval_router
    from tests.server.evals.support import drain, make_eval_run, worker_headers

    tried = threading.Event()
    real_claim = eval_router._claim_once

    def claim_once(*args: Any, **kwargs: Any) -> Any:
        answer = real_claim(*args, **kwargs)
        tried.set()
        return answer

    monkeypatch.setattr(eval_router, "_claim_once", claim_once)
    settings = make_settings(
        db_url, tmp_path / "bucket", lease_long_poll_s=30.0, long_poll_interval_s=30.0
    )
    app = create_app(settings, migrate=True)
    try:
        with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
            run = make_eval_run(app)  # an eval of version 0 is due
            fencing = attach(client, run)["fencing"]
            _worker_id, token = make_worker(app)
            waiting = pool.submit(
                client.post,
                run.url("evals/claim"),
                json={"fencing": fencing, "max_batches": 64, "wait_s": 20},
                headers=run.headers,
            )
            assert tried.wait(30), "the eval claim did not try"
            leases = drain(client, worker_headers(token))
            answered = waiting.result(timeout=60)
    finally:
        app.state.engine.dispose()
    assert answered.status_code == 200, answered.text
    evals = [lease["lease_id"] for lease in leases if lease["kind"] == "eval"]
    assert evals and answered.json()["batches"], answered.text
