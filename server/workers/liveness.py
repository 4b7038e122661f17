"""A worker's state as everyone shows it (API, dashboard, /metrics, the demo): derived when read
from its stored `status` (set by an admin or the spot checks) and its last contact, so a worker
that stopped calling shows as offline without any job having to mark it.

The silence threshold is the one cost accrual uses (settings.jobs.worker_silent_s): a worker
not seen for longer is silent, accrues no cost, and shows as `offline`."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

WorkerState = Literal["online", "offline", "quarantined", "revoked"]
WORKER_STATES: tuple[WorkerState, ...] = ("online", "offline", "quarantined", "revoked")


def is_silent(last_seen_at: datetime | None, now: datetime, silent_s: float) -> bool:
    """Not seen for longer than `silent_s` (or never seen)."""
    return last_seen_at is None or now - last_seen_at > timedelta(seconds=silent_s)


def worker_state(
    status: str, last_seen_at: datetime | None, now: datetime, silent_s: float
) -> WorkerState:
    """`revoked` and `quarantined` as stored; an `active` worker is `online` while it calls and
    `offline` once silent."""
    if status == "revoked":
        return "revoked"
    if status == "quarantined":
        return "quarantined"
    return "offline" if is_silent(last_seen_at, now, silent_s) else "online"
