"""Two `asyncgrpo server` processes and the sweep job on one Postgres database, under
concurrent acquires and constant expiries, never deadlock (issue 27; docs/architecture/contract.md,
invariant 4; the engine before it swept expired leases and then granted in fairness order in
one transaction, and kept a refused grant's run row locked while it tried the next run).

Six runs whose fairness order is not their id order (priorities 1, 3, 2, 3, 1, 2 in id order;
the four upper ones with an admission bound of four leases, so that acquires fall through the
tiers; within a tier the run leased least recently first) with a lease TTL of half a second;
simulated workers (threads, one registered worker each) acquire from the two servers in turn
and mostly let their leases expire, some heartbeat once, some (on the unbounded runs) upload
and complete; the sweep job runs in a loop in a thread of this process. With expired leases
always about, nearly every acquire sweeps (in a transaction of its own) before it grants.

Afterwards `pg_stat_database.deadlocks` of the database has not moved (read once every
backend that worked on it has exited, which flushes its counters), no call answered 5xx (a
deadlock aborts a request's transaction: 503), the sweep job never failed, and the rows are
whole: a prompt row's leases never overlap in database time (one holder, invariant 1), and each
run's groups_in_flight equals its rows leased, accepted or claimed (invariant 15).
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.pool import NullPool

from server.jobs.runner import JobContext, run_job
from server.models import Lease, PromptRow, Run
from tests.conftest import make_settings
from tests.harness.serve import serve_in_process
from tests.server.leases.helpers import bearer, in_flight, make_run, make_worker

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(240)]

LEASES = "/api/v1/leases"
TTL_S = 0.5  # lease_ttl_s: any positive number is allowed; short enough to expire constantly
# (priority, admission_control) of each run, in id order: the fairness order (priority, then
# the run leased least recently) differs from it, and the bounded tiers fill, so acquires fall
# through to the next tier.
RUNS = [(1, False), (3, True), (2, True), (3, True), (1, False), (2, True)]
WORKERS = 16  # simulated workers, one thread and one registered worker each
LOAD_S = 20.0  # the load's bound in time
MAX_ACQUIRES = 2_000  # ... and in acquires, per worker
SERVER_ENV = {  # two processes well under max_connections (100), with room for other tests
    "ASYNCGRPO_DATABASE_POOL_SIZE": "8",
    "ASYNCGRPO_DATABASE_MAX_OVERFLOW": "2",
    "ASYNCGRPO_DATABASE_ASYNC_POOL_SIZE": "4",
    "ASYNCGRPO_SERVER_THREADS": "8",
}
EXPECTED = {  # call -> the answers a worker may get here (a lease may expire at any moment)
    "acquire": {200, 204},
    "heartbeat": {200, 409},
    "upload": {200, 409},
    "complete": {200, 409},
}


@dataclass
class Load:
    """What the simulated workers saw, shared by their threads (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)  # 5xx or any other surprise, with body
    grants: dict[uuid.UUID, list[int]] = field(default_factory=dict)  # lease -> prompt rows
    sweep_errors: list[str] = field(default_factory=list)
    swept: int = 0

    def answered(self, call: str, response: httpx.Response) -> None:
        with self.lock:
            self.answers[(call, response.status_code)] += 1
            if response.status_code not in EXPECTED[call]:
                self.unexpected.append(f"{call} {response.status_code}: {response.text[:300]}")


OTHER_BACKENDS = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def _deadlocks(admin: Engine) -> int:
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(
            conn.execute(
                text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


def _settled_deadlocks(admin: Engine, timeout_s: float = 30.0) -> int:
    """The database's deadlock counter once every other backend on it has exited (a backend
    flushes its counters when it exits; the detecting backend counts the deadlock) and the
    counter reads the same three times running."""
    deadline = time.monotonic() + timeout_s
    while True:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            left = int(conn.execute(text(OTHER_BACKENDS)).scalar_one())
        if left == 0:
            break
        assert time.monotonic() < deadline, f"{left} backends still on the database"
        time.sleep(0.1)
    reads = [_deadlocks(admin)]
    while len(reads) < 3 or len(set(reads[-3:])) > 1:
        assert time.monotonic() < deadline, f"the deadlock counter did not settle: {reads}"
        time.sleep(0.1)
        reads.append(_deadlocks(admin))
    return reads[-1]


def _work(
    index: int,
    token: str,
    bases: list[str],
    completable: set[uuid.UUID],
    store: Any,
    load: Load,
    stop: threading.Event,
) -> None:
    """One simulated worker: acquire (no wait) from the servers in turn; of the leases, most are
    left to expire, some heartbeat once (on the other server), some on the unbounded runs are
    uploaded and completed."""
    rng = random.Random(index)
    headers = bearer(token)
    with httpx.Client(timeout=60) as client:
        for n in range(MAX_ACQUIRES):
            if stop.is_set():
                return
            base, other = bases[(index + n) % 2], bases[(index + n + 1) % 2]
            got = client.post(f"{base}{LEASES}/acquire", json={"wait_s": 0}, headers=headers)
            load.answered("acquire", got)
            if got.status_code != 200:
                stop.wait(0.02)  # nothing admissible now: try again shortly
                continue
            lease = got.json()
            lease_id = uuid.UUID(lease["lease_id"])
            with load.lock:
                load.grants[lease_id] = [p["prompt_row_id"] for p in lease["prompts"]]
            path = f"{other}{LEASES}/{lease_id}"
            fencing = {"fencing": lease["fencing"]}
            draw = rng.random()
            if draw < 0.2 and uuid.UUID(lease["run_id"]) in completable:
                _complete(client, path, lease, headers, store, load)
            elif draw < 0.4:
                beat = client.post(f"{path}/heartbeat", json=fencing, headers=headers)
                load.answered("heartbeat", beat)
            # else: no heartbeat, the lease expires


def _complete(
    client: httpx.Client,
    path: str,
    lease: dict[str, Any],
    headers: dict[str, str],
    store: Any,
    load: Load,
) -> None:
    data = json.dumps({"lease": lease["lease_id"]}).encode()
    sha = hashlib.sha256(data).hexdigest()
    fencing = lease["fencing"]
    up = client.post(
        f"{path}/upload",
        json={"fencing": fencing, "size": len(data), "sha256": sha},
        headers=headers,
    )
    load.answered("upload", up)
    if up.status_code != 200:
        return
    store.put_bytes(up.json()["key"], data)  # as the bucket would take it off the server
    manifest = {
        "key": lease["batch_key"],
        "sha256": sha,
        "size": len(data),
        "n_samples": len(lease["prompts"]) * lease["group_size"],
        "n_tokens": 10,
        "generation_seconds": 0.1,
    }
    done = client.post(
        f"{path}/complete", json={"fencing": fencing, "manifest": manifest}, headers=headers
    )
    load.answered("complete", done)


def _sweep_loop(ctx: JobContext, load: Load, stop: threading.Event) -> None:
    """The sweep job as the scheduler runs it, back to back (a deadlock it is part of fails it)."""
    while not stop.is_set():
        try:
            swept = run_job("sweep", ctx)
        except Exception as failed:  # recorded, asserted on afterwards
            with load.lock:
                load.sweep_errors.append(repr(failed)[:500])
        else:
            with load.lock:
                load.swept += swept
        stop.wait(0.02)


def _load(
    bases: list[str],
    tokens: list[str],
    completable: set[uuid.UUID],
    ctx: JobContext,
    store: Any,
    load: Load,
) -> float:
    """The simulated workers and the sweep job loop, for LOAD_S at most; how long it ran."""
    stop = threading.Event()
    threads = [threading.Thread(target=_sweep_loop, args=(ctx, load, stop), daemon=True)]
    threads += [
        threading.Thread(
            target=_work, args=(i, token, bases, completable, store, load, stop), daemon=True
        )
        for i, token in enumerate(tokens)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        stop.wait(LOAD_S)  # the load's bound (each worker also stops after MAX_ACQUIRES)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a load thread did not stop"
    return time.monotonic() - started


def _sweep_until_none_active(ctx: JobContext, timeout_s: float = 30.0) -> None:
    """The sweep job until no lease is active (every one left expires within TTL_S)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run_job("sweep", ctx)
        with ctx.factory() as db:
            active = db.execute(
                select(func.count()).select_from(Lease).where(Lease.state == "active")
            ).scalar_one()
        if active == 0:
            return
        assert time.monotonic() < deadline, f"{active} leases still active"
        time.sleep(0.1)


@pytest.fixture
def admin(pg_url: str) -> Iterator[Engine]:
    """Autocommitted connections to the test's database, one at a time (none kept open)."""
    engine = create_engine(pg_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def test_two_servers_and_the_sweep_job_never_deadlock(
    pg_url: str, admin: Engine, tmp_path: Path
) -> None:
    from server.app import create_app

    bucket = tmp_path / "bucket"
    app = create_app(make_settings(pg_url, bucket), migrate=True)  # records the bucket
    factory = app.state.sessionmaker
    run_ids = [uuid.UUID(int=i + 1) for i in range(len(RUNS))]  # id order = list order
    with factory() as db:
        for run_id, (priority, admission) in zip(run_ids, RUNS, strict=True):
            make_run(
                db, run_id=run_id, n_rows=100, epochs=10, priority=priority,
                admission_control=admission, max_attempts=1_000_000,
                lease_ttl_s=TTL_S, heartbeat_interval_s=TTL_S / 2,
            )  # fmt: skip
        tokens = [make_worker(db, name=f"w{i}")[1] for i in range(WORKERS)]
        db.commit()
    completable = {r for r, (_, admission) in zip(run_ids, RUNS, strict=True) if not admission}
    ctx = JobContext(app.state.settings, factory, lambda: app.state.store)
    before = _deadlocks(admin)
    load = Load()
    logs = [tmp_path / "server-a.log", tmp_path / "server-b.log"]
    with ExitStack() as servers:
        bases = [
            servers.enter_context(serve_in_process(pg_url, bucket, log, settings_env=SERVER_ENV))[0]
            for log in logs
        ]
        loaded_s = _load(bases, tokens, completable, ctx, app.state.store, load)
        _sweep_until_none_active(ctx)
    app.state.engine.dispose()
    after = _settled_deadlocks(admin)

    with factory() as db:
        ended = Counter(
            (state, reason)
            for state, reason in db.execute(select(Lease.state, Lease.end_reason)).all()
        )
        leases = {
            lease_id: (created, ended_at)
            for lease_id, created, ended_at in db.execute(
                select(Lease.id, Lease.created_at, Lease.ended_at)
            ).all()
        }
        counters = {
            run.id: (run.groups_in_flight, in_flight(db, run.id))
            for run in db.execute(select(Run)).scalars()
        }
        still_leased = db.execute(
            select(func.count()).select_from(PromptRow).where(PromptRow.state == "leased")
        ).scalar_one()
        granted_by_run = Counter(db.execute(select(Lease.run_id)).scalars())
    app.state.engine.dispose()
    summary = (
        f"load {loaded_s:.1f} s; answers {dict(load.answers)}; leases {dict(ended)}; "
        f"by run {[granted_by_run[r] for r in run_ids]}; swept by the job {load.swept}, "
        f"{len(load.sweep_errors)} sweep job failures; "
        f"deadlocks {before} -> {after}"
    )
    print(summary)

    # The rows are whole. Every lease the servers granted was answered (none lost to an aborted
    # transaction that committed), and none is active now.
    assert set(leases) == set(load.grants), summary
    assert still_leased == 0
    # One holder: a prompt row's leases, in grant order, never overlap in database time.
    holders: dict[int, list[tuple[Any, Any]]] = defaultdict(list)
    for lease_id, rows in load.grants.items():
        for row in rows:
            holders[row].append(leases[lease_id])
    for row, spans in holders.items():
        spans.sort()
        for (_, ended_at), (created, _) in zip(spans, spans[1:], strict=False):
            assert ended_at is not None and created >= ended_at, (row, spans)
    # Invariant 15: each run's admission counter equals its rows in flight.
    assert all(counted == rows for counted, rows in counters.values()), counters
    # The criterion: no deadlock (nor the 503 or job failure one causes).
    assert after == before, summary
    assert not load.unexpected, (load.unexpected[:10], summary)
    assert not load.sweep_errors, (load.sweep_errors[:5], summary)
    # And the load did what it is for: many grants on every run, most of them expired.
    assert all(granted_by_run[r] >= 20 for r in run_ids), summary
    assert ended[("expired", "expired")] >= 200, summary
    assert ended[("completed", "completed")] >= 20, summary
    assert load.swept > 0, summary
