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

from learner import publisher
from learner.transfers import Retrier

log = logging.getLogger("tests.hold_publish")


def _hold_from(version: int) -> None:
    upload = publisher.upload_files
    held: list[int] = []

    def hold(retrier: Retrier, client: Any, of: tuple[str, int, int], files: Any) -> Any:
        number = of[2]
        if held or number < version:
            return upload(retrier, client, of, files)
        held.append(number)
        log.info("test hold: publish of version %d uploading", number)
        try:
            while True:
                retrier.alive()
                time.sleep(0.1)
        except BaseException as exc:
            log.info("test hold: publish of version %d stopped (%r)", number, exc)
            raise

    publisher.upload_files = hold


if __name__ == "__main__":
    _hold_from(int(sys.argv[1]))
    from asyncgrpo.cli import app

    sys.argv = ["asyncgrpo", "learner", *sys.argv[2:]]
    app()
