"""The embedded default's scheduler: the same job functions as the Celery tasks
(server/jobs/runner.py), each on its own daemon thread inside the server process, started and
stopped by the app's lifespan when settings.jobs.mode == "inprocess"."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session, sessionmaker

from protocol.storage import ObjectStore
from server.config import Settings
from server.jobs.runner import JOBS, JobContext, intervals, run_job

log = logging.getLogger("asyncgrpo.jobs.inprocess")


class InProcessScheduler:
    """Runs every job at its period; a follow-up request wakes that job's thread at once."""

    def __init__(
        self, settings: Settings, factory: sessionmaker[Session], store: ObjectStore
    ) -> None:
        self._stop = threading.Event()
        self._wake = {job: threading.Event() for job in JOBS}
        self._periods = intervals(settings)
        self._threads: list[threading.Thread] = []
        self.runs: dict[str, int] = dict.fromkeys(JOBS, 0)
        self.context = JobContext(
            settings=settings,
            factory=factory,
            store_factory=lambda: store,
            follow_up=self.wake,
        )

    def wake(self, job: str) -> None:
        self._wake[job].set()

    def start(self) -> None:
        for job in JOBS:
            thread = threading.Thread(
                target=self._loop, args=(job,), name=f"asyncgrpo-job-{job}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        for event in self._wake.values():
            event.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads.clear()

    def _loop(self, job: str) -> None:
        period = self._periods[job]
        while not self._stop.is_set():
            # The first run waits one period, so the server starts quietly.
            self._wake[job].wait(period)
            self._wake[job].clear()
            if self._stop.is_set():
                return
            try:
                run_job(job, self.context)
            except Exception:  # a failed pass must not end the scheduler; the next one retries
                log.exception("in-process job %s failed", job)
            self.runs[job] += 1


def start_if_inprocess(
    settings: Settings, factory: sessionmaker[Session], store: ObjectStore
) -> InProcessScheduler | None:
    """Start the scheduler in the embedded mode (jobs.mode == "inprocess"); None otherwise."""
    if settings.jobs.mode != "inprocess":
        return None
    scheduler = InProcessScheduler(settings, factory, store)
    scheduler.start()
    return scheduler
