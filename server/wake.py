"""Ask for a job now, from a request, after its transaction has committed: the in-process
scheduler runs it at once; with Celery the beat runs it at its period (a request never talks
to the broker)."""

from __future__ import annotations

from typing import Any


def wake(app_state: Any, *jobs: str) -> None:
    scheduler = getattr(app_state, "scheduler", None)
    if scheduler is not None:
        for job in jobs:
            scheduler.wake(job)
