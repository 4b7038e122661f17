"""The Celery beat schedule: every job of server/jobs/runner.py at its configured period."""

from __future__ import annotations

from typing import Any

from server.config import Settings
from server.jobs.runner import JOBS, intervals

TASK_PREFIX = "asyncgrpo.jobs."


def task_name(job: str) -> str:
    return TASK_PREFIX + job


def beat_schedule(settings: Settings) -> dict[str, Any]:
    """One entry per job; a tick that waited longer than its period is dropped (the next one
    does the same work: every job is idempotent)."""
    periods = intervals(settings)
    return {
        job: {
            "task": task_name(job),
            "schedule": periods[job],
            "options": {"expires": max(periods[job], 1.0)},
        }
        for job in JOBS
    }
