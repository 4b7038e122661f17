"""Concurrent acquires through real HTTP (uvicorn): one holder per row, exact admission."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from server.models import Lease, PromptRow, Run
from tests.harness.serve import serve_in_thread
from tests.server.leases.helpers import in_flight, make_run, make_worker
from tests.server.leases.lease_paths import SQLITE, Answered, LeasePath

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def live(lease_path: LeasePath, tmp_path: Path) -> Iterator[tuple[str, Any, int]]:
    """The app on the test's lease path served by uvicorn on 127.0.0.1 in a thread; yields
    (base_url, app, threads): 50 client threads on Postgres, 8 on SQLite (one writer at a time,
    by design)."""
    from server.app import create_app

    app = create_app(lease_path.settings(tmp_path / "bucket"), migrate=True)
    with serve_in_thread(app) as base:
        yield base, app, 8 if lease_path.name == SQLITE else 50


def _acquire_all(base: str, tokens: list[str], calls: int, threads: int) -> list[httpx.Response]:
    with httpx.Client(base_url=base, timeout=60, limits=httpx.Limits(max_connections=threads)) as c:

        def one(i: int) -> httpx.Response:
            headers = {"Authorization": f"Bearer {tokens[i % len(tokens)]}"}
            return c.post("/api/v1/leases/acquire", json={}, headers=headers)

        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, range(calls)))


def test_500_concurrent_acquires_never_share_a_row(
    live: tuple[str, Any, int], lease_path: LeasePath
) -> None:
    base, app, threads = live
    with app.state.sessionmaker() as db:
        run = make_run(
            db, n_rows=50, prompts_per_lease=1, prompts_per_step=50, max_staleness=10,
            max_attempts=1000, lease_ttl_s=0.3, heartbeat_interval_s=0.1,
        )  # fmt: skip
        tokens = [make_worker(db, name=f"w{i}")[1] for i in range(10)]
        run_id = run.id
        db.commit()
    responses = _acquire_all(base, tokens, 500, threads)
    assert all(r.status_code in (200, 204) for r in responses), {r.status_code for r in responses}
    grants = [r.json() for r in responses if r.status_code == 200]
    assert len(grants) >= 50  # expired rows are re-issued
    with app.state.sessionmaker() as db:
        leases = {
            lease.id: lease
            for lease in db.execute(select(Lease).where(Lease.run_id == run_id)).scalars()
        }
        assert len(leases) == len(grants)
        holders: dict[int, list[Lease]] = defaultdict(list)
        for grant in grants:
            for prompt in grant["prompts"]:
                holders[prompt["prompt_row_id"]].append(leases[uuid.UUID(grant["lease_id"])])
        run_rows = set(db.execute(select(PromptRow.id).where(PromptRow.run_id == run_id)).scalars())
        assert set(holders) <= run_rows  # (expired rows go back to the front, so a slow
        # server may re-issue the same front rows again and again: that is correct)
        # A row's leases, in grant order, never overlap in database time: each one was
        # granted only after the previous one had expired.
        for row_leases in holders.values():
            row_leases.sort(key=lambda lease: lease.fencing)
            for before, after in zip(row_leases, row_leases[1:], strict=False):
                assert after.created_at >= before.expires_at
        fencings = [g["fencing"] for g in grants]
        assert len(set(fencings)) == len(fencings)
        assert db.get(Run, run_id).groups_in_flight == in_flight(db, run_id)  # type: ignore[union-attr]
    Answered(app.state.worker_calls, lease_path).expect({"acquire": 500})  # one try each


def test_100_concurrent_acquires_race_for_the_last_slots(
    live: tuple[str, Any, int], lease_path: LeasePath
) -> None:
    base, app, threads = live
    with app.state.sessionmaker() as db:
        run = make_run(db, n_rows=40)  # bound 8 groups, 2 per lease
        tokens = [make_worker(db, name=f"w{i}")[1] for i in range(10)]
        run_id = run.id
        db.commit()
    warmup = _acquire_all(base, tokens[:1], 2, 1)
    assert [r.status_code for r in warmup] == [200, 200]  # 4 of 8 groups taken
    responses = _acquire_all(base, tokens, 100, threads)
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 2 + [204] * 98
    with app.state.sessionmaker() as db:
        assert db.get(Run, run_id).groups_in_flight == 8  # type: ignore[union-attr]
        assert in_flight(db, run_id) == 8
        leased = db.execute(
            select(PromptRow.lease_id).where(
                PromptRow.run_id == run_id, PromptRow.state == "leased"
            )
        ).scalars()
        assert len(set(leased)) == 4
    Answered(app.state.worker_calls, lease_path).expect({"acquire": 102})
