"""The harness's pytest fixtures. A conftest registers those its tests use by importing them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from asyncgrpo.cluster import Cluster
from tests.conftest import TEST_SECRET
from tests.e2e.tcp_proxy import TcpProxy
from tests.harness.live_app import LiveApp, live_app
from tests.harness.stack import (
    E2E,
    FAST_LEARNER_ENV,
    FAST_SERVER_ENV,
    FAST_WORKER_ENV,
    LiveServer,
    S3Bucket,
    cluster_config,
)
from tests.s3_fixtures import S3Endpoint


@pytest.fixture
def live(pg_url: str, tmp_path: Path) -> Iterator[LiveApp]:
    """The app served on Postgres and a bucket folder, with a 3 s learner lease."""
    with live_app(pg_url, tmp_path, learner_lease_ttl_s=3.0, long_poll_s=1.0) as served:
        yield served


@pytest.fixture
def proxy(bucket_proxy: TcpProxy) -> TcpProxy:
    """moto behind a TCP proxy a test can cut (tests/s3_fixtures.py), by the learner tests'
    name."""
    return bucket_proxy


@pytest.fixture
def live_s3(
    pg_url: str, tmp_path: Path, proxy: TcpProxy, moto_endpoint: S3Endpoint, s3_bucket: str
) -> Iterator[LiveApp]:
    """The app served on Postgres and an S3 bucket reached through `proxy`, with a 30 s
    learner lease."""
    s3 = (proxy, moto_endpoint, s3_bucket)
    with live_app(pg_url, tmp_path, s3=s3, learner_lease_ttl_s=30.0, long_poll_s=1.0) as served:
        yield served


# The end-to-end cluster: the FAST settings with a sweep every 0.5 s, a 10 s learner lease and
# workers that give a call 10 s.
E2E_SERVER_ENV = {
    **FAST_SERVER_ENV,
    "ASYNCGRPO_JOBS__SWEEP_INTERVAL_S": "0.5",
    "ASYNCGRPO_LEARNER_LEASE_TTL_S": "10.0",
}
E2E_WORKER_ENV = {
    **FAST_WORKER_ENV,
    "ASYNCGRPO_WORKER_HTTP_TIMEOUT_S": "10",
    # One lease at a time (2 prompts x G 4): a tiny run must outlast the start of every
    # worker, or the first worker up does the whole run alone before the faults begin.
    "ASYNCGRPO_WORKER_MAX_INFLIGHT_SEQUENCES": "8",
}


@pytest.fixture
def e2e(
    tmp_path: Path,
    pg_url: str,
    moto_endpoint: S3Endpoint,
    s3_bucket: str,
    bucket_proxy: TcpProxy,
    small_model_dir: str,  # converts the model once per session, before any process starts
) -> Iterator[E2E]:
    """A cluster (not started) on a fresh Postgres database, its bucket on moto behind a proxy
    a test can cut; the small model."""
    config = cluster_config(
        tmp_path / "cluster",
        database_url=pg_url,
        bucket=S3Bucket(replace(moto_endpoint, url=bucket_proxy.url), s3_bucket),
        secret_key=TEST_SECRET,
        server_env=E2E_SERVER_ENV,
        worker_env=E2E_WORKER_ENV,
        learner_env=FAST_LEARNER_ENV,
        server_log_level="info",  # access lines show the status of every late call
    )
    cluster = Cluster(config)
    env = E2E(cluster, bucket_proxy, moto_endpoint, s3_bucket)
    try:
        yield env
    finally:
        cluster.stop(grace_s=8.0)
        env.engine.dispose()


# The worker tests' server: half-second long polls and sweeps, and a learner lease that
# outlasts the test (the test's scripted learner does not heartbeat).
WORKER_SERVER_ENV = {
    **FAST_SERVER_ENV,
    "ASYNCGRPO_JOBS__SWEEP_INTERVAL_S": "0.5",
    "ASYNCGRPO_LEASE_LONG_POLL_S": "0.5",
    "ASYNCGRPO_LEARNER_LEASE_TTL_S": "3600",
}


@pytest.fixture
def server(pg_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    """The server process (started) on a fresh Postgres database and a bucket folder."""
    config = cluster_config(
        tmp_path / "cluster",
        database_url=pg_url,
        bucket=tmp_path / "bucket",
        secret_key=TEST_SECRET,
        server_env=WORKER_SERVER_ENV,
    )
    cluster = Cluster(config)
    live = LiveServer(cluster)
    try:
        live.start()
        yield live
    finally:
        cluster.stop()
