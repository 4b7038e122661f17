"""Shared pieces of the learner's bucket-outage tests: moto S3 behind a TCP proxy that a test
can cut and restore (tests/e2e/tcp_proxy.py), and settings whose bucket is reached only
through that proxy (the control plane's own store calls and every presigned URL)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from tests.conftest import make_settings
from tests.e2e.tcp_proxy import TcpProxy
from tests.s3_fixtures import S3Endpoint


def proxied_settings(
    pg_url: str, tmp: Path, proxy: TcpProxy, s3: S3Endpoint, bucket: str, **overrides: Any
) -> Any:
    from server.config import S3Settings

    settings = make_settings(pg_url, tmp / "unused-bucket", **overrides)
    s3_settings = S3Settings(
        endpoint_url=proxy.url,
        path_style=True,
        region=s3.region,
        access_key_id=s3.access_key_id,
        secret_access_key=s3.secret_access_key,
    )
    return settings.model_copy(update={"bucket_url": f"s3://{bucket}", "s3": s3_settings})


def wait_log(log: Path, needle: str, proc: Any, timeout_s: float = 240) -> None:
    """Wait for `needle` (a regular expression) in the process's log while it runs."""
    deadline = time.monotonic() + timeout_s
    while not re.search(needle, log.read_text(errors="replace")):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {needle!r} in:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
