"""Heartbeats of every held lease in one call per interval (`POST /api/v1/leases/heartbeat`).

One thread beats all held leases together, in lists of at most 512, every `interval` seconds
(the shortest heartbeat interval among the held leases). Each lease is answered on its own: an
`abort: true` (the server has already re-queued its prompts) or a 404/409 (the lease is lost)
cancels that lease only; a lease whose TTL runs out without a successful heartbeat (server
unreachable for a whole TTL) is cancelled as expired. Transient failures are retried at the next
beat; they never raise out of the thread. Every answer's `current_version` is passed on, so the
worker learns of new adapter versions from its heartbeats too.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import httpx

from protocol.client import ApiError, AsyncGrpoClient
from protocol.schemas import LeaseBeatAnswer
from worker.held import HeldLease, HeldLeases

log = logging.getLogger(__name__)

MAX_BEATS_PER_CALL = 512  # the server's bound on one heartbeat list
IDLE_INTERVAL_S = 0.5  # how often an idle pump looks for new leases to beat


class HeartbeatPump:
    """Keeps every held lease alive until `stop()`."""

    def __init__(
        self,
        client: AsyncGrpoClient,
        held: HeldLeases,
        on_version: Callable[[uuid.UUID, int], None] = lambda _run, _version: None,
    ) -> None:
        self.client = client
        self.held = held
        self.on_version = on_version
        self.calls = 0  # heartbeat requests made (one per list of leases)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)

    def start(self) -> HeartbeatPump:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _interval(self, leases: Sequence[HeldLease]) -> float:
        if not leases:
            return IDLE_INTERVAL_S
        return max(0.05, min(h.lease.heartbeat_interval_s for h in leases))

    def _run(self) -> None:
        # A new lease is beaten within one interval of the previous beat, well inside its TTL.
        while not self._stop.wait(self._interval(self.held.snapshot())):
            leases = [h for h in self.held.snapshot() if h.lost_reason is None]
            for start in range(0, len(leases), MAX_BEATS_PER_CALL):
                self.beat(leases[start : start + MAX_BEATS_PER_CALL])

    def beat(self, leases: Sequence[HeldLease]) -> None:
        """One heartbeat call for these leases; never raises."""
        if not leases:
            return
        self.calls += 1
        sent_at = time.monotonic()  # the server extends no earlier than this
        try:
            answer = self.client.heartbeat_leases([h.lease for h in leases])
        except (ApiError, httpx.HTTPError, RuntimeError) as exc:
            if self._stop.is_set():
                return  # the client was closed under the call: the worker stops
            log.warning("heartbeat of %d leases failed: %r", len(leases), exc)
            now = time.monotonic()
            for held in leases:
                if now > held.deadline:
                    held.lose("expired (no heartbeat within the TTL)")
            return
        for held, result in zip(leases, answer.results, strict=True):
            self._answered(held, result, sent_at)

    def _answered(self, held: HeldLease, result: LeaseBeatAnswer, sent_at: float) -> None:
        if result.heartbeat is None:  # refused: `code` says why (lease_not_found, fencing_lost)
            held.lose(f"lost ({result.code or result.status})")
            return
        beat = result.heartbeat
        self.on_version(held.lease.run_id, beat.current_version)
        if beat.abort:
            held.lose(f"aborted ({beat.reason})")
            return
        held.extend(sent_at, beat.ttl_s)
