"""Retrying the network: exponential backoff with full jitter until it works or the worker stops.

A fenced call whose lease is lost (error code `fencing_lost` or `lease_not_found`) is never
retried; transient failures (network, 5xx, 429, the bucket) are. With a lease's cancel event,
a lease that ended meanwhile (abort, loss) ends the retries with LeaseLost.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TypeVar

import httpx

from protocol.client import ApiError
from protocol.storage import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")


class Stopping(Exception):
    """The worker was asked to stop while waiting or retrying."""


class LeaseLost(Exception):
    """A fenced call's lease is lost (its error code), or the heartbeat saw the lease end."""


class Backoff:
    """Exponential backoff with full jitter, bounded by `cap_s`."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        self.base_s, self.cap_s, self.attempt = base_s, cap_s, 0

    def next_delay(self) -> float:
        delay = random.uniform(0.5, 1.0) * min(self.cap_s, self.base_s * 2**self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


def sleep_unless_stopped(stop: threading.Event, seconds: float) -> None:
    if stop.wait(seconds):
        raise Stopping()


def retry(
    what: str,
    call: Callable[[], T],
    *,
    stop: threading.Event,
    cap_s: float,
    cancel: threading.Event | None = None,
) -> T:
    """`call()` until it answers, retrying transient failures with backoff."""
    backoff = Backoff(0.5, cap_s)
    while True:
        if cancel is not None and cancel.is_set() and not stop.is_set():
            raise LeaseLost("lease ended while retrying " + what)
        try:
            return call()
        except (httpx.HTTPError, StoreError, OSError) as exc:
            delay = backoff.next_delay()
            log.warning("%s failed (%r); retrying in %.1fs", what, exc, delay)
        except ApiError as exc:
            if exc.lease_lost or (exc.status_code < 500 and exc.status_code != 429):
                raise
            delay = backoff.next_delay()
            log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
        sleep_unless_stopped(stop, delay)
