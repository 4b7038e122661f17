"""Thin Celery wrappers around server/jobs/runner.py: one task per job, named
`asyncgrpo.jobs.<job>`. Follow-up tasks are sent only after the job's transaction committed.
Tasks decide nothing about lease ownership: Postgres does, through the job functions'
compare-and-set statements."""

from __future__ import annotations

from typing import Any

from celery import Task

from server.jobs.celery_app import app
from server.jobs.runner import JOBS, JobContext, run_job
from server.jobs.schedule import task_name
from server.wiring import wire

_context: JobContext | None = None


def context() -> JobContext:
    """This process's JobContext, built on first use (after a prefork worker has forked)."""
    global _context
    if _context is None:
        wire()
        from server.config import get_settings
        from server.db import make_engine, make_sessionmaker
        from server.storage_factory import make_store

        settings = get_settings()
        engine = make_engine(settings.database_url, pool_size=2, max_overflow=2)
        _context = JobContext(
            settings=settings,
            factory=make_sessionmaker(engine),
            store_factory=lambda: make_store(settings),
            follow_up=lambda job: TASKS[job].delay(),
        )
    return _context


def _make_task(job: str) -> Task:
    def task() -> Any:
        return run_job(job, context())

    task.__name__ = f"{job}_task"
    task.__doc__ = f"Run the `{job}` job once."
    registered: Task = app.task(name=task_name(job))(task)
    return registered


TASKS: dict[str, Task] = {job: _make_task(job) for job in JOBS}


__all__: list[str] = ["TASKS", "context"]
