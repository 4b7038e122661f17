"""Shared helpers of bench/sync_latency.py, bench/async_vs_sync.py and bench/admission.py.

Everything runs the real system through asyncgrpo/cluster.py, put together by the test harness
(tests/harness/stack.py): a uvicorn control plane on a fresh Postgres database (jobs
in-process), moto's S3 server in its own process as the bucket, rollout workers (transformers on
CPU) and the learner as subprocesses with one torch thread each. These helpers add what only
the benchmarks need: the bench's settings of that stack, CPU pinning with `taskset`, a
SIGSTOP/SIGCONT duty-cycle throttle (what `cpulimit` does), figures read back from the run's
rows, printed tables, and a scripted learner (`Publisher`: attaches with the learner token,
claims whatever batches are ready and publishes version N+1 through the real learner calls
with a real PEFT LoRA adapter, so that no training time hides in a figure).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from asyncgrpo.cluster import Cluster, ClusterConfig, ManagedProcess
from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient
from server.runs.waste import Waste, stale_waste
from tests.harness.runs import LIVE_RUN, arithmetic
from tests.harness.stack import (
    FAST_LEARNER_ENV,
    FAST_SERVER_ENV,
    FAST_WORKER_ENV,
    S3Bucket,
    cluster_config,
    migrated_database,
    moto_process,
    sql,
    wait_run_finished,
    wait_workers_ready,
)

MB = 1024 * 1024
MODEL = "smollm2-135m-instruct"
SECRET = "bench-secret-" + "x" * 40
S3_KEYS = ("bench-access-key", "bench-secret-key")
PG_ADMIN_URL = os.environ.get(
    "ASYNCGRPO_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
CONTENDED = (
    "CPU-contended: 2 shared cores, other engineers' test runs on the same machine; "
    "quote medians, compare within one table only"
)


# -- processes -----------------------------------------------------------------------------------


@contextmanager
def postgres_db() -> Iterator[str]:
    """A fresh Postgres database (at ASYNCGRPO_BENCH_PG_URL's server) migrated to head, dropped
    afterwards."""
    with migrated_database(PG_ADMIN_URL) as url:
        yield url


def bench_cluster(work: Path, database_url: str, s3: S3Bucket, **worker_env: str) -> ClusterConfig:
    """The FAST settings (tests/harness/stack.py), on Postgres and moto S3."""
    return cluster_config(
        work / "cluster",
        database_url=database_url,
        bucket=s3,
        secret_key=SECRET,
        server_env=FAST_SERVER_ENV,
        worker_env={**FAST_WORKER_ENV, **worker_env},
        learner_env=FAST_LEARNER_ENV,
    )


def pin(proc: ManagedProcess, cpus: str) -> bool:
    """Pin every thread of the process to `cpus` (threads it starts later inherit it)."""
    return _taskset(proc.pid, cpus)


def _taskset(pid: int, cpus: str) -> bool:
    done = subprocess.run(
        ["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True, check=False
    )
    return done.returncode == 0


class Throttle(threading.Thread):
    """Lets a process group run `duty` of every `period_s` (SIGCONT … SIGSTOP), as `cpulimit`
    does: the process becomes ~1/duty times slower in wall time, whatever it is doing."""

    def __init__(self, proc: ManagedProcess, duty: float, period_s: float = 0.3) -> None:
        super().__init__(daemon=True, name=f"throttle-{proc.name}")
        self.proc, self.duty, self.period_s = proc, duty, period_s
        self.stopped = threading.Event()

    def run(self) -> None:
        run_s = self.duty * self.period_s
        while not self.stopped.is_set() and self.proc.alive():
            self.proc.signal_group(signal.SIGCONT)
            if self.stopped.wait(run_s):
                break
            self.proc.signal_group(signal.SIGSTOP)
            self.stopped.wait(self.period_s - run_s)
        self.proc.signal_group(signal.SIGCONT)

    def stop(self) -> None:
        self.stopped.set()
        if self.ident is not None:  # started
            self.join(timeout=5)
        self.proc.signal_group(signal.SIGCONT)


def exit_on_sigterm() -> None:
    """SIGTERM ends the benchmark through its `finally` blocks (every process it started is
    stopped, the database dropped) instead of killing it on the spot."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def log_time(line: str) -> float:
    """Epoch seconds of a `%(asctime)s` log line (local time, milliseconds)."""
    stamp = line[:23]
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


# -- figures from the run's rows -----------------------------------------------------------------


@dataclass(frozen=True)
class RunFigures:
    """One finished run, measured between the publish of version 1 and of the last version
    (the learner's model load and the first step are left out: steady state only); its stale
    waste over the whole run is the server's own figure (server/runs/waste.py)."""

    versions: int
    window_s: float
    samples: int  # completions consumed into versions 2..last
    reward_sum: float  # Σ reward over those completions (reward_mean × samples per step)
    reward_mean: float
    waste: Waste

    @property
    def samples_per_hour(self) -> float:
        return self.samples / self.window_s * 3600 if self.window_s > 0 else 0.0

    @property
    def reward_per_minute(self) -> float:
        return self.reward_sum / self.window_s * 60 if self.window_s > 0 else 0.0

    @property
    def generated(self) -> int:
        return self.waste.generated

    @property
    def stale_rejected(self) -> int:
        return self.waste.stale_rejected

    @property
    def aborted(self) -> int:
        return self.waste.stale_aborted

    @property
    def stale_waste(self) -> float:
        return self.waste.ratio

    @property
    def wasted_worker_s(self) -> float:
        return self.waste.wasted_worker_seconds

    @property
    def worker_s(self) -> float:
        return self.waste.worker_seconds


def whole_run_waste(database_url: str, run_id: uuid.UUID) -> Waste:
    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            return stale_waste(session, run_id)
    finally:
        engine.dispose()


def run_figures(database_url: str, run_id: str, group_size: int) -> RunFigures:
    run = uuid.UUID(run_id)
    times = sql(
        database_url,
        "SELECT version, created_at FROM adapter_versions WHERE run_id = :r ORDER BY version",
        r=run,
    )
    versions = len(times)
    window_s = (times[-1][1] - times[0][1]).total_seconds() if versions >= 2 else 0.0
    points = sql(
        database_url,
        "SELECT version, \"values\" FROM metric_points WHERE run_id = :r AND source = 'learner'",
        r=run,
    )
    samples, reward_sum = 0, 0.0
    for version, values in points:
        if version is not None and version >= 2 and values.get("reward_mean") is not None:
            n = int(values.get("groups", 0)) * group_size
            samples += n
            reward_sum += float(values["reward_mean"]) * n
    return RunFigures(
        versions=versions,
        window_s=window_s,
        samples=samples,
        reward_sum=reward_sum,
        reward_mean=reward_sum / samples if samples else 0.0,
        waste=whole_run_waste(database_url, run),
    )


# -- time intervals and log stamps ---------------------------------------------------------------


@dataclass
class Window:
    """A span of time, epoch seconds."""

    start: float
    end: float

    def overlap(self, a: float, b: float) -> float:
        return max(0.0, min(b, self.end) - max(a, self.start))


def union_overlap(intervals: list[tuple[float, float]], window: Window) -> float:
    """Seconds of the window covered by at least one interval."""
    total, reach = 0.0, window.start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, window.end)
        if b > a:
            total += b - a
            reach = b
    return total


def log_stamp(pattern: str, log_text: str) -> re.Match[str] | None:
    """The first log line matching `pattern` (a regex); group 1 is its `%(asctime)s` stamp
    (read it with `log_time`), the pattern's own groups follow."""
    return re.search(rf"^(.{{23}}) .*{pattern}", log_text, re.M)


def first_generation(log_text: str, run_id: str, version: int) -> float | None:
    """Epoch seconds at which a worker's log first says it generates with `version`."""
    found = log_stamp(rf"generating with run={run_id} v{version}$", log_text)
    return log_time(found.group(1)) if found else None


# -- output --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100])."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def load_average() -> str:
    one, five, _fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} (1 / 5 min) on {os.cpu_count()} cores"


# -- a sweep of runs on one cluster ------------------------------------------------------------


# A sweep's tiny arithmetic run (a layer of tests/harness/runs.py run_config): G = 4, 1 prompt
# per lease, 2 per step, 16 new tokens, LoRA r 4; give it a name and max_versions.
SWEEP_RUN: dict[str, Any] = {
    **LIVE_RUN,
    "dataset": arithmetic(400),
    "grpo": {"learning_rate": 5e-4, "spot_check_fraction": 0.0},
    "prompts_per_lease": 1,
    "prompts_per_step": 2,
    "lease_ttl_s": 30.0,
}


@dataclass(frozen=True)
class Layout:
    """How the processes share this machine's cores, and how much the slow worker runs."""

    control_cpus: str = "0"  # server, moto, learner
    worker_cpus: str = "1"  # both workers
    slow_duty: float = 1 / 3
    learner_duty: float | None = None  # None: the learner runs unthrottled

    def describe(self) -> str:
        learner = (
            f"; the learner throttled to {self.learner_duty:.0%} the same way"
            if self.learner_duty is not None
            else ""
        )
        return (
            f"taskset: server + moto + learner on CPU {self.control_cpus}, both workers on CPU "
            f"{self.worker_cpus}; worker 'slow' throttled to {self.slow_duty:.0%} of wall time "
            f"by a SIGSTOP/SIGCONT duty cycle (300 ms period, as cpulimit does){learner}"
        )


def sweep(
    configs: Sequence[dict[str, Any]], layout: Layout, timeout_s: float = 900
) -> list[RunFigures]:
    """Run each config to completion, one after the other, on one cluster (server, moto, a fast
    and a throttled worker stay up; a learner process per run). Returns each run's figures."""
    import tempfile

    exit_on_sigterm()
    out: list[RunFigures] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp, postgres_db() as db:
        work = Path(tmp)
        with moto_process(work, S3_KEYS) as moto:
            cluster = Cluster(bench_cluster(work, db, moto.bucket))
            with cluster:
                cluster.start_server()
                assert cluster.server is not None
                pin(cluster.server, layout.control_cpus)
                _taskset(moto.pid, layout.control_cpus)
                throttle = None
                try:
                    for i, config in enumerate(configs):
                        run_id = cluster.create_run(config)
                        if i == 0:
                            for name in ("fast", "slow"):
                                pin(cluster.start_worker(name), layout.worker_cpus)
                            throttle = Throttle(cluster.workers["slow"], layout.slow_duty)
                        learner = cluster.start_learner()
                        pin(learner, layout.control_cpus)
                        if throttle is not None and i == 0:
                            wait_workers_ready(cluster, ["fast", "slow"])
                            throttle.start()
                        slow_learner = None
                        if layout.learner_duty is not None:
                            slow_learner = Throttle(learner, layout.learner_duty)
                            slow_learner.start()
                        try:
                            status = wait_run_finished(cluster, run_id, timeout_s)
                        finally:
                            if slow_learner is not None:
                                slow_learner.stop()
                        learner.stop(grace_s=10)
                        figures = run_figures(db, run_id, int(config["group_size"]))
                        out.append(figures)
                        print(f"{config['name']}: {status}, {figures}", flush=True)
                finally:
                    if throttle is not None:
                        throttle.stop()
    return out


# -- the scripted learner ----------------------------------------------------------------------

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# -- adapters of a given size ----------------------------------------------------------------------


def build_templates(sizes_mb: list[int], out: Path) -> dict[int, Path]:
    """One real PEFT adapter folder per size (rank chosen for the size), via lm/adapter_io.py."""
    from peft import LoraConfig, get_peft_model

    from lm.adapter_io import save_adapter_version
    from lm.models import load_model

    base: Any = load_model(MODEL)
    per_rank = 4 * sum(  # fp32 bytes of one rank: A (r × in) + B (out × r) per wrapped Linear
        m.in_features + m.out_features
        for name, m in base.named_modules()
        if name.rsplit(".", 1)[-1] in ALL_LINEAR
    )
    folders = {}
    for size in sizes_mb:
        rank = max(1, round(size * MB / per_rank))
        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                            target_modules=ALL_LINEAR, init_lora_weights="gaussian")  # fmt: skip
        model = get_peft_model(base, config)
        folders[size] = out / f"template-{size}mb"
        save_adapter_version(model, folders[size])
        base = model.unload()
    return folders


def version_folder(template: Path, version: int, out: Path) -> Path:
    """The template with new weights (scaled by the version), as a learner's publish would."""
    from safetensors.torch import load_file, save_file

    folder = out / f"v{version:06d}"
    folder.mkdir(parents=True)
    tensors = load_file(str(template / "adapter_model.safetensors"))
    scale = 1.0 + 1e-3 * version
    save_file({k: v * scale for k, v in tensors.items()}, str(folder / "adapter_model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    shutil.copyfile(template / "adapter_config.json", folder / "adapter_config.json")
    return folder


@dataclass
class Published:
    version: int
    size_mb: int
    bytes: int
    t_start: float  # epoch seconds: uploads begin
    t_ack: float  # publish_adapter answered
    upload_s: float


class Publisher:
    """Attach as the run's learner; publish versions through the real learner calls."""

    def __init__(self, url: str, run_id: str, token: str, work: Path) -> None:
        from learner.loop import Heartbeat
        from lm.chat import tokenizer_fingerprint
        from lm.models import load_tokenizer

        self.client = AsyncGrpoClient(url, token)
        self.run_id, self.work = run_id, work
        fingerprint = tokenizer_fingerprint(load_tokenizer(MODEL))
        attach = self.client.learner_attach(run_id, fingerprint, name="bench-publisher")
        self.fencing, self.version = attach.fencing, attach.current_version
        self.heartbeat = Heartbeat(
            AsyncGrpoClient(url, token), run_id, self.fencing, attach.heartbeat_interval_s
        )
        self.heartbeat.start()
        self.claimed: list[Any] = []

    def claim(self) -> None:
        answer = self.client.claim_batches(self.run_id, self.fencing, 1000, wait_s=0.0)
        self.claimed += [b.batch_id for b in answer.batches]

    def publish(self, folder: Path, size_mb: int) -> Published:
        from learner.publisher import upload_files
        from learner.transfers import Retrier

        version = self.version + 1
        # the resume checkpoint a publish requires: here only the step (a real learner also
        # uploads optimizer state, about twice the adapter, before publishing)
        checkpoint = folder.parent / f"{folder.name}-checkpoint"
        checkpoint.mkdir()
        (checkpoint / "state.json").write_text(f'{{"step": {version}}}')
        files = [(p, "adapter") for p in sorted(folder.iterdir())]
        files.append((checkpoint / "state.json", "checkpoint"))
        t_start = time.time()
        published = upload_files(
            Retrier(lambda: None), self.client, (self.run_id, self.fencing, version), files
        )
        upload_s = time.time() - t_start
        self.claim()
        self.client.publish_adapter(
            self.run_id,
            sl.PublishRequest(
                fencing=self.fencing,
                version=version,
                files=published["adapter"],
                checkpoint_files=published["checkpoint"],
                learner_step=version,
                metrics={},
                consumed_batch_ids=self.claimed,
                final=False,
            ),
        )
        t_ack = time.time()
        self.version, self.claimed = version, []
        weights = (folder / "adapter_model.safetensors").stat().st_size
        return Published(version, size_mb, weights, t_start, t_ack, upload_s)

    def close(self) -> None:
        self.heartbeat.stopped.set()
        self.client.close()


# -- the raw-SQL floor: the lease engine's own Postgres statements for one lease cycle (acquire →
# heartbeat → upload → complete) straight through psycopg's async driver, autocommitted: no
# HTTP, no FastAPI, no thread hop, no SQLAlchemy at run time (bench/leases.py, bench/fleet.py).
# They are the same `units.Statement`s the engine runs.

RawConn = AsyncConnection[Any]


def _raw_statement(name: str) -> Any:
    from server.leases import fenced, statements
    from server.wiring import wire

    wire()  # every work kind registered, as the server does

    return {
        "grant": statements._GRANT,  # noqa: SLF001 - the engine's own units
        "beat": fenced._beat(),  # noqa: SLF001
        "upload": fenced._UPLOADING,  # noqa: SLF001
        "accept": statements._ACCEPT,  # noqa: SLF001
    }[name]


async def _raw_fetch(conn: RawConn, name: str, params: dict[str, Any]) -> list[Any]:
    statement = _raw_statement(name)
    cursor = await conn.execute(statement.postgres, {**statement.constants, **params})
    return await cursor.fetchall()


async def raw_grant(conn: RawConn, params: dict[str, Any]) -> int | None:
    """The one-statement grant (server/leases/queue.py); the lease's fencing token, or None."""
    rows = await _raw_fetch(conn, "grant", params)
    return int(rows[0][4]) if rows else None  # the `fencing` column


async def raw_extend(conn: RawConn, digest: str, lease_id: uuid.UUID, fencing: int) -> bool:
    """The heartbeat's one statement (server/leases/statements.py), admission control off."""
    params = {"digest": digest, "lease_id": lease_id, "held_fencing": fencing, "ttl_s": 60.0,
              "admission": False, "max_staleness": 0}  # fmt: skip
    rows = await _raw_fetch(conn, "beat", params)
    return bool(rows and rows[0][-1])


async def raw_mark_uploading(conn: RawConn, digest: str, lease_id: uuid.UUID, fencing: int) -> bool:
    params = {"digest": digest, "lease_id": lease_id, "held_fencing": fencing}
    return bool(await _raw_fetch(conn, "upload", params))


async def raw_accept(
    conn: RawConn, digest: str, lease_id: uuid.UUID, fencing: int, batch: dict[str, Any]
) -> bool:
    """complete's accept in one statement (server/leases/statements.py)."""
    params = {
        **batch,
        "manifest": Jsonb(batch["manifest"]),
        "batch_id": uuid.uuid4(),
        "lease_id": lease_id,
        "digest": digest,
        "held_fencing": fencing,
    }
    return bool(await _raw_fetch(conn, "accept", params))
