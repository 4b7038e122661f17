"""The worker reacts to a lost lease by its error code alone: with every message of the server
reworded, a fenced call whose fencing no longer holds, or whose lease is not the worker's, is
not retried, and the heartbeat pump drops such leases naming the code (issue 26)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from protocol.client import ApiError, AsyncGrpoClient
from protocol.schemas import Lease
from tests.server.leases.helpers import make_run, make_worker
from tests.server.reworded import PREFIX, reword_every_message
from worker.heartbeat import HeartbeatPump
from worker.held import HeldLeases
from worker.retry import retry


@pytest.fixture(autouse=True)
def reworded(monkeypatch: pytest.MonkeyPatch) -> None:
    reword_every_message(monkeypatch)


def _leases(lease_client: TestClient, db: Session) -> tuple[AsyncGrpoClient, Lease, Lease]:
    """The worker's client, a lease whose fencing no longer holds and one that is not its."""
    make_run(db, n_rows=4)
    _, token = make_worker(db)
    db.commit()
    client = AsyncGrpoClient("http://testserver", token, http=lease_client, max_retries=0)
    lease = client.acquire_lease()
    assert lease is not None
    stale = lease.model_copy(update={"fencing": lease.fencing + 1})
    unknown = lease.model_copy(update={"lease_id": uuid.uuid4()})
    return client, stale, unknown


def test_a_lost_lease_is_never_retried(lease_client: TestClient, db: Session) -> None:
    client, stale, unknown = _leases(lease_client, db)
    for lost, code in ((stale, "fencing_lost"), (unknown, "lease_not_found")):
        calls: list[Lease] = []

        def beat(lease: Lease = lost, calls: list[Lease] = calls) -> object:
            calls.append(lease)
            return client.heartbeat_lease(lease)

        with pytest.raises(ApiError) as refused:
            retry("heartbeat", beat, stop=threading.Event(), cap_s=0.01)
        assert refused.value.code == code and refused.value.lease_lost
        assert str(refused.value.detail).startswith(PREFIX)
        assert len(calls) == 1


def test_the_heartbeat_pump_drops_lost_leases_by_code(
    lease_client: TestClient, db: Session
) -> None:
    client, stale, unknown = _leases(lease_client, db)
    held = HeldLeases()
    now = time.monotonic()
    lost, gone = held.add(stale, now), held.add(unknown, now)
    HeartbeatPump(client, held).beat([lost, gone])
    assert (lost.lost_reason, gone.lost_reason) == ("lost (fencing_lost)", "lost (lease_not_found)")
