"""What the worker calls hold while they wait, over real HTTP (uvicorn): an idle acquire
long-poll holds no request thread between its tries (on both databases), and on Postgres more
concurrent requests than database connections queue instead of deadlocking the thread pool
against the connection pool."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.serve import serve_in_thread
from tests.server.leases.helpers import make_run, make_worker
from tests.server.leases.lease_paths import POSTGRES, Answered, LeasePath

pytestmark = pytest.mark.timeout(120)


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# Each poll waits out its 10 s, on each database (`lease_path`): every try is one
# service.acquire, the wait between tries on the event loop (server/leases/router.py).
def test_idle_long_polls_leave_the_only_thread_free(
    lease_path: LeasePath, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.app import create_app
    from server.leases import service

    settings = lease_path.settings(tmp_path / "bucket", server_threads=1, lease_long_poll_s=10)
    app = create_app(settings, migrate=True)
    with app.state.sessionmaker() as db:
        _, token = make_worker(db)  # no run: every acquire waits out its long-poll
        db.commit()
    tries: list[int] = []
    all_waiting = threading.Event()
    real_acquire = service.acquire

    async def counting_acquire(*args: Any, **kwargs: Any) -> Any:
        """The engine's acquire; the try counted once it returns."""
        tried = await real_acquire(*args, **kwargs)
        tries.append(1)
        if len(tries) >= 3:  # every poll has tried once and is now waiting
            all_waiting.set()
        return tried

    monkeypatch.setattr(service, "acquire", counting_acquire)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as client:
        with ThreadPoolExecutor(3) as pool:
            polls = [
                pool.submit(
                    client.post, "/api/v1/leases/acquire", json={"wait_s": 10}, headers=_h(token)
                )
                for _ in range(3)
            ]
            assert all_waiting.wait(8)
            # With a long-poll sleeping in the one thread, /healthz would queue behind it
            # until that poll ended (10 s).
            assert client.get("/healthz").status_code == 200
            assert not any(p.done() for p in polls)
            assert [p.result().status_code for p in polls] == [204, 204, 204]
    Answered(app.state.worker_calls, lease_path).expect({"acquire": len(tries)})


@pytest.mark.parametrize(
    "lease_path", [pytest.param(POSTGRES, marks=pytest.mark.postgres)], indirect=True
)
def test_more_requests_than_connections_queue_without_deadlock(
    lease_path: LeasePath, tmp_path: Path
) -> None:
    """2 connections, 8 threads, 48 concurrent heartbeats. Each is one thread-pool hop
    (server/leases/units.py) whose units take a connection in turn and give it back before the
    next; a connection held across hops (an auth transaction kept open while the request waited
    for a thread) would leave the requests that hold both connections waiting for a thread
    while every thread waits for a connection (until the 30 s pool timeout: 500s)."""
    from server.app import create_app

    settings = lease_path.settings(
        tmp_path / "bucket",
        server_threads=8,
        database_pool_size=2,
        database_max_overflow=0,
    )
    app = create_app(settings, migrate=True)
    with app.state.sessionmaker() as db:
        make_run(db, n_rows=4)
        _, token = make_worker(db)
        db.commit()
    with serve_in_thread(app) as base:
        limits = httpx.Limits(max_connections=48)
        with httpx.Client(base_url=base, timeout=60, limits=limits) as client:
            lease = client.post("/api/v1/leases/acquire", json={}, headers=_h(token)).json()
            path = f"/api/v1/leases/{lease['lease_id']}/heartbeat"

            def beat(_: int) -> int:
                body = {"fencing": lease["fencing"]}
                return client.post(path, json=body, headers=_h(token), timeout=25).status_code

            with ThreadPoolExecutor(48) as pool:
                codes = list(pool.map(beat, range(48)))
    assert codes == [200] * 48
    Answered(app.state.worker_calls, lease_path).expect({"acquire": 1, "heartbeat": 48})
