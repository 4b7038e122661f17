"""Does the control plane keep a fleet of GPU-speed workers busy? N simulated workers against a
real server (uvicorn, 1 or more processes) on a fresh Postgres database, then the same fleet
on the server's own SQL statements (no HTTP) as a floor.

    .venv/bin/python bench/fleet.py [--workers-sim 16,64,256,1024] [--server-workers 1,2]
        [--seconds 15] [--quick] [--json]

A simulated worker registers (HTTP), then runs `--slots` lease loops at once (as the real
worker keeps several leases on one engine): acquire (long-poll) → "generate" by sleeping what
the simulated engine's profile takes for the lease (worker/backends/simulated.py
`lease_seconds`: max_new_tokens decode steps of step_s plus prefill; the lease's sequences fit
one batch, so two slots fill the engine) while heartbeating every heartbeat_interval_s →
upload (the presign call) → complete. The batch file is one real batch file of the lease shape
(1 prompt × G completions of max_new_tokens tokens), written once and put into the local
bucket folder directly, as S3 would take it off the control plane; the server checks its size,
sha256 and sample count, not its metadata. A scripted learner attaches, then every second
claims the accepted batches and publishes a version consuming them (tiny files), so the run's
admission counter stays low (the run's admission bound is 1,001,000 groups anyway).

Utilisation of a worker: time with at least one lease generating ÷ the measured window; the
fleet's is the mean over workers. Latencies: per call, calls answered in the window (calls
still unanswered when it ends are left out: at overload p99 is a lower bound). The
raw-SQL floor runs the same fleet with the lease engine's own statements (bench/common.py raw_*,
as bench/leases.py) on 8 pooled psycopg connections.

Everything (server, Postgres, this load generator: aiohttp in one process, as bench/leases.py
found an httpx one capped near 100–180 cycles/s by itself) shares this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import common, report  # noqa: E402
from bench.common import Window, union_overlap  # noqa: E402
from bench.leases import SECRET, serve  # noqa: E402
from tests.harness.runs import arithmetic  # noqa: E402
from tests.harness.runs import run_config as harness_run_config  # noqa: E402
from worker.backends.simulated import lease_seconds  # noqa: E402
from worker.config import SimulatedSettings  # noqa: E402

Points = dict[str, dict[str, float | None]]  # fleet size → figures
CALLS = ("acquire", "heartbeat", "upload", "complete")
GROUP_SIZE = 128  # one lease = 1 prompt × 128 sequences: two leases fill a 256-sequence engine
MAX_NEW_TOKENS = 64
PROMPT_TOKENS = 100
SQL_CONNECTIONS = 8  # bench/leases.py: the most cycles/s for the raw-SQL side here
LABEL = (
    "server, Postgres and this load generator share the machine's cores "
    f"({os.cpu_count()} here); figures are for the control plane under its own load generator"
)


def run_config(rows: int, epochs: int) -> dict[str, Any]:
    return harness_run_config(
        name="bench-fleet",
        dataset=arithmetic(rows),
        epochs=epochs,
        grpo={"spot_check_fraction": 0.0},
        sampling={"temperature": 1.0, "max_new_tokens": MAX_NEW_TOKENS},
        group_size=GROUP_SIZE,
        prompts_per_lease=1,
        prompts_per_step=1000,
        max_staleness=1000,  # admission bound 1,001,000 groups: never the limit here
        lease_ttl_s=30.0,
        heartbeat_interval_s=1.0,
    )


@dataclass
class Batch:
    data: bytes
    sha256: str
    n_tokens: int


def build_batch(work: Path) -> Batch:
    """One real batch file of the lease shape (its metadata names a made-up lease)."""
    from protocol.batch_format import BatchMetadata, RolloutSample
    from protocol.batches import write_batch

    meta = BatchMetadata(
        run_id=str(uuid.uuid4()), lease_id=str(uuid.uuid4()), fencing=1,
        worker_id=str(uuid.uuid4()), adapter_version=0, adapter_sha256=None,
        tokenizer_fingerprint="bench", sampling={"temperature": 1.0},
    )  # fmt: skip
    samples = [
        RolloutSample(1, g, list(range(PROMPT_TOKENS)), [(g * 7 + t) % 30000 for t in
                      range(MAX_NEW_TOKENS)], [-1.5] * MAX_NEW_TOKENS, "length")
        for g in range(GROUP_SIZE)
    ]  # fmt: skip
    info = write_batch(work / "batch.parquet", meta, samples)
    data = (work / "batch.parquet").read_bytes()
    return Batch(data, info.sha256, info.n_tokens)


# -- measurement -------------------------------------------------------------------------------


@dataclass
class Stats:
    window: Window
    lat: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CALLS})
    busy: list[list[tuple[float, float]]] = field(default_factory=list)  # per worker
    completed: int = 0
    empty: int = 0
    errors: int = 0

    async def timed(self, name: str, call: Awaitable[Any]) -> Any:
        started = time.monotonic()
        result = await call
        ended = time.monotonic()
        # by the answer's time: at overload a call can outlast the window (those still in
        # flight when it ends are not counted, so p99 is a lower bound there)
        if self.window.start <= ended <= self.window.end:
            self.lat[name].append(ended - started)
        return result

    def utilisation(self) -> float:
        span = self.window.end - self.window.start
        per_worker = [union_overlap(iv, self.window) / span for iv in self.busy]
        return sum(per_worker) / len(per_worker)

    def figures(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {"utilisation": round(self.utilisation(), 4)}
        span = self.window.end - self.window.start
        out["leases_per_s"] = round(self.completed / span, 1)
        for name, xs in self.lat.items():  # None: no call answered in the window
            for q in (50, 99):
                ms = round(common.percentile(xs, q) * 1000, 2) if xs else None
                out[f"{name}_p{q}_ms"] = ms
        out["empty_acquires"], out["errors"] = self.empty, self.errors
        return out


# -- the fleet, over HTTP or raw SQL ------------------------------------------------------------


@dataclass
class Lease:
    lease_id: str
    fencing: int
    batch_key: str
    data: Any = None  # what the transport needs besides


class Transport:
    """One simulated worker's four calls."""

    async def acquire(self) -> Lease | None:
        raise NotImplementedError

    async def heartbeat(self, lease: Lease) -> bool:
        raise NotImplementedError

    async def upload(self, lease: Lease) -> None:
        raise NotImplementedError

    async def complete(self, lease: Lease) -> bool:
        raise NotImplementedError


class HttpTransport(Transport):
    def __init__(self, http: aiohttp.ClientSession, token: str, batch: Batch, store: Any) -> None:
        self.http, self.batch, self.store = http, batch, store
        self.headers = {"Authorization": f"Bearer {token}"}

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.http.post(path, json=body, headers=self.headers) as r:
            return r.status, (await r.json() if r.status == 200 else None)

    async def acquire(self) -> Lease | None:
        code, lease = await self._post("/api/v1/leases/acquire", {"wait_s": 5.0})
        if code != 200:
            return None
        return Lease(lease["lease_id"], lease["fencing"], lease["batch_key"])

    async def heartbeat(self, lease: Lease) -> bool:
        body = {"fencing": lease.fencing}
        code, answer = await self._post(f"/api/v1/leases/{lease.lease_id}/heartbeat", body)
        return code == 200 and not answer.get("abort")

    async def upload(self, lease: Lease) -> None:
        body = {"fencing": lease.fencing, "size": len(self.batch.data), "sha256": self.batch.sha256}
        code, _ = await self._post(f"/api/v1/leases/{lease.lease_id}/upload", body)
        if code != 200:
            raise RuntimeError(f"upload answered {code}")
        self.store.put_bytes(lease.batch_key, self.batch.data)

    async def complete(self, lease: Lease) -> bool:
        manifest = {"key": lease.batch_key, "sha256": self.batch.sha256,
                    "size": len(self.batch.data), "n_samples": GROUP_SIZE,
                    "n_tokens": self.batch.n_tokens, "generation_seconds": 1.0}  # fmt: skip
        body = {"fencing": lease.fencing, "manifest": manifest}
        code, answer = await self._post(f"/api/v1/leases/{lease.lease_id}/complete", body)
        return code == 200 and answer.get("accepted", True) is not False


class SqlTransport(Transport):
    """The lease engine's own one-statement units, autocommitted, through a shared pool
    (bench/common.py raw_*)."""

    def __init__(self, pool: Any, run_id: str, digest: str, worker_id: str, batch: Batch) -> None:
        self.pool, self.run_id, self.digest, self.worker_id = pool, run_id, digest, worker_id
        self.batch = batch

    async def acquire(self) -> Lease | None:
        from server.leases.queue import grant_params

        lease_id = uuid.uuid4()
        params = grant_params(run_id=uuid.UUID(self.run_id), worker_id=uuid.UUID(self.worker_id),
                              lease_id=lease_id, n=1, bound=2**31 - 1, ttl_s=30.0,
                              group_size=GROUP_SIZE, run_seed=0)  # fmt: skip
        async with self.pool.connection() as conn:
            fencing = await common.raw_grant(conn, params)
        if fencing is None:
            await asyncio.sleep(0.5)  # what a long-poll would have waited, roughly
            return None
        return Lease(str(lease_id), fencing, "k", lease_id)

    async def heartbeat(self, lease: Lease) -> bool:
        async with self.pool.connection() as conn:
            await common.raw_extend(conn, self.digest, lease.data, lease.fencing)
        return True

    async def upload(self, lease: Lease) -> None:
        async with self.pool.connection() as conn:
            await common.raw_mark_uploading(conn, self.digest, lease.data, lease.fencing)

    async def complete(self, lease: Lease) -> bool:
        batch = {"bucket_key": f"k/{lease.lease_id}", "sha256": self.batch.sha256,
                 "bytes": len(self.batch.data), "n_samples": GROUP_SIZE,
                 "n_tokens": self.batch.n_tokens, "generation_seconds": 1.0,
                 "manifest": {}}  # fmt: skip
        async with self.pool.connection() as conn:
            return await common.raw_accept(conn, self.digest, lease.data, lease.fencing, batch)


async def generate(t: Transport, lease: Lease, gen_s: float, beat_s: float, stats: Stats) -> bool:
    """Sleep what the engine would take, heartbeating; False when the lease was lost."""
    done = time.monotonic() + gen_s
    while (left := done - time.monotonic()) > 0:
        await asyncio.sleep(min(beat_s, left))
        if done - time.monotonic() > 0 and not await stats.timed("heartbeat", t.heartbeat(lease)):
            return False
    return True


async def lease_slot(
    t: Transport, gen_s: float, beat_s: float, stats: Stats, busy: list[tuple[float, float]]
) -> None:
    """acquire → generate (sleep, heartbeating) → upload → complete, until the window ends."""
    while time.monotonic() < stats.window.end:
        try:
            lease = await stats.timed("acquire", t.acquire())
            if lease is None:
                stats.empty += 1
                continue
            started = time.monotonic()
            try:
                alive = await generate(t, lease, gen_s, beat_s, stats)
            finally:  # a generation the window's end cancels counts up to then
                busy.append((started, time.monotonic()))
            if not alive:
                stats.errors += 1
                continue
            await stats.timed("upload", t.upload(lease))
            if await stats.timed("complete", t.complete(lease)):
                if stats.window.start <= time.monotonic() <= stats.window.end:
                    stats.completed += 1
            else:
                stats.errors += 1
        except (TimeoutError, aiohttp.ClientError, RuntimeError):
            stats.errors += 1
            await asyncio.sleep(0.2)


async def run_fleet(
    transports: list[Transport], args: argparse.Namespace, gen_s: float, ramp_s: float
) -> Stats:
    now = time.monotonic()
    stats = Stats(Window(now + ramp_s, now + ramp_s + args.seconds))
    slots = []
    for t in transports:
        busy: list[tuple[float, float]] = []
        stats.busy.append(busy)
        slots += [lease_slot(t, gen_s, 1.0, stats, busy) for _ in range(args.slots)]
    tasks = [asyncio.ensure_future(s) for s in slots]
    await asyncio.sleep(max(0.0, stats.window.end - time.monotonic()))
    for task in tasks:  # calls still in flight after the window are not counted
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return stats


# -- setup: run, learner, workers ---------------------------------------------------------------


async def register(base: str, reg_token: str, n: int) -> list[str]:
    body = {"name": "", "gpu_type": "H100", "gpu_count": 1, "price_per_hour": 0.0,
            "models": [common.MODEL]}  # fmt: skip
    headers = {"Authorization": f"Bearer {reg_token}"}
    limit = asyncio.Semaphore(32)
    async with aiohttp.ClientSession(base) as http:

        async def one(i: int) -> str:
            async with limit, http.post("/api/v1/workers/register", headers=headers,
                                        json={**body, "name": f"sim-{i}"}) as r:  # fmt: skip
                r.raise_for_status()
                return str((await r.json())["token"])

        return list(await asyncio.gather(*(one(i) for i in range(n))))


class Learner:
    """Attaches, then every second claims what is accepted and publishes a version on it."""

    def __init__(self, http: aiohttp.ClientSession, run_id: str, token: str) -> None:
        self.http, self.run_id = http, run_id
        self.headers = {"Authorization": f"Bearer {token}"}
        self.fencing, self.version, self.published = 0, 0, 0

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        async with self.http.post(f"/api/v1/runs/{self.run_id}/{path}", json=body,
                                  headers=self.headers) as r:  # fmt: skip
            r.raise_for_status()
            return await r.json()

    async def attach(self) -> None:
        answer = await self._post("learner/attach", {"tokenizer_fingerprint": "bench-fleet",
                                                     "name": "bench"})  # fmt: skip
        self.fencing, self.version = answer["fencing"], answer["current_version"]

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.step()
            except aiohttp.ClientError as exc:
                print(f"  learner: {exc}", flush=True)

    async def step(self) -> None:
        await self._post("learner/heartbeat", {"fencing": self.fencing})
        claim = await self._post("batches/claim", {"fencing": self.fencing,
                                                   "max_groups": 100_000, "wait_s": 0})  # fmt: skip
        ids = [b["batch_id"] for b in claim["batches"]]
        if ids:
            await self.publish(ids)

    async def publish(self, batch_ids: list[str]) -> None:
        version = self.version + 1
        files = {("adapter_config.json", "adapter"): b'{"r": 4}',
                 ("adapter_model.safetensors", "adapter"): b"w" * 1024 + str(version).encode(),
                 ("state.json", "checkpoint"): b'{"step": %d}' % version}  # fmt: skip
        wanted = [{"name": n, "kind": k, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                  for (n, k), b in files.items()]  # fmt: skip
        answer = await self._post("uploads", {"fencing": self.fencing, "version": version,
                                              "files": wanted})  # fmt: skip
        published: dict[str, list[dict[str, Any]]] = {"adapter": [], "checkpoint": []}
        for put in answer["uploads"]:
            data = files[(put["name"], put["kind"])]
            async with self.http.put(put["url"], data=data, headers=put["headers"]) as r:
                r.raise_for_status()
            published[put["kind"]].append({"name": put["name"], "key": put["key"],
                                           "size": len(data),
                                           "sha256": hashlib.sha256(data).hexdigest()})  # fmt: skip
        await self._post("adapters", {
            "fencing": self.fencing, "version": version, "files": published["adapter"],
            "checkpoint_files": published["checkpoint"], "learner_step": version,
            "consumed_batch_ids": batch_ids,
        })  # fmt: skip
        self.version, self.published = version, self.published + len(batch_ids)


def admin_token(db_url: str) -> str:
    from server.db import make_engine, make_sessionmaker, transaction
    from server.tokens import service as tokens

    engine = make_engine(db_url)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            return tokens.mint(session, "admin", name="bench-fleet").plaintext
    finally:
        engine.dispose()


async def new_run(http: aiohttp.ClientSession, admin: str, rows: int, epochs: int) -> dict:
    headers = {"Authorization": f"Bearer {admin}"}
    async with http.post("/api/v1/runs", json=run_config(rows, epochs), headers=headers) as r:
        r.raise_for_status()
        return dict(await r.json())


async def registration_token(http: aiohttp.ClientSession, admin: str, uses: int) -> str:
    headers = {"Authorization": f"Bearer {admin}"}
    body = {"name": "bench-fleet", "ttl_hours": 2, "max_uses": uses}
    async with http.post("/api/v1/registration-tokens", json=body, headers=headers) as r:
        r.raise_for_status()
        return str((await r.json())["token"])


# -- phases ------------------------------------------------------------------------------------


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def http_phase(base: str, db_url: str, bucket: Path, args: argparse.Namespace,
                     batch: Batch, gen_s: float, tokens: list[str] | None
                     ) -> tuple[Points, list[str]]:  # fmt: skip
    from protocol.storage_local import LocalStore

    store = LocalStore(root=str(bucket), base_url=base + "/blobs", secret_key=SECRET)
    admin = admin_token(db_url)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(base, connector=connector, timeout=timeout) as http:
        created = await new_run(http, admin, args.rows, args.epochs)
        if tokens is None:
            reg = await registration_token(http, admin, max(args.workers_sim))
            tokens = await register(base, reg, max(args.workers_sim))
        learner = Learner(http, str(created["run"]["id"]), created["learner_token"])
        await learner.attach()
        learner_task = asyncio.ensure_future(learner.loop())
        out = {}
        try:
            for n in args.workers_sim:
                transports: list[Transport] = [
                    HttpTransport(http, tokens[i], batch, store) for i in range(n)
                ]
                cpu = cpu_seconds()
                stats = await run_fleet(transports, args, gen_s, args.ramp)
                figures = stats.figures()
                span = args.seconds + args.ramp
                figures["load_generator_cpu"] = round((cpu_seconds() - cpu) / span, 2)
                out[str(n)] = figures
                print(f"  N={n}: {figures}", flush=True)
        finally:
            learner_task.cancel()
        print(f"  learner consumed {learner.published} batches in {learner.version} versions")
    return out, tokens


async def sql_phase(base: str, db_url: str, args: argparse.Namespace, batch: Batch,
                    gen_s: float, tokens: list[str]) -> Points:  # fmt: skip
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from server.tokens.service import digest

    admin = admin_token(db_url)
    async with aiohttp.ClientSession(base) as http:
        created = await new_run(http, admin, args.rows, args.epochs)
        learner = Learner(http, str(created["run"]["id"]), created["learner_token"])
        await learner.attach()  # the run is running, as on the API side
    run_id = str(created["run"]["id"])
    dsn = db_url.replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(dsn) as c:
        owners = dict(c.execute("SELECT digest, scope_id::text FROM tokens").fetchall())
    pool = AsyncConnectionPool(dsn, min_size=SQL_CONNECTIONS, max_size=SQL_CONNECTIONS,
                               open=False, kwargs={"autocommit": True})  # fmt: skip
    await pool.open(wait=True)
    out = {}
    try:
        for n in args.workers_sim:
            transports: list[Transport] = [
                SqlTransport(pool, run_id, digest(tok), owners[digest(tok)], batch)
                for tok in tokens[:n]
            ]
            figures = (await run_fleet(transports, args, gen_s, args.ramp)).figures()
            out[str(n)] = figures
            print(f"  raw SQL N={n}: {figures}", flush=True)
    finally:
        await pool.close()
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_tables(fleet: dict[str, Points]) -> None:
    headers = ["N", "util", "leases/s", *(f"{c} p50/p99 ms" for c in CALLS), "empty", "errors"]
    for label, points in fleet.items():
        rows = []
        for n, f in points.items():
            cells = [f"{_ms(f[f'{c}_p50_ms'])}/{_ms(f[f'{c}_p99_ms'])}" for c in CALLS]
            rows.append([n, f["utilisation"], f["leases_per_s"], *cells, f["empty_acquires"],
                         f["errors"]])  # fmt: skip
        common.print_table(label, headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers-sim", default="16,64,256,1024",
                        help="Fleet sizes, comma-separated.")  # fmt: skip
    parser.add_argument("--server-workers", default="1,2",
                        help="uvicorn process counts to measure, comma-separated.")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=12.0, help="Measured window per point.")
    parser.add_argument("--ramp", type=float, default=3.0, help="Unmeasured start per point.")
    parser.add_argument("--slots", type=int, default=2, help="Leases in flight per worker.")
    parser.add_argument("--rows", type=int, default=4000, help="Dataset rows of each run.")
    parser.add_argument("--epochs", type=int, default=10, help="Epochs of each run.")
    parser.add_argument("--no-sql", action="store_true", help="Skip the raw-SQL floor.")
    parser.add_argument("--quick", action="store_true",
                        help="A tiny run: 4 and 16 workers, 1 server process, 3 s.")  # fmt: skip
    report.add_json_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.workers_sim, args.server_workers = "4,16", "1"
        args.seconds, args.ramp, args.rows, args.epochs = 3.0, 2.0, 500, 2
    args.workers_sim = [int(x) for x in args.workers_sim.split(",")]
    args.server_workers = [int(x) for x in args.server_workers.split(",")]
    common.exit_on_sigterm()

    profile = SimulatedSettings()
    gen_s = lease_seconds(profile, GROUP_SIZE, PROMPT_TOKENS, MAX_NEW_TOKENS)
    print(f"bench/fleet.py: lease = 1 prompt x G {GROUP_SIZE}, {MAX_NEW_TOKENS} new tokens: "
          f"{gen_s:.2f} s on the simulated engine (step {profile.step_s * 1000:.0f} ms, batch "
          f"{profile.max_batch}); {args.slots} leases in flight per worker; "
          f"{args.seconds:.0f} s per point after {args.ramp:.0f} s\n  {LABEL}\n  "
          f"{common.load_average()}", flush=True)  # fmt: skip
    fleet: dict[str, Points] = {}
    raw: Points = {}
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, common.postgres_db() as db:
        batch = build_batch(Path(tmp))
        bucket = Path(tmp) / "bucket"
        tokens = None
        for processes in args.server_workers:
            print(f"\nserver processes: {processes}", flush=True)
            with serve(db, bucket, processes) as base:
                fleet[str(processes)], tokens = asyncio.run(
                    http_phase(base, db, bucket, args, batch, gen_s, tokens)
                )
        if not args.no_sql and tokens is not None:
            print("\nraw SQL floor (no HTTP)", flush=True)
            with serve(db, bucket, 1) as base:
                raw = asyncio.run(sql_phase(base, db, args, batch, gen_s, tokens))
    tables = {f"{p} server process(es)": points for p, points in fleet.items()}
    if raw:
        tables["raw SQL floor (the engine's own statements, no HTTP)"] = raw
    print_tables(tables)
    report.emit(args, {"fleet": fleet, "raw_sql": raw, "lease_generation_s": gen_s,
                       "slots": args.slots, "seconds": args.seconds, "note": LABEL})  # fmt: skip


if __name__ == "__main__":
    main()
