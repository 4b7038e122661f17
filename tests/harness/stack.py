"""Live stacks on asyncgrpo.cluster.Cluster: the server as a uvicorn process on Postgres or
embedded SQLite, the bucket a folder or S3 (moto: in the test process, behind a proxy a test
can cut, or in its own process), the learner and workers as processes. `cluster_config` is the
one place their settings are put together; `LiveServer` is a cluster's server with SQL on its
database; `E2E` adds the end-to-end tests' views of a whole cluster."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from asyncgrpo.cluster import Cluster, ClusterConfig, ManagedProcess, free_port
from asyncgrpo.cluster import worker_process as worker_process  # a worker beside a stack
from tests.e2e.tcp_proxy import TcpProxy
from tests.harness.s3 import S3Endpoint

# Short long-polls and back-offs, so that nothing a test or benchmark waits for is made of
# waits the settings chose.
FAST_SERVER_ENV = {
    "ASYNCGRPO_JOBS__MODE": "inprocess",
    "ASYNCGRPO_JOBS__SWEEP_INTERVAL_S": "1",
    "ASYNCGRPO_LEASE_LONG_POLL_S": "1",
    "ASYNCGRPO_LEARNER_LEASE_TTL_S": "60",
}
FAST_WORKER_ENV = {
    "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "1",
    "ASYNCGRPO_WORKER_IDLE_BACKOFF_MIN_S": "0.2",
    "ASYNCGRPO_WORKER_IDLE_BACKOFF_MAX_S": "1",
    "ASYNCGRPO_WORKER_RETRY_MAX_S": "2",
    "ASYNCGRPO_WORKER_HTTP_TIMEOUT_S": "30",
}
FAST_LEARNER_ENV = {
    "ASYNCGRPO_LEARNER_CLAIM_WAIT_S": "1",
    "ASYNCGRPO_LEARNER_STANDBY_RETRY_S": "1",
}


@dataclass(frozen=True)
class S3Bucket:
    """A bucket on an S3 endpoint (path-style, static keys), as the cluster reaches it."""

    endpoint: S3Endpoint
    bucket: str

    def settings(self) -> dict[str, str]:
        """The server's ASYNCGRPO_S3__* settings (ClusterConfig.s3)."""
        return {
            "endpoint_url": self.endpoint.url,
            "path_style": "true",
            "region": self.endpoint.region,
            "access_key_id": self.endpoint.access_key_id,
            "secret_access_key": self.endpoint.secret_access_key,
        }


def cluster_config(
    work_dir: Path,
    *,
    database_url: str | None = None,
    bucket: Path | S3Bucket | None = None,
    server_env: Mapping[str, str] | None = None,
    worker_env: Mapping[str, str] | None = None,
    learner_env: Mapping[str, str] | None = None,
    **config: Any,
) -> ClusterConfig:
    """A cluster in `work_dir`: the server on `database_url` (None: embedded SQLite there), the
    bucket a folder, an S3 bucket or (None) a folder there; the env mappings as given (the
    FAST_* ones are for the caller to spread); the rest of ClusterConfig's fields in `config`."""
    s3 = bucket.settings() if isinstance(bucket, S3Bucket) else {}
    if isinstance(bucket, S3Bucket):
        bucket_url: str | None = f"s3://{bucket.bucket}"
    else:
        bucket_url = None if bucket is None else str(bucket)
    return ClusterConfig(
        work_dir=work_dir,
        database_url=database_url,
        bucket_url=bucket_url,
        s3=s3,
        server_env=dict(server_env or {}),
        worker_env=dict(worker_env or {}),
        learner_env=dict(learner_env or {}),
        **config,
    )


def sql(database_url: str, statement: str, **params: Any) -> list[Any]:
    """One statement in its own transaction; the rows, if it returns any."""
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


class LiveServer:
    """The server process of a cluster (started by `start`, restartable), SQL on its
    database, its admin token."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    @property
    def url(self) -> str:
        return self.cluster.url

    @property
    def database_url(self) -> str:
        return self.cluster.database_url

    @property
    def bucket(self) -> Path:
        return Path(self.cluster.bucket_location)

    @property
    def admin_token(self) -> str:
        assert self.cluster.admin_token is not None, "start the server first"
        return self.cluster.admin_token

    def start(self, timeout_s: float = 60.0) -> None:
        self.cluster.start_server(timeout_s)

    def stop(self) -> None:
        if self.cluster.server is not None:
            self.cluster.server.stop()

    def sql(self, statement: str, **params: Any) -> list[Any]:
        return sql(self.database_url, statement, **params)


def wait_workers_ready(cluster: Cluster, names: Sequence[str], timeout_s: float = 600) -> None:
    """Until each worker's log says its backend is loaded (within `timeout_s` for all)."""
    deadline = time.monotonic() + timeout_s
    for name in names:
        cluster.wait_worker_ready(name, max(0.0, deadline - time.monotonic()))


def wait_run_finished(cluster: Cluster, run_id: str, timeout_s: float) -> str:
    """Poll the run's status until it leaves pending/running (or the learner dies)."""
    assert cluster.admin is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = str(cluster.admin.get_run(run_id)["status"])
        if status not in ("pending", "running"):
            return status
        if cluster.learner is not None and not cluster.learner.alive():
            raise RuntimeError("learner exited:\n" + cluster.learner.log_text()[-3000:])
        time.sleep(1.0)
    raise TimeoutError(f"run {run_id} not finished after {timeout_s}s")


@dataclass(frozen=True)
class MotoProcess:
    bucket: S3Bucket  # a fresh one
    pid: int


@contextmanager
def moto_process(work: Path, keys: tuple[str, str]) -> Iterator[MotoProcess]:
    """moto's S3 server in a process of its own (`python -m moto.server`, so that it can be
    pinned to a core) with one fresh bucket."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    (work / "logs").mkdir(parents=True, exist_ok=True)
    proc = ManagedProcess("moto", argv, dict(os.environ), work, work / "logs" / "moto.log").start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/moto-api/", timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or not proc.alive():
                    raise RuntimeError("moto server did not start:\n" + proc.log_text()) from None
                time.sleep(0.2)
        endpoint = S3Endpoint(url, access_key_id=keys[0], secret_access_key=keys[1])
        bucket = S3Bucket(endpoint, f"bench-{uuid.uuid4().hex[:12]}")
        endpoint.client().create_bucket(Bucket=bucket.bucket)
        yield MotoProcess(bucket, proc.pid)
    finally:
        proc.stop(grace_s=5)


@contextmanager
def migrated_database(admin_url: str, prefix: str = "agr_bench") -> Iterator[str]:
    """A fresh Postgres database (next to `admin_url`'s) migrated to head, dropped afterwards."""
    from server.db import make_engine
    from server.migrate import upgrade

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class E2E:
    """A cluster on Postgres and an S3 bucket behind a proxy, and the end-to-end tests' views
    of it: SQL on its database, the bucket's keys (read from moto past the proxy), the
    processes' logs."""

    def __init__(self, cluster: Cluster, proxy: TcpProxy, s3: S3Endpoint, bucket: str) -> None:
        self.cluster, self.proxy, self.s3, self.bucket = cluster, proxy, s3, bucket
        assert cluster.config.database_url is not None
        self.engine = create_engine(cluster.config.database_url)

    @property
    def run_id(self) -> uuid.UUID:
        assert self.cluster.run_id is not None
        return uuid.UUID(self.cluster.run_id)

    def sql(self, statement: str, **params: Any) -> list[Any]:
        with self.engine.begin() as conn:
            result = conn.execute(text(statement), {"run": self.run_id, **params})
            return list(result) if result.returns_rows else []

    def version(self) -> int:
        return int(self.sql("SELECT current_version FROM runs WHERE id = :run")[0][0])

    def status(self) -> str:
        return str(self.sql("SELECT status FROM runs WHERE id = :run")[0][0])

    def active_lease(self, worker: str) -> uuid.UUID | None:
        rows = self.sql(
            "SELECT l.id FROM leases l JOIN workers w ON w.id = l.worker_id "
            "WHERE l.run_id = :run AND w.name = :name AND l.state = 'active'",
            name=worker,
        )
        return rows[0][0] if rows else None

    def lease_state(self, lease_id: uuid.UUID) -> str:
        return str(self.sql("SELECT state FROM leases WHERE id = :id", id=lease_id)[0][0])

    def bucket_keys(self) -> set[str]:
        pages = self.s3.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return {o["Key"] for page in pages for o in page.get("Contents", [])}

    def logs(self, lines: int = 40) -> str:
        """Each process's last lines, and its last traceback when the tail does not hold it (a
        500 among a server's access lines is otherwise out of sight)."""
        out = []
        for proc in self.cluster.processes():
            text = proc.log_text().splitlines()
            tail = text[-lines:]
            out.append(f"--- {proc.name} (rc={proc.returncode()}) ---\n" + "\n".join(tail))
            starts = [i for i, line in enumerate(text) if line.startswith("Traceback (most")]
            if starts and starts[-1] < len(text) - lines:
                block = "\n".join(text[starts[-1] : starts[-1] + lines])
                out.append(f"--- {proc.name}: its last traceback ---\n{block}")
        return "\n".join(out)

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{self.logs()}")

    def assert_balanced(self) -> dict[str, Any]:
        """Invariant 12 through the API, and the rows behind it through SQL."""
        assert self.cluster.admin is not None
        ledger = self.cluster.admin.run_ledger(str(self.run_id))
        assert ledger["balanced"], ledger
        assert ledger["consumed_without_version"] == 0, ledger
        assert all(e["closed"] for e in ledger["epochs"]), ledger
        assert "unknown" not in ledger["dropped_by_reason"], ledger
        # nothing accepted is left behind or lost
        open_batches = self.sql(
            "SELECT count(*) FROM rollout_batches WHERE run_id = :run "
            "AND state IN ('accepted', 'claimed')"
        )[0][0]
        assert open_batches == 0
        # each consumed prompt row went into exactly the version its batch went into
        mismatched = self.sql(
            "SELECT count(*) FROM prompt_rows p JOIN rollout_batches b ON b.id = p.batch_id "
            "WHERE p.run_id = :run AND p.state = 'consumed' AND "
            "(b.state <> 'consumed' OR b.consumed_version IS DISTINCT FROM p.consumed_version)"
        )[0][0]
        assert mismatched == 0
        versions = [r[0] for r in self.sql(
            "SELECT version FROM adapter_versions WHERE run_id = :run ORDER BY version"
        )]  # fmt: skip
        assert versions == list(range(1, len(versions) + 1)), versions
        return ledger
