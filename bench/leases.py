"""Lease-engine throughput: N closed-loop simulated workers doing acquire → heartbeat → upload →
complete against a real server (uvicorn) on Postgres with the local store, and the same cycle
as raw SQL through psycopg in the same run.

    .venv/bin/python bench/leases.py --workers 16 64 256 --seconds 10 --repeats 3 \
        [--baseline-tree ../asyncgrpo-before] [--uvicorn-workers 2] [--keyed] [--json]

`--keyed`: acquire and complete carry an Idempotency-Key, as the typed client sends them
(docs/architecture/protocol.md, "Safe retries").

`--baseline-tree` names another checkout of asyncgrpo (e.g. `git worktree add ../before
<commit>`): its server is measured in the same sitting, point by point and repeat by repeat
alternating with this tree's (which goes first alternates too), on the same database and with
the same load, with its own default settings, so the two compare as a ratio (this tree /
baseline). The database is vacuumed before every measurement.

The load generator is aiohttp in one process (an httpx one capped near 100–180 cycles/s by
itself). The raw-SQL side runs the engine's own Postgres statements for the cycle
(bench/common.py raw_grant … raw_accept) through psycopg, without HTTP, on 8 pooled
connections shared by the N simulated workers, each with its own worker and token as on the
API side.

Needs Postgres at ASYNCGRPO_BENCH_PG (default postgresql+psycopg://postgres@127.0.0.1:5432);
creates and drops a scratch database.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import report  # noqa: E402
from protocol.idempotency import IDEMPOTENCY_HEADER, new_key  # noqa: E402

PG = os.environ.get("ASYNCGRPO_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
SECRET = "bench-secret-" + "x" * 32
DATA = b"x" * 2048
SHA = hashlib.sha256(DATA).hexdigest()
# The raw-SQL side's pool (psycopg_pool, first come first served, as the server's). Every grant
# serialises on the run row: 8 connections served the most cycles/s here (16: -40%, 64: -65%).
SQL_CONNECTIONS = 8


def grant_params(run_id: str, worker_id: str, lease_id: uuid.UUID) -> dict[str, object]:
    """The server's one-statement grant (server/leases/queue.py) for one prompt."""
    from server.leases.queue import grant_params as params

    return params(run_id=uuid.UUID(run_id), worker_id=uuid.UUID(worker_id), lease_id=lease_id,
                  n=1, bound=2**31 - 1, ttl_s=60.0, group_size=2, run_seed=0)  # fmt: skip


def setup(db_url: str, bucket: Path, n_rows: int, n_workers: int) -> tuple[str, list[str]]:
    from protocol.run_config import RunConfig
    from server.db import make_engine, make_sessionmaker
    from server.migrate import upgrade
    from tests.server.leases.helpers import make_run, make_worker

    engine = make_engine(db_url)
    upgrade(engine)
    config = RunConfig.model_validate(
        {
            "name": "bench", "base_model": "bench-model",
            "dataset": {"kind": "generator", "size": n_rows},
            "rewards": [{"name": "numeric_match"}], "group_size": 2, "prompts_per_lease": 1,
            "prompts_per_step": 1000, "max_staleness": 1000, "lease_ttl_s": 60.0,
        }
    )  # fmt: skip
    with make_sessionmaker(engine)() as db:
        run = make_run(db, config)
        tokens = [
            make_worker(db, models=["bench-model"], name=f"b{i}")[1] for i in range(n_workers)
        ]
        db.commit()
        run_id = str(run.id)
    engine.dispose()
    return run_id, tokens


class Stats:
    def __init__(self) -> None:
        self.lat: dict[str, list[float]] = {}
        self.cycles = 0
        self.errors = 0

    def add(self, name: str, seconds: float) -> None:
        self.lat.setdefault(name, []).append(seconds)

    def report(self, label: str, elapsed: float) -> float:
        rate = self.cycles / elapsed
        parts = []
        for name, xs in self.lat.items():
            xs.sort()
            p50, p99 = statistics.median(xs), xs[min(len(xs) - 1, int(len(xs) * 0.99))]
            parts.append(f"{name} p50 {p50 * 1000:.1f} ms p99 {p99 * 1000:.1f} ms")
        print(f"  {label}: {rate:.0f} cycles/s, errors {self.errors}; " + "; ".join(parts))
        return rate


KEYED_CALLS: set[str] = set()  # --keyed: {"acquire", "complete"}


async def http_worker(base: str, token: str, store: object, stop: float, stats: Stats) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(base, headers=headers) as http:
        while time.monotonic() < stop:

            async def call(name: str, path: str, body: dict) -> tuple[int, dict]:
                t = time.perf_counter()
                key = {IDEMPOTENCY_HEADER: new_key()} if name in KEYED_CALLS else {}
                async with http.post(path, json=body, headers=key) as r:
                    data = await r.json() if r.status == 200 else {}
                    stats.add(name, time.perf_counter() - t)
                    return r.status, data

            code, lease = await call("acquire", "/api/v1/leases/acquire", {})
            if code != 200:
                stats.errors += 1
                continue
            lid, f = lease["lease_id"], lease["fencing"]
            await call("heartbeat", f"/api/v1/leases/{lid}/heartbeat", {"fencing": f})
            body = {"fencing": f, "size": len(DATA), "sha256": SHA}
            await call("upload", f"/api/v1/leases/{lid}/upload", body)
            store.put_bytes(lease["batch_key"], DATA)  # type: ignore[attr-defined]
            manifest = {"key": lease["batch_key"], "sha256": SHA, "size": len(DATA),
                        "n_samples": 2, "n_tokens": 10, "generation_seconds": 0.0}  # fmt: skip
            code, _ = await call("complete", f"/api/v1/leases/{lid}/complete",
                                 {"fencing": f, "manifest": manifest})  # fmt: skip
            if code == 200:
                stats.cycles += 1
            else:
                stats.errors += 1


async def sql_worker(pool: AsyncConnectionPool, run_id: str, worker: tuple[str, str],
                     stop: float, stats: Stats) -> None:  # fmt: skip
    """The same cycle straight through psycopg: the engine's own statements (bench/common.py raw_*,
    autocommitted, authentication included) without HTTP, FastAPI or the service code — the
    floor the API is compared to."""
    from bench import common

    digest, worker_id = worker
    batch = {"bucket_key": "k", "sha256": SHA, "bytes": len(DATA), "n_samples": 2,
             "n_tokens": 10, "generation_seconds": 0.0, "manifest": {}}  # fmt: skip
    while time.monotonic() < stop:
        t = time.perf_counter()
        lid = uuid.uuid4()
        async with pool.connection() as conn:
            fencing = await common.raw_grant(conn, grant_params(run_id, worker_id, lid))
        if fencing is None:
            stats.errors += 1
            continue
        stats.add("acquire", time.perf_counter() - t)
        t = time.perf_counter()
        async with pool.connection() as conn:
            await common.raw_extend(conn, digest, lid, fencing)
        stats.add("heartbeat", time.perf_counter() - t)
        t = time.perf_counter()
        async with pool.connection() as conn:
            await common.raw_mark_uploading(conn, digest, lid, fencing)
        stats.add("upload", time.perf_counter() - t)
        t = time.perf_counter()
        async with pool.connection() as conn:
            accepted = await common.raw_accept(conn, digest, lid, fencing, batch)
        stats.add("complete", time.perf_counter() - t)
        if accepted:
            stats.cycles += 1
        else:
            stats.errors += 1


async def run_http(base: str, tokens: list[str], store: object, n: int, seconds: float,
                   label: str = "") -> float:  # fmt: skip
    stats = Stats()
    stop = time.monotonic() + seconds
    start = time.monotonic()
    await asyncio.gather(*(http_worker(base, tokens[i], store, stop, stats) for i in range(n)))
    return stats.report(f"API {label} N={n}", time.monotonic() - start)


async def run_sql(dsn: str, run_id: str, workers: list[tuple[str, str]], n: int,
                  seconds: float) -> float:  # fmt: skip
    stats = Stats()
    size = min(n, SQL_CONNECTIONS)
    pool = AsyncConnectionPool(
        dsn, min_size=size, max_size=size, open=False, kwargs={"autocommit": True}
    )
    await pool.open(wait=True)
    stop = time.monotonic() + seconds
    start = time.monotonic()
    try:
        await asyncio.gather(*(sql_worker(pool, run_id, workers[i], stop, stats) for i in range(n)))
    finally:
        await pool.close()
    return stats.report(f"SQL  N={n}", time.monotonic() - start)


@contextlib.contextmanager
def serve(db_url: str, bucket: Path, processes: int, tree: Path = ROOT) -> Iterator[str]:
    """The server (uvicorn, `processes` of it) of the checkout `tree` on a free port, with its
    default settings. Not asyncgrpo.cluster's server: `tree` may be another checkout (the
    baseline), so only its own tree may be on PYTHONPATH."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "ASYNCGRPO_DATABASE_URL": db_url, "ASYNCGRPO_BUCKET_URL": str(bucket),
           "ASYNCGRPO_SECURITY__SECRET_KEY": SECRET, "ASYNCGRPO_PRINT_ADMIN_TOKEN": "false",
           "ASYNCGRPO_PUBLIC_URL": f"http://127.0.0.1:{port}", "PYTHONPATH": str(tree),
           # the raw-SQL phase needs its own N connections under max_connections (100)
           "ASYNCGRPO_DATABASE_POOL_SIZE": str(24 // processes),
           "ASYNCGRPO_DATABASE_MAX_OVERFLOW": "0"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "server.main:app", "--host", "127.0.0.1",
         "--port", str(port), "--workers", str(processes), "--log-level",
         "warning", "--no-access-log"], cwd=tree, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # requests still queued at 256 workers
            proc.kill()
            proc.wait(10)


def settle(dsn: str) -> None:
    """VACUUM ANALYZE the scratch database, so each measurement starts from the same state."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def measure_api(args: argparse.Namespace, db_url: str, bucket: Path, tokens: list[str],
                tree: Path, label: str, n: int) -> float:  # fmt: skip
    from protocol.storage_local import LocalStore

    with serve(db_url, bucket, args.uvicorn_workers, tree) as base:
        store = LocalStore(root=str(bucket), base_url=base + "/blobs", secret_key=SECRET)
        # Warm-up (not counted): the first grant of a run parses its config (100,000 rows).
        asyncio.run(run_http(base, tokens, store, min(n, 4), 2.0, "warm-up"))
        return asyncio.run(run_http(base, tokens, store, n, args.seconds, label))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--uvicorn-workers", type=int, default=1)
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--repeats", type=int, default=1, help="Runs per point (medians).")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="Another checkout whose server is measured beside this one.",
    )
    parser.add_argument(
        "--keyed", action="store_true", help="Acquire and complete under an Idempotency-Key."
    )
    report.add_json_flag(parser)
    args = parser.parse_args()
    if args.keyed:
        KEYED_CALLS.update({"acquire", "complete"})
    name = f"agr_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    db_url = f"{PG}/{name}"
    bucket = Path(tempfile.mkdtemp(prefix="agr-bench-"))
    trees = {"engine": ROOT}
    if args.baseline_tree is not None:
        trees["baseline"] = args.baseline_tree.resolve()
    try:
        run_id, tokens = setup(db_url, bucket, args.rows, max(args.workers))
        dsn = db_url.replace("postgresql+psycopg", "postgresql")
        with psycopg.connect(dsn) as c:
            owners: dict[str, str] = dict(
                c.execute("SELECT digest, scope_id::text FROM tokens").fetchall()
            )
        from server.tokens.service import digest

        workers = [(digest(token), owners[digest(token)]) for token in tokens]
        print(f"bench/leases.py: {args.seconds:.0f} s per point, uvicorn workers "
              f"{args.uvicorn_workers}, Postgres, local store; "
              f"baseline {trees.get('baseline', 'none')}")  # fmt: skip
        summary = []
        for n in args.workers:
            runs: dict[str, list[float]] = {"engine": [], "baseline": [], "raw SQL": []}
            for repeat in range(args.repeats):
                # Alternate which server goes first, and vacuum before each measurement: the
                # cycles leave dead rows behind that slow whoever comes next.
                order = list(trees.items())
                for label, tree in order if repeat % 2 == 0 else order[::-1]:
                    settle(dsn)
                    runs[label].append(measure_api(args, db_url, bucket, tokens, tree, label, n))
                settle(dsn)
                runs["raw SQL"].append(asyncio.run(run_sql(dsn, run_id, workers, n, args.seconds)))
            medians = {k: statistics.median(v) if v else float("nan") for k, v in runs.items()}
            summary.append((n, medians))
            print(f"  N={n}: engine/baseline = {medians['engine'] / medians['baseline']:.2f}, "
                  f"engine/raw SQL = {medians['engine'] / medians['raw SQL']:.2f} "
                  f"(medians of {args.repeats})")  # fmt: skip
        print("\n  workers  engine cycles/s  baseline cycles/s  raw SQL cycles/s"
              "  engine/baseline  engine/raw SQL")  # fmt: skip
        for n, m in summary:
            api, base, raw = m["engine"], m["baseline"], m["raw SQL"]
            print(f"  {n:>7}  {api:>15.0f}  {base:>17.0f}  {raw:>16.0f}  {api / base:>15.2f}"
                  f"  {api / raw:>14.2f}")  # fmt: skip
        report.emit(args, {
            "seconds": args.seconds, "repeats": args.repeats,
            "uvicorn_workers": args.uvicorn_workers,
            "baseline_tree": str(trees.get("baseline")),
            "points": [{"workers": n, "engine_cycles_per_s": m["engine"],
                        "baseline_cycles_per_s": m["baseline"],
                        "raw_sql_cycles_per_s": m["raw SQL"],
                        "engine_over_baseline": m["engine"] / m["baseline"],
                        "engine_over_raw_sql": m["engine"] / m["raw SQL"]}
                       for n, m in summary],
        })  # fmt: skip
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
