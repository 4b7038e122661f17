"""What an idle fleet costs the database, and how soon a waiting worker hears of new work: N
simulated workers long-poll acquire against a real server (uvicorn, Postgres) with no work
queued, once on the baseline and once with wake-ups (this tree's defaults), in the same run
and on the same database. The baseline is `--baseline-tree`'s server with its own defaults (a
checkout from before wake-ups: `git archive <commit> | tar -x -C ../before`), else this tree
with the waiting calls polling every 0.25 s (`long_poll_wakeups: false`,
`long_poll_interval_s: 0.25`).

    .venv/bin/python bench/idle_fleet.py [--workers 256] [--seconds 15] [--samples 40]
        [--baseline-tree ../before] [--repeats 1] [--json]

Each mode gets a server of its own and a fresh running run (a scripted learner attached) whose
every prompt row a holder worker has leased, so the N waiters find nothing: each try reads the
leasing run and tries its grant, as an idle fleet's do. Idle cost: Postgres's committed and
rolled-back transactions in the scratch database (`pg_stat_database`; a worker call's unit is
mostly one autocommitted statement) per second over `--seconds`, after a ramp. Grant latency:
`--samples` times, at random gaps, the holder releases one lease (its row goes back to the
queue) and the time from sending that release to a waiter's 200 arriving is one sample.

The load generator is aiohttp in one process; server, Postgres and it share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import common, report  # noqa: E402
from bench.fleet import Learner, admin_token, register, registration_token  # noqa: E402
from bench.leases import serve  # noqa: E402
from server.db_async import libpq_url  # noqa: E402
from tests.harness.runs import arithmetic  # noqa: E402
from tests.harness.runs import run_config as harness_run_config  # noqa: E402

POLL = {"ASYNCGRPO_LONG_POLL_WAKEUPS": "false", "ASYNCGRPO_LONG_POLL_INTERVAL_S": "0.25"}
ACQUIRE = "/api/v1/leases/acquire"


def run_config(rows: int) -> dict[str, Any]:
    return harness_run_config(
        name="bench-idle-fleet",
        dataset=arithmetic(rows),
        epochs=1,
        grpo={"spot_check_fraction": 0.0},
        group_size=2,
        prompts_per_lease=1,
        prompts_per_step=rows,
        max_staleness=100,
        lease_ttl_s=600.0,
        heartbeat_interval_s=60.0,
    )


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """These ASYNCGRPO_* settings for the server started inside (bench/leases.py serve)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def acquire_tries(http: aiohttp.ClientSession) -> float:
    """The acquire tries the server answered (/metrics, every process)."""
    async with http.get("/metrics") as r:
        text = await r.text()
    prefix = 'asyncgrpo_worker_calls_total{call="acquire"'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def transactions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0])


class Waiters:
    """N workers long-polling acquire; each 200 is stamped on arrival (and the lease kept)."""

    def __init__(self, http: aiohttp.ClientSession, tokens: list[str]) -> None:
        self.http, self.tokens = http, tokens
        self.granted: list[float] = []
        self.arrived = asyncio.Event()
        self.errors = 0

    async def wait(self, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        while True:
            try:
                async with self.http.post(ACQUIRE, json={"wait_s": 10}, headers=headers) as r:
                    if r.status == 200:
                        await r.read()
                        self.granted.append(time.perf_counter())
                        self.arrived.set()
                    elif r.status != 204:
                        self.errors += 1
                        await asyncio.sleep(1.0)
            except (aiohttp.ClientError, TimeoutError):
                self.errors += 1
                await asyncio.sleep(1.0)


async def hold_every_row(http: aiohttp.ClientSession, token: str, n: int) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"}
    held = []
    for _ in range(n):
        async with http.post(ACQUIRE, json={}, headers=headers) as r:
            assert r.status == 200, await r.text()
            held.append(await r.json())
    async with http.post(ACQUIRE, json={}, headers=headers) as r:
        assert r.status == 204, "rows left queued"
    return held


async def release(http: aiohttp.ClientSession, token: str, lease: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    body = {"fencing": lease["fencing"], "reason": "shutdown"}
    async with http.post(f"/api/v1/leases/{lease['lease_id']}/release", json=body,
                         headers=headers) as r:  # fmt: skip
        assert r.status == 200, await r.text()


async def phase(base: str, db: str, args: argparse.Namespace, tokens: list[str]) -> dict:
    admin = admin_token(db)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    headers = {"Authorization": f"Bearer {admin}"}
    async with aiohttp.ClientSession(base, connector=connector, timeout=timeout) as http:
        async with http.post("/api/v1/runs", json=run_config(args.samples),
                             headers=headers) as r:  # fmt: skip
            r.raise_for_status()
            created = await r.json()
        run_id = str(created["run"]["id"])
        await Learner(http, run_id, created["learner_token"]).attach()
        holder, fleet = tokens[0], tokens[1 : args.workers + 1]
        held = await hold_every_row(http, holder, args.samples)
        waiters = Waiters(http, fleet)
        tasks = [asyncio.ensure_future(waiters.wait(t)) for t in fleet]
        try:
            await asyncio.sleep(args.ramp)
            dsn = libpq_url(db)
            tries = await acquire_tries(http)
            before, started = transactions(dsn), time.monotonic()
            await asyncio.sleep(args.seconds)
            per_s = (transactions(dsn) - before) / (time.monotonic() - started)
            tries_per_s = (await acquire_tries(http) - tries) / (time.monotonic() - started)
            assert not waiters.granted, "a waiter was granted work while none was queued"
            latencies = []
            for lease in held:
                await asyncio.sleep(random.uniform(0.05, 0.3))
                waiters.arrived.clear()
                sent = time.perf_counter()
                await release(http, holder, lease)
                await asyncio.wait_for(waiters.arrived.wait(), 30)
                latencies.append(waiters.granted[-1] - sent)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        async with http.post(f"/api/v1/runs/{run_id}/cancel", json={}, headers=headers) as r:
            r.raise_for_status()
    return {
        "transactions_per_s": round(per_s, 1),
        "acquire_tries_per_s": round(tries_per_s, 1),
        "grant_p50_ms": round(common.percentile(latencies, 50) * 1000, 1),
        "grant_p99_ms": round(common.percentile(latencies, 99) * 1000, 1),
        "samples": len(latencies),
        "errors": waiters.errors,
    }


async def fleet_tokens(base: str, db: str, n: int) -> list[str]:
    async with aiohttp.ClientSession(base) as http:
        reg = await registration_token(http, admin_token(db), n)
    return await register(base, reg, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=256, help="Waiting simulated workers.")
    parser.add_argument("--seconds", type=float, default=15.0, help="Idle window per mode.")
    parser.add_argument("--ramp", type=float, default=3.0, help="Unmeasured start per mode.")
    parser.add_argument("--samples", type=int, default=40, help="Grant-latency samples.")
    parser.add_argument("--repeats", type=int, default=1, help="Runs per mode (medians).")
    parser.add_argument(
        "--baseline-tree", type=Path, default=None, help="A checkout from before wake-ups."
    )
    report.add_json_flag(parser)
    args = parser.parse_args()
    common.exit_on_sigterm()
    print(f"bench/idle_fleet.py: {args.workers} waiting workers, {args.seconds:.0f} s idle "
          f"window after {args.ramp:.0f} s, {args.samples} grant samples per mode\n  "
          f"{common.CONTENDED}\n  {common.load_average()}", flush=True)  # fmt: skip
    baseline = (args.baseline_tree.resolve(), {}) if args.baseline_tree else (ROOT, POLL)
    modes = {"baseline": baseline, "wakeups": (ROOT, {})}
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp, common.postgres_db() as db:
        bucket = Path(tmp) / "bucket"
        tokens: list[str] = []
        for repeat in range(args.repeats):
            order = list(modes) if repeat % 2 == 0 else list(reversed(modes))
            for mode in order:
                tree, settings = modes[mode]
                with environment(settings), serve(db, bucket, 1, tree) as base:
                    tokens = tokens or asyncio.run(fleet_tokens(base, db, args.workers + 1))
                    figures = asyncio.run(phase(base, db, args, tokens))
                print(f"  {mode}: {figures}", flush=True)
                runs[mode].append(figures)
    medians = {
        mode: {key: common.median([r[key] for r in rs]) for key in rs[0]}
        for mode, rs in runs.items()
    }
    poll, woken = medians["baseline"], medians["wakeups"]
    ratios = {
        "transactions_per_s": woken["transactions_per_s"] / poll["transactions_per_s"],
        "acquire_tries_per_s": woken["acquire_tries_per_s"] / poll["acquire_tries_per_s"],
        "grant_p50": woken["grant_p50_ms"] / poll["grant_p50_ms"],
        "grant_p99": woken["grant_p99_ms"] / poll["grant_p99_ms"],
    }
    common.print_table(
        "idle fleet (medians)",
        ["mode", "transactions/s", "acquire tries/s", "grant p50 ms", "grant p99 ms"],
        [[m, f["transactions_per_s"], f["acquire_tries_per_s"], f["grant_p50_ms"],
          f["grant_p99_ms"]] for m, f in medians.items()]
        + [["wakeups / baseline", f"{ratios['transactions_per_s']:.3f}",
            f"{ratios['acquire_tries_per_s']:.3f}", f"{ratios['grant_p50']:.2f}",
            f"{ratios['grant_p99']:.2f}"]],
    )  # fmt: skip
    report.emit(args, {"workers": args.workers, "seconds": args.seconds, "runs": runs,
                       "baseline": str(args.baseline_tree or "this tree, 0.25 s poll"),
                       "medians": medians, "wakeups_over_baseline": ratios})  # fmt: skip


if __name__ == "__main__":
    main()
