"""The control plane served in the test process (the app of create_app, uvicorn in a thread on a
free port, on Postgres or SQLite, the bucket a folder or S3 behind a proxy), so that a test
arranges rows through the app's sessionmaker and store; learner processes against it start
through asyncgrpo.cluster.Cluster."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncgrpo.cluster import Cluster, ClusterConfig, ManagedProcess, process_env
from tests.conftest import make_settings
from tests.e2e.tcp_proxy import TcpProxy
from tests.harness.serve import serve_in_thread
from tests.s3_fixtures import S3Endpoint, free_port

# A learner that retries a standby attach and a claim within a second.
QUICK_LEARNER = {
    "ASYNCGRPO_LEARNER_STANDBY_RETRY_S": "0.5",
    "ASYNCGRPO_LEARNER_CLAIM_WAIT_S": "1",
}


def proxied_settings(
    database_url: str,
    tmp: Path,
    proxy: TcpProxy,
    s3: S3Endpoint,
    bucket: str,
    **overrides: Any,
) -> Any:
    """make_settings with the bucket on S3, reached only through `proxy` (the control plane's
    own store calls and every presigned URL), so a test can cut it."""
    from server.config import S3Settings

    settings = make_settings(database_url, tmp / "unused-bucket", **overrides)
    s3_settings = S3Settings(
        endpoint_url=proxy.url,
        path_style=True,
        region=s3.region,
        access_key_id=s3.access_key_id,
        secret_access_key=s3.secret_access_key,
    )
    return settings.model_copy(update={"bucket_url": f"s3://{bucket}", "s3": s3_settings})


@dataclass
class LiveApp:
    """The served app: its base URL, the app (sessionmaker, store), its bucket folder (None
    on S3), and a Cluster pointed at it that starts learner processes."""

    base: str
    app: Any
    bucket: Path | None
    cluster: Cluster
    started: list[ManagedProcess] = field(default_factory=list)

    @property
    def learner_log(self) -> Path:
        """Where every learner of this app logs, one after the other."""
        return self.cluster.dir / "logs" / "learner.log"

    def learner(
        self,
        run: Any,
        settings: Mapping[str, str] | None = None,
        *,
        hold_publish_from: int | None = None,
        command: Sequence[str] | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """`asyncgrpo learner` on `run` (a RunHandle: id and learner token), in this app's one
        learner work dir; `settings` are extra ASYNCGRPO_LEARNER_* values; `hold_publish_from`:
        its first upload of that version or later hangs (tests/learner/hold_publish.py);
        `command`, `args` and `env` as Cluster.start_learner takes them."""
        if hold_publish_from is not None:
            command = [sys.executable, "-m", "tests.learner.hold_publish", str(hold_publish_from)]
        self.cluster.run_id, self.cluster.learner_token = str(run.id), run.token
        extra = {f"ASYNCGRPO_LEARNER_{k}": v for k, v in (settings or {}).items()}
        proc = self.cluster.start_learner(command, args, {**extra, **(env or {})})
        self.started.append(proc)
        assert proc.proc is not None
        return proc.proc

    @property
    def pool_learner_log(self) -> Path:
        """Where every pool learner of this app logs, one after the other."""
        return self.cluster.dir / "logs" / "pool-learner.log"

    def pool_learner(
        self, args: Sequence[str], entry: Sequence[str] = ("asyncgrpo.cli", "learner")
    ) -> subprocess.Popen[bytes]:
        """`asyncgrpo learner` without --run (a pool learner, docs/guides/pool-learners.md) in
        this app's pool learner work dir, with `args` (--registration-token, …); `entry` the
        module run with `-m` and its first arguments (a test's wrapper of the command)."""
        c = self.cluster
        argv = [
            sys.executable, "-m", *entry, "--server", c.url,
            "--model", c.config.model, "--threads", str(c.config.threads),
            "--work-dir", str(c.dir / "pool-learner"), *args,
        ]  # fmt: skip
        env = process_env(c.config.learner_env)
        proc = ManagedProcess("pool-learner", argv, env, c.dir, self.pool_learner_log).start()
        self.started.append(proc)
        assert proc.proc is not None
        return proc.proc

    def stop(self) -> None:
        for proc in self.started:
            proc.stop(grace_s=5)


@contextmanager
def live_app(
    database_url: str,
    tmp: Path,
    *,
    s3: tuple[TcpProxy, S3Endpoint, str] | None = None,
    long_poll_s: float | None = None,
    **settings: Any,
) -> Iterator[LiveApp]:
    """The app on `database_url` (migrated), served on a free port for the test's duration;
    `settings` as make_settings takes them; the bucket `tmp`/bucket, or with `s3` (proxy,
    endpoint, bucket name) proxied_settings'; `long_poll_s` the lease long-poll (make_settings:
    none)."""
    from server.app import create_app

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    bucket = None if s3 else tmp / "bucket"
    if s3 is None:
        made = make_settings(database_url, tmp / "bucket", **settings)
    else:
        made = proxied_settings(database_url, tmp, *s3, **settings)
    update: dict[str, Any] = {"public_url": base}
    if long_poll_s is not None:
        update["lease_long_poll_s"] = long_poll_s
    app = create_app(made.model_copy(update=update), migrate=True)
    config = ClusterConfig(work_dir=tmp / "cluster", port=port, learner_env=dict(QUICK_LEARNER))
    live = LiveApp(base, app, bucket, Cluster(config))
    with serve_in_thread(app, port):
        try:
            yield live
        finally:
            live.stop()


def wait_version(app: Any, run_id: uuid.UUID, version: int, proc: Any, log: Path) -> None:
    """Until the run's current version reaches `version`, while the learner runs."""
    from server.db import transaction
    from server.models import Run

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        with transaction(app.state.sessionmaker) as session:
            run = session.get(Run, run_id)
            assert run is not None
            if run.current_version >= version:
                return
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"no version {version}:\n{log.read_text()[-3000:]}")


def wait_log(log: Path, needle: str, proc: Any, timeout_s: float = 240) -> None:
    """Wait for `needle` (a regular expression) in the process's log while it runs."""
    deadline = time.monotonic() + timeout_s
    while not re.search(needle, log.read_text(errors="replace")):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {needle!r} in:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
