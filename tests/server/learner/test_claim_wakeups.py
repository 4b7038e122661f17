"""A waiting batch claim, and a waiting eval claim, is woken by the batch a worker's complete
accepts (docs/architecture/protocol.md, "Waiting without polling"), on both databases: on
Postgres through the accept's one statement (its own pg_notify), on SQLite through complete's
steps. The server polls only every 30 s, past the claim's 20 s wait, and a wait that runs out
answers its last try: batches in the answer show the claim was woken."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import make_settings
from tests.server.learner.support import RunHandle, attach, make_run, make_worker
from tests.server.leases.helpers import bearer, work_one_lease

pytestmark = pytest.mark.timeout(120)


def _tried(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> threading.Event:
    """An event set once the claim function `module.name` has tried (and found nothing)."""
    tried = threading.Event()
    real = getattr(module, name)

    def once(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)
        tried.set()
        return answer

    monkeypatch.setattr(module, name, once)
    return tried


def _woken(
    db_url: str,
    tmp_path: Path,
    tried: threading.Event,
    make: Callable[[Any], RunHandle],
    claim: tuple[str, dict[str, Any]],
    work: Callable[[TestClient, str], Any],
) -> tuple[Any, Any]:
    """A run from `make`, its learner's claim (path, body) waiting 20 s, then `work` by a
    worker (its token) once the claim has tried: the claim's answer and what `work` returned.
    The server polls only every 30 s."""
    from server.app import create_app

    settings = make_settings(
        db_url, tmp_path / "bucket", lease_long_poll_s=30.0, long_poll_interval_s=30.0
    )
    app = create_app(settings, migrate=True)
    path, body = claim
    try:
        with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
            run = make(app)
            fencing = attach(client, run)["fencing"]
            _worker_id, token = make_worker(app)
            waiting = pool.submit(
                client.post,
                run.url(path),
                json={"fencing": fencing, "wait_s": 20, **body},
                headers=run.headers,
            )
            assert tried.wait(30), "the claim did not try"
            done = work(client, token)
            answered = waiting.result(timeout=60)
    finally:
        app.state.engine.dispose()
    assert answered.status_code == 200, answered.text
    return answered.json(), done


def test_an_accepted_batch_wakes_a_waiting_claim(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.learner import service

    tried = _tried(monkeypatch, service, "claim")
    answer, batch_id = _woken(
        db_url,
        tmp_path,
        tried,
        make_run,
        ("batches/claim", {"max_groups": 100}),
        lambda client, token: work_one_lease(client, bearer(token)),
    )
    assert [b["batch_id"] for b in answer["batches"]] == [str(batch_id)]


def test_an_accepted_eval_batch_wakes_a_waiting_eval_claim(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the eval claim: the eval batch a worker's complete accepts wakes it."""
    from server.learner import eval_router
    from tests.server.evals.support import drain, make_eval_run, worker_headers

    tried = _tried(monkeypatch, eval_router, "_claim_once")
    answer, leases = _woken(
        db_url,
        tmp_path,
        tried,
        make_eval_run,  # an eval of version 0 is due
        ("evals/claim", {"max_batches": 64}),
        lambda client, token: drain(client, worker_headers(token)),
    )
    assert any(lease["kind"] == "eval" for lease in leases)
    assert answer["batches"], answer
