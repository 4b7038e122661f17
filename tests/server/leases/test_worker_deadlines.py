"""The worker's local lease deadline against the real app: counted from when the grant or the
heartbeat was SENT, so a slow answer never makes the worker believe it holds the lease longer
than the server does (the server's TTL starts no earlier than the request)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

import worker.heartbeat
import worker.loop
from protocol.client import AsyncGrpoClient
from tests.server.leases.helpers import MODEL, make_run, make_worker
from worker.heartbeat import HeartbeatPump
from worker.held import HeldLeases

SLOW_S = 45.0  # how long each answer takes on the test's clock


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class SlowClient(AsyncGrpoClient):
    """The real client whose answers arrive SLOW_S after the request (on the test's clock)."""

    clock: Clock

    def request(self, *args: Any, **kwargs: Any) -> Any:
        response = super().request(*args, **kwargs)
        self.clock.now += SLOW_S
        return response


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(worker.heartbeat, "time", fake)
    monkeypatch.setattr(worker.loop, "time", fake)
    return fake


def test_deadline_counts_from_the_requests_not_the_slow_answers(
    lease_client: TestClient, db: Session, clock: Clock
) -> None:
    make_run(db, n_rows=4)
    _, token = make_worker(db)
    db.commit()
    client = SlowClient("http://testserver", token, http=lease_client)
    client.clock = clock
    settings = SimpleNamespace(model=MODEL, acquire_wait_s=0.0, http_timeout_s=30.0)
    acquire_sent = clock.now
    lease, _versions, sent_at = worker.loop.WorkerLoop._acquire(
        SimpleNamespace(settings=settings, environments=None, capabilities=None),  # type: ignore[arg-type]
        client,
    )
    assert lease is not None and clock.now == acquire_sent + SLOW_S
    held = HeldLeases().add(lease, sent_at)
    assert held.deadline == acquire_sent + lease.ttl_s

    beat_sent = clock.now
    HeartbeatPump(client, HeldLeases()).beat([held])
    assert held.lost_reason is None and clock.now == beat_sent + SLOW_S
    assert held.deadline == beat_sent + lease.ttl_s
