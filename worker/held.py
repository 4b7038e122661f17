"""The leases a worker holds at once (docs/architecture/worker.md, "The worker").

Each held lease keeps its own fencing token, cancel event and TTL deadline: an abort, a 409/404
or an expiry cancels that lease's generation only. The registry counts the sequences in flight
(prompts x G of every held lease that has not finished generating), which is what
`max_inflight_sequences` bounds: a lease that is uploading or completing no longer occupies the
engine, so the worker acquires the next one while it finishes.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass, field

from protocol.schemas import Lease

log = logging.getLogger(__name__)


@dataclass(eq=False)
class HeldLease:
    """One lease in the worker's hands, from its grant until it is completed or given up."""

    lease: Lease
    cancel: threading.Event = field(default_factory=threading.Event)
    lost_reason: str | None = None
    # Monotonic time its TTL runs out unless a heartbeat extends it: counted from when the
    # grant (or the last heartbeat) was SENT, never later than the server's own clock starts.
    deadline: float = 0.0
    released: bool = False
    generated: bool = False  # its generation has ended: its sequences left the engine
    release_lock: threading.Lock = field(default_factory=threading.Lock)

    def extend(self, sent_at: float, ttl_s: float) -> None:
        """A grant or heartbeat answered: the TTL runs from when its request was sent."""
        self.deadline = sent_at + ttl_s

    @property
    def lease_id(self) -> uuid.UUID:
        return self.lease.lease_id

    @property
    def sequences(self) -> int:
        return len(self.lease.prompts) * self.lease.group_size

    @property
    def adapter_key(self) -> tuple[str, int]:
        return (str(self.lease.run_id), self.lease.adapter_version)

    def lose(self, reason: str) -> None:
        """The lease ended under us (abort, 409/404, expiry): stop its work, keep the reason."""
        if self.lost_reason is None:
            self.lost_reason = reason
            log.warning("lease %s ended: %s", self.lease_id, reason)
        self.cancel.set()


class HeldLeases:
    """The held leases, safe to read and change from every thread of the worker."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held: dict[uuid.UUID, HeldLease] = {}

    def add(self, lease: Lease, sent_at: float) -> HeldLease:
        """A granted lease, its TTL counted from `sent_at` (when the acquire was sent)."""
        held = HeldLease(lease)
        held.extend(sent_at, lease.ttl_s)
        with self._changed:
            self._held[lease.lease_id] = held
            self._changed.notify_all()
        return held

    def remove(self, held: HeldLease) -> None:
        with self._changed:
            self._held.pop(held.lease_id, None)
            self._changed.notify_all()

    def generated(self, held: HeldLease) -> None:
        """The lease's generation ended (done, cancelled or failed): room for more."""
        with self._changed:
            held.generated = True
            self._changed.notify_all()

    def snapshot(self) -> list[HeldLease]:
        with self._changed:
            return list(self._held.values())

    def __len__(self) -> int:
        with self._changed:
            return len(self._held)

    def sequences(self) -> int:
        with self._changed:
            return self._sequences()

    def _sequences(self) -> int:
        return sum(h.sequences for h in self._held.values() if not h.generated)

    def adapter_keys(self) -> set[tuple[str, int]]:
        """The (run, version) every held lease generates with."""
        with self._changed:
            return {h.adapter_key for h in self._held.values()}

    def wait_below(self, max_sequences: int, timeout_s: float) -> bool:
        """Wait until the sequences in flight are under `max_sequences`."""
        with self._changed:
            return self._changed.wait_for(lambda: self._sequences() < max_sequences, timeout_s)

    def wait_empty(self, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: not self._held, timeout_s)
