"""GET /api/v1/versions (docs/architecture/protocol.md, "Version long-poll"): which runs a worker
hears of, how soon, and that one watch per process serves every waiter."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import update

from protocol import layout
from protocol.client import AsyncGrpoClient, ValidationFailed
from protocol.schemas import MAX_VERSIONS_AFTER
from server.db import transaction
from server.models import AdapterVersion, Run
from tests.server.learner.support import RunHandle, attach, make_run, make_worker
from tests.server.learner.support import upload_and_publish as publish

VERSIONS = "/api/v1/versions"


def _running_run(app: FastAPI, http: httpx.Client, **overrides: Any) -> tuple[RunHandle, int]:
    """A run made by the runs feature, attached (running); its learner fencing token."""
    run = make_run(app, **overrides)
    return run, int(attach(http, run)["fencing"])  # type: ignore[arg-type]


def _worker_client(app: FastAPI, base_url: str) -> AsyncGrpoClient:
    _, token = make_worker(app)
    return AsyncGrpoClient(base_url, token)


def _adapter_row(app: FastAPI, run_id: uuid.UUID, version: int) -> AdapterVersion:
    with transaction(app.state.sessionmaker) as session:
        row = session.query(AdapterVersion).filter_by(run_id=run_id, version=version).one()
        session.expunge(row)
        return row


def test_a_publish_wakes_a_waiting_long_poll(
    versions_app: FastAPI, base_url: str, http: httpx.Client
) -> None:
    run, fencing = _running_run(versions_app, http)
    worker = _worker_client(versions_app, base_url)
    published_at: list[float] = []

    def learner() -> None:
        time.sleep(0.5)  # the worker is waiting by now
        assert publish(http, run, fencing, 1).status_code == 200  # type: ignore[arg-type]
        published_at.append(time.monotonic())

    thread = threading.Thread(target=learner)
    thread.start()
    (notice,) = worker.wait_versions({run.id: 0}, wait_s=8)
    answered_at = time.monotonic()
    thread.join()
    assert answered_at - published_at[0] < 0.5
    assert notice.run_id == run.id and notice.version == 1 and notice.adapter is not None
    row = _adapter_row(versions_app, run.id, 1)
    assert notice.adapter.version == 1 and notice.adapter.sha256 == row.sha256
    assert {(f.name, f.sha256, f.size) for f in notice.adapter.files} == {
        (name, meta["sha256"], meta["bytes"]) for name, meta in row.files.items()
    }
    # The download URLs work, as a lease's do.
    weights = next(f for f in notice.adapter.files if f.name == "adapter_model.safetensors")
    assert layout.adapter_key(run.id, 1, "adapter_model.safetensors") in weights.url
    assert http.get(weights.url).content == b"weights of v1" * 8


def test_a_worker_behind_is_answered_at_once(
    versions_app: FastAPI, base_url: str, http: httpx.Client
) -> None:
    run, fencing = _running_run(versions_app, http)
    assert publish(http, run, fencing, 1).status_code == 200  # type: ignore[arg-type]
    worker = _worker_client(versions_app, base_url)
    started = time.monotonic()
    named = worker.wait_versions({run.id: 0}, wait_s=8)
    not_named = worker.wait_versions({}, wait_s=8)
    # either call held for its wait would take 8 s; two prompt answers take well under 4 s
    # even on a loaded machine (1 s was crossed once under the full suite's load)
    assert time.monotonic() - started < 4.0
    assert [(n.run_id, n.version) for n in named] == [(run.id, 1)]
    assert [(n.run_id, n.version) for n in not_named] == [(run.id, 1)]


def test_nothing_newer_is_204_after_wait_s_and_one_watch_serves_every_waiter(
    versions_app: FastAPI, base_url: str, http: httpx.Client
) -> None:
    run, fencing = _running_run(versions_app, http)
    assert publish(http, run, fencing, 1).status_code == 200  # type: ignore[arg-type]
    waiters = [_worker_client(versions_app, base_url) for _ in range(16)]
    reads_before = versions_app.state.version_watch.reads
    started = time.monotonic()
    with ThreadPoolExecutor(len(waiters)) as pool:
        answers = list(pool.map(lambda w: w.wait_versions({run.id: 1}, wait_s=1.0), waiters))
    elapsed = time.monotonic() - started
    assert answers == [[]] * len(waiters)
    assert 1.0 <= elapsed < 3.0
    # 16 waiters for 1 s at version_poll_s = 0.1: about ten reads by the one watch, not 160.
    assert versions_app.state.version_watch.reads - reads_before <= 20


def test_a_run_of_another_base_model_is_not_reported(
    versions_app: FastAPI, base_url: str, http: httpx.Client
) -> None:
    other, fencing = _running_run(versions_app, http, base_model="another-model")
    assert publish(http, other, fencing, 1).status_code == 200  # type: ignore[arg-type]
    worker = _worker_client(versions_app, base_url)  # serves smollm2-135m-instruct only
    assert worker.wait_versions({}, wait_s=0.3) == []


def test_a_version_without_its_adapter_row_is_not_reported(
    versions_app: FastAPI, base_url: str, http: httpx.Client
) -> None:
    run, fencing = _running_run(versions_app, http)
    assert publish(http, run, fencing, 1).status_code == 200  # type: ignore[arg-type]
    with transaction(versions_app.state.sessionmaker) as session:
        session.execute(update(Run).where(Run.id == run.id).values(current_version=2))
    worker = _worker_client(versions_app, base_url)
    assert worker.wait_versions({run.id: 1}, wait_s=0.3) == []
    assert worker.wait_versions({run.id: 0}, wait_s=0.3) == []


def test_bad_after_and_wait_s_are_422_naming_the_field(
    versions_app: FastAPI, base_url: str, http: httpx.Client
) -> None:
    _, token = make_worker(versions_app)
    headers = {"Authorization": f"Bearer {token}"}
    run_id = uuid.uuid4()
    for after in (
        ["nope"],
        [str(run_id)],
        [f"{run_id}:x"],
        [f"{run_id}:-1"],
        [f"{run_id}:{2**31}"],
        ["not-a-uuid:1"],
        [f"{run_id}:1", f"{run_id}:2"],
        [f"{uuid.uuid4()}:0" for _ in range(MAX_VERSIONS_AFTER + 1)],
    ):
        response = http.get(VERSIONS, params={"after": after}, headers=headers)
        assert response.status_code == 422, (after, response.text)
        assert [e["field"] for e in response.json()["errors"]] == ["after"], response.text
    for version in ("+1", " 1", "1_0", "\u0661", "1\n", "0x1", ""):  # int() took the first four
        response = http.get(VERSIONS, params={"after": f"{run_id}:{version}"}, headers=headers)
        assert response.status_code == 422, (version, response.text)
        assert [e["field"] for e in response.json()["errors"]] == ["after"], response.text
        assert response.json()["code"] == "after_invalid", response.text
    for run_part in (f"{{{run_id}}}", run_id.hex, f" {run_id}"):  # uuid.UUID() took the first two
        response = http.get(VERSIONS, params={"after": f"{run_part}:1"}, headers=headers)
        assert response.status_code == 422, (run_part, response.text)
        assert [e["field"] for e in response.json()["errors"]] == ["after"], response.text
    for wait_s in ("-1", "601", "soon"):
        response = http.get(VERSIONS, params={"wait_s": wait_s}, headers=headers)
        assert response.status_code == 422, response.text
        assert [e["field"] for e in response.json()["errors"]] == ["query.wait_s"], response.text
    assert http.get(VERSIONS).status_code == 401
    client = AsyncGrpoClient(base_url, token, max_retries=0)
    try:
        client.request("GET", VERSIONS, params={"after": ["nope"]})
    except ValidationFailed as refused:
        assert refused.status_code == 422
    else:
        raise AssertionError("a malformed `after` was accepted")
