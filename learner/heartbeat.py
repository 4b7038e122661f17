"""The learner lease's heartbeat (docs/architecture/learner.md, "The learner"), on its own
thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from protocol.client import ApiError, AsyncGrpoClient
from protocol.error_codes import ErrorCode

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Keeps the learner lease; sets `lost` on a 409 (and on a pool learner's 403
    `run_not_held`: the run is no longer its own). `gate()` (data-parallel: the step
    watchdog) returns why not to beat, or None: while it answers, no beat is sent, so a
    step stuck in a collective lets the lease lapse."""

    def __init__(
        self,
        client: AsyncGrpoClient,
        run_id: str,
        fencing: int,
        interval: float,
        gate: Callable[[], str | None] | None = None,
    ):
        super().__init__(daemon=True, name="learner-heartbeat")
        self.client, self.run_id, self.fencing, self.interval = client, run_id, fencing, interval
        self.gate = gate
        self.lost = threading.Event()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            withheld = self.gate() if self.gate is not None else None
            if withheld is not None:
                log.error("withholding the learner heartbeat: %s", withheld)
                continue
            try:
                self.client.learner_heartbeat(self.run_id, self.fencing)
            except ApiError as exc:
                if exc.lease_lost or exc.code == ErrorCode.run_not_held:
                    self.lost.set()
                    return
                log.warning("learner heartbeat failed: %s", exc)
            except Exception:  # transient: the next beat retries; the lease TTL decides
                log.warning("learner heartbeat failed", exc_info=True)
