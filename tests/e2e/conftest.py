"""End-to-end fixtures: a real cluster (uvicorn server on a fresh Postgres database with the
jobs in-process, moto S3 behind a TCP proxy that a test can cut, the learner and workers as
subprocesses with the small model, one torch thread each)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from asyncgrpo.cluster import Cluster, ClusterConfig
from tests.conftest import TEST_SECRET
from tests.e2e.tcp_proxy import TcpProxy
from tests.s3_fixtures import S3Endpoint

LEASE_TTL_S = 5.0
LEARNER_LEASE_TTL_S = 10.0


class E2E:
    """A cluster plus the test's views of it: SQL on its database, the bucket proxy."""

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
        out = []
        for proc in self.cluster.processes():
            tail = "\n".join(proc.log_text().splitlines()[-lines:])
            out.append(f"--- {proc.name} (rc={proc.returncode()}) ---\n{tail}")
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


@pytest.fixture
def e2e(
    tmp_path: Path,
    pg_url: str,
    moto_endpoint: S3Endpoint,
    s3_bucket: str,
    bucket_proxy: TcpProxy,
    small_model_dir: str,  # converts the model once per session, before any process starts
) -> Iterator[E2E]:
    config = ClusterConfig(
        work_dir=tmp_path / "cluster",
        database_url=pg_url,
        bucket_url=f"s3://{s3_bucket}",
        s3={
            "endpoint_url": bucket_proxy.url,
            "path_style": "true",
            "region": moto_endpoint.region,
            "access_key_id": moto_endpoint.access_key_id,
            "secret_access_key": moto_endpoint.secret_access_key,
        },
        secret_key=TEST_SECRET,
        server_env={
            "ASYNCGRPO_JOBS__MODE": "inprocess",
            "ASYNCGRPO_JOBS__SWEEP_INTERVAL_S": "0.5",
            "ASYNCGRPO_LEASE_LONG_POLL_S": "1",
            "ASYNCGRPO_LEARNER_LEASE_TTL_S": str(LEARNER_LEASE_TTL_S),
        },
        worker_env={
            "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "1",
            "ASYNCGRPO_WORKER_IDLE_BACKOFF_MIN_S": "0.2",
            "ASYNCGRPO_WORKER_IDLE_BACKOFF_MAX_S": "1",
            "ASYNCGRPO_WORKER_RETRY_MAX_S": "2",
            "ASYNCGRPO_WORKER_HTTP_TIMEOUT_S": "10",
            # One lease at a time (2 prompts x G 4): a tiny run must outlast the start of every
            # worker, or the first worker up does the whole run alone before the faults begin.
            "ASYNCGRPO_WORKER_MAX_INFLIGHT_SEQUENCES": "8",
        },
        learner_env={
            "ASYNCGRPO_LEARNER_CLAIM_WAIT_S": "1",
            "ASYNCGRPO_LEARNER_STANDBY_RETRY_S": "1",
        },
        server_log_level="info",  # access lines show the status of every late call
    )
    cluster = Cluster(config)
    env = E2E(cluster, bucket_proxy, moto_endpoint, s3_bucket)
    try:
        yield env
    finally:
        cluster.stop(grace_s=8.0)
        env.engine.dispose()
