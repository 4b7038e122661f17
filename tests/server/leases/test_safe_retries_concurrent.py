"""Concurrent calls under Idempotency-Keys through real HTTP (uvicorn), on both databases
(docs/architecture/protocol.md, "Safe retries"): repeats of one key sent at once are applied
once, the others wait and get its answer; more keyed calls than request threads, many on the
same run, neither deadlock nor grant a row twice."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from protocol.idempotency import IDEMPOTENCY_HEADER, new_key
from server.models import Lease, PromptRow
from tests.harness.serve import serve_in_thread
from tests.server.leases.helpers import make_run, make_worker
from tests.server.leases.lease_paths import LeasePath

pytestmark = [pytest.mark.timeout(180)]

THREADS = 24  # three times the server's request threads (server_threads: 8)


@pytest.fixture
def live(lease_path: LeasePath, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    from server.app import create_app

    app = create_app(lease_path.settings(tmp_path / "bucket"), migrate=True)
    with serve_in_thread(app) as base:
        yield base, app


def _acquires(base: str, calls: list[tuple[str, str]]) -> list[httpx.Response]:
    """One acquire per (token, key), all at once."""
    with httpx.Client(
        base_url=base, timeout=120, limits=httpx.Limits(max_connections=THREADS)
    ) as c:

        def one(call: tuple[str, str]) -> httpx.Response:
            token, key = call
            headers = {"Authorization": f"Bearer {token}", IDEMPOTENCY_HEADER: key}
            return c.post("/api/v1/leases/acquire", json={}, headers=headers)

        with ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(one, calls))


def test_repeats_of_one_key_at_once_are_applied_once(live: tuple[str, Any]) -> None:
    base, app = live
    with app.state.sessionmaker() as db:
        run = make_run(db, n_rows=20)
        _, token = make_worker(db)
        run_id = run.id
        db.commit()
    key = new_key()
    answers = _acquires(base, [(token, key)] * THREADS)
    assert {r.status_code for r in answers} == {200}
    assert len({r.content for r in answers}) == 1  # the first answer, to every repeat
    with app.state.sessionmaker() as db:
        leases = db.execute(select(func.count()).where(Lease.run_id == run_id)).scalar_one()
    assert leases == 1


def test_more_keyed_calls_than_threads_on_one_run_finish_and_share_no_row(
    live: tuple[str, Any],
) -> None:
    base, app = live
    with app.state.sessionmaker() as db:
        run = make_run(db, n_rows=60, prompts_per_lease=1, prompts_per_step=60, max_staleness=10)
        tokens = [make_worker(db, name=f"w{i}")[1] for i in range(12)]
        run_id = run.id
        db.commit()
    calls = [(tokens[i % len(tokens)], new_key()) for i in range(3 * THREADS)]
    answers = _acquires(base, calls)
    assert {r.status_code for r in answers} <= {200, 204}, {r.text for r in answers}
    granted = [r.json() for r in answers if r.status_code == 200]
    rows = [p["prompt_row_id"] for lease in granted for p in lease["prompts"]]
    assert len(rows) == len(set(rows)) > 0
    with app.state.sessionmaker() as db:
        leased = db.execute(
            select(func.count()).where(PromptRow.run_id == run_id, PromptRow.state == "leased")
        ).scalar_one()
        leases = db.execute(select(func.count()).where(Lease.run_id == run_id)).scalar_one()
    assert leased == len(rows) and leases == len(granted)
