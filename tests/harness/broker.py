"""The Redis broker of the Celery tests: one Redis database per pytest-xdist worker (1–15), so
workers running side by side never read each other's queues; 1 + pid % 15 without xdist."""

from __future__ import annotations

import os

REDIS_HOST = "redis://127.0.0.1:6379"


def redis_db() -> int:
    """The Redis database number of this test process."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return 1 + int(worker[2:]) % 15
    return 1 + os.getpid() % 15


def broker_url() -> str:
    return f"{REDIS_HOST}/{redis_db()}"
