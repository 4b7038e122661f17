"""`asyncgrpo learner` whose upload of one version hangs, as over a stalled network, so a test
can act while a background publish is in flight (kill -9 it, take its lease away).

    python -m tests.learner.hold_publish VERSION <asyncgrpo learner arguments>

The first publish of VERSION or later, once per process, logs "test hold: publish of version N
uploading" and then, instead of uploading, checks the lease every 0.1 s as the upload loop's
retries do; when the check raises it logs "test hold: publish of version N stopped (…)" and
re-raises. The learner code is otherwise unchanged."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from learner.publisher import Publisher, PublishJob

log = logging.getLogger("tests.hold_publish")


def _hold_from(version: int) -> None:
    upload = Publisher._upload
    held: list[int] = []

    def hold(self: Publisher, job: PublishJob, files: Any) -> Any:
        if held or job.version < version:
            return upload(self, job, files)
        held.append(job.version)
        log.info("test hold: publish of version %d uploading", job.version)
        try:
            while True:
                self.retrier.alive()
                time.sleep(0.1)
        except BaseException as exc:
            log.info("test hold: publish of version %d stopped (%r)", job.version, exc)
            raise

    Publisher._upload = hold  # type: ignore[method-assign]


if __name__ == "__main__":
    _hold_from(int(sys.argv[1]))
    from asyncgrpo.cli import app

    sys.argv = ["asyncgrpo", "learner", *sys.argv[2:]]
    app()
