"""Heartbeats beside generation: a thread per lease that extends it and watches for its end.

The thread heartbeats every `interval` seconds. It sets `cancel` (the event generation watches)
when the server answers `abort: true` (the server has already re-queued the prompts), when a
fenced call answers 409 or 404 (the lease is lost), or when the lease's time runs out without
a successful heartbeat (server unreachable for a whole TTL). Transient failures are retried at
the next beat; they never raise out of the thread.
"""

from __future__ import annotations

import logging
import threading
import time

import httpx

from protocol.client import ApiError, AsyncGrpoClient, ConflictError, NotFoundError
from protocol.schemas import Lease

log = logging.getLogger(__name__)


class Heartbeat:
    """Keeps one lease alive until `stop()`; `lost_reason` says why it ended early."""

    def __init__(
        self,
        client: AsyncGrpoClient,
        lease: Lease,
        *,
        interval_s: float,
        ttl_s: float,
        cancel: threading.Event,
    ) -> None:
        self.client = client
        self.lease = lease
        self.lease_id = lease.lease_id
        self.interval_s = max(0.05, interval_s)
        self.ttl_s = ttl_s
        self.cancel = cancel
        self.lost_reason: str | None = None
        self.current_version: int | None = None
        self._stop = threading.Event()
        self._deadline = time.monotonic() + ttl_s
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{lease.lease_id}", daemon=True
        )

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
            log.warning("lease %s ended: %s", self.lease_id, reason)
        self.cancel.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()
            if self.lost_reason is not None:
                return

    def beat(self) -> None:
        """One heartbeat; transient failures are logged and retried at the next beat."""
        try:
            answer = self.client.heartbeat_lease(self.lease)
        except (ConflictError, NotFoundError) as exc:
            self._lose(f"lost ({exc.status_code})")
            return
        except (ApiError, httpx.HTTPError) as exc:
            log.warning("heartbeat of lease %s failed: %r", self.lease_id, exc)
            if time.monotonic() > self._deadline:
                self._lose("expired (no heartbeat within the TTL)")
            return
        self.current_version = answer.current_version
        if answer.abort:
            self._lose(f"aborted ({answer.reason})")
            return
        self._deadline = time.monotonic() + answer.ttl_s
