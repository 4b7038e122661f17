"""Waiting without polling (docs/architecture/protocol.md, "Waiting without polling"), over real
HTTP: a waiting acquire tries again when work appears, not at a poll. Every server here polls
only every `long_poll_interval_s` = 30 s (the fallback), longer than the 20 s wait, and a wait
that ran out answers its last try's 204 without another: a 200 after the first try shows the
acquire was woken (or, in the fallback test, polled at its shorter interval)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from server.db_async import libpq_url
from server.models import Run, Worker
from server.wakeups import LEASES
from tests.harness.serve import serve_in_process, serve_in_thread
from tests.server.leases.helpers import acquire_lease, bearer, make_run, make_worker
from tests.server.leases.lease_paths import POSTGRES, LeasePath

pytestmark = pytest.mark.timeout(120)

ACQUIRE = "/api/v1/leases/acquire"
WAIT_S = 20.0
NO_POLL = {"lease_long_poll_s": 30.0, "long_poll_interval_s": 30.0}
ONLY_POSTGRES = pytest.mark.parametrize(
    "lease_path", [pytest.param(POSTGRES, marks=pytest.mark.postgres)], indirect=True
)


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _waiting(factory: sessionmaker[Session], worker_id: uuid.UUID) -> Callable[[], bool]:
    """Whether the worker's acquire has tried and found nothing (its waiting_since is set)."""

    def check() -> bool:
        with factory() as session:
            since = session.execute(
                select(Worker.waiting_since).where(Worker.id == worker_id)
            ).scalar_one()
            return since is not None

    return check


@contextmanager
def _served(lease_path: LeasePath, tmp_path: Path, **settings: Any) -> Iterator[tuple[Any, str]]:
    from server.app import create_app

    app = create_app(lease_path.settings(tmp_path / "bucket", **settings), migrate=True)
    with serve_in_thread(app) as base:
        yield app, base


@contextmanager
def _served_apart(lease_path: LeasePath, tmp_path: Path) -> Iterator[tuple[Any, str, int]]:
    """The test's app (its database migrated) and `asyncgrpo server` on it in a process of its
    own, polling only every 30 s: the app, the server's base URL and pid."""
    from server.app import create_app

    app = create_app(lease_path.settings(tmp_path / "bucket"), migrate=True)
    env = {"ASYNCGRPO_LEASE_LONG_POLL_S": "30", "ASYNCGRPO_LONG_POLL_INTERVAL_S": "30"}
    with serve_in_process(
        lease_path.database_url, tmp_path / "bucket", tmp_path / "server.log", settings_env=env
    ) as (base, pid):
        yield app, base, pid


def _wait_in_background(
    pool: ThreadPoolExecutor, base: str, token: str, wait_s: float = WAIT_S
) -> Future[Any]:
    def poll() -> httpx.Response:
        with httpx.Client(base_url=base, timeout=60) as client:
            return client.post(ACQUIRE, json={"wait_s": wait_s}, headers=bearer(token))

    return pool.submit(poll)


def _paused_run_and_waiting_worker(
    factory: sessionmaker[Session],
) -> tuple[uuid.UUID, uuid.UUID, str]:
    with factory() as db:
        run = make_run(db, status="paused", n_rows=2)
        worker, token = make_worker(db)
        db.commit()
        return run.id, worker.id, token


def test_a_release_wakes_a_waiting_acquire(lease_path: LeasePath, tmp_path: Path) -> None:
    """One row, held by worker A; B waits; A's release queues the row and B is granted it."""
    with _served(lease_path, tmp_path, **NO_POLL) as (app, base):
        factory = app.state.sessionmaker
        with factory() as db:
            make_run(db, n_rows=1, prompts_per_lease=1, prompts_per_step=1)
            _a, a_token = make_worker(db, name="a")
            b, b_token = make_worker(db, name="b")
            db.commit()
        with httpx.Client(base_url=base, timeout=60) as client, ThreadPoolExecutor(1) as pool:
            held = acquire_lease(client, a_token)
            waiting = _wait_in_background(pool, base, b_token)
            _until(_waiting(factory, b.id), "B's acquire did not try")
            released = client.post(
                f"/api/v1/leases/{held['lease_id']}/release",
                json={"fencing": held["fencing"], "reason": "shutdown"},
                headers=bearer(a_token),
            )
            assert released.status_code == 200, released.text
            granted = waiting.result(timeout=60)
    assert granted.status_code == 200, granted.text
    assert [p["prompt_row_id"] for p in granted.json()["prompts"]] == [
        p["prompt_row_id"] for p in held["prompts"]
    ]


@ONLY_POSTGRES
def test_a_notify_from_another_connection_wakes_a_waiting_acquire(
    lease_path: LeasePath, tmp_path: Path
) -> None:
    """Another process's transaction (a plain connection here) resumes the run and signals the
    channel; Postgres delivers the NOTIFY at its commit to this server's listener."""
    with _served(lease_path, tmp_path, **NO_POLL) as (app, base):
        factory = app.state.sessionmaker
        run_id, worker_id, token = _paused_run_and_waiting_worker(factory)
        _until(app.state.wakeup_listener.listening.is_set, "the server does not listen")
        with ThreadPoolExecutor(1) as pool:
            waiting = _wait_in_background(pool, base, token)
            _until(_waiting(factory, worker_id), "the acquire did not try")
            with psycopg.connect(libpq_url(lease_path.database_url)) as conn:  # one transaction
                conn.execute("UPDATE runs SET status = 'running' WHERE id = %s", (run_id,))
                conn.execute("SELECT pg_notify(%s, 'another process')", (LEASES,))
            granted = waiting.result(timeout=60)
    assert granted.status_code == 200, granted.text


def test_the_fallback_poll_finds_work_whose_signal_was_lost(
    lease_path: LeasePath, tmp_path: Path
) -> None:
    """Work that appears with no signal at all (written behind the server's back) is found at
    the fallback poll, 1 s here, within the 20 s wait."""
    fallback = {**NO_POLL, "long_poll_interval_s": 1.0}
    with _served(lease_path, tmp_path, **fallback) as (app, base):
        factory = app.state.sessionmaker
        run_id, worker_id, token = _paused_run_and_waiting_worker(factory)
        with ThreadPoolExecutor(1) as pool:
            waiting = _wait_in_background(pool, base, token)
            _until(_waiting(factory, worker_id), "the acquire did not try")
            with app.state.engine.begin() as conn:
                conn.execute(update(Run).where(Run.id == run_id).values(status="running"))
            granted = waiting.result(timeout=60)
    assert granted.status_code == 200, granted.text


def test_without_a_signal_nor_a_poll_the_wait_runs_out(
    lease_path: LeasePath, tmp_path: Path
) -> None:
    """The converse of the two above, so that they can fail: work written behind the server's
    back, with the fallback poll longer than the wait (3 s here), is not found: 204. The
    server runs in a process of its own (uvloop, as deployed: its timers run on the loop's
    cached clock, and a pause that ended a little early once made a second try here), and only
    its own commits can signal it."""
    with _served_apart(lease_path, tmp_path) as (app, base, _pid), ThreadPoolExecutor(1) as pool:
        factory = app.state.sessionmaker
        run_id, worker_id, token = _paused_run_and_waiting_worker(factory)
        waiting = _wait_in_background(pool, base, token, wait_s=3.0)
        _until(_waiting(factory, worker_id), "the acquire did not try")
        with app.state.engine.begin() as conn:
            conn.execute(update(Run).where(Run.id == run_id).values(status="running"))
        answered = waiting.result(timeout=60)
    assert answered.status_code == 204, answered.text


@ONLY_POSTGRES
def test_shutdown_ends_a_waiting_acquire(lease_path: LeasePath, tmp_path: Path) -> None:
    """SIGTERM to `asyncgrpo server`: the waiting acquire answers 204 at once (not at the end
    of its 20 s wait) and the process exits."""
    with _served_apart(lease_path, tmp_path) as (app, base, pid), ThreadPoolExecutor(1) as pool:
        factory = app.state.sessionmaker
        with factory() as db:
            worker, token = make_worker(db)
            db.commit()
        waiting = _wait_in_background(pool, base, token)
        _until(_waiting(factory, worker.id), "the acquire did not try")
        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        answered = waiting.result(timeout=60)
        ended_after = time.monotonic() - started
        _until(lambda: not _alive(pid), "the server did not exit", timeout_s=30)
    app.state.engine.dispose()
    assert answered.status_code == 204, answered.text
    assert ended_after < WAIT_S  # it did not wait out its wait


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by its ManagedProcess) has exited
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False
