"""Retrying the network until it works or the worker stops (protocol/retrying.py: the one
retry policy, exponential backoff with full jitter on tenacity).

A fenced call whose lease is lost (error code `fencing_lost` or `lease_not_found`) is never
retried; transient failures (network, 5xx, 429, the bucket) are. With a lease's cancel event,
a lease that ended meanwhile (abort, loss) ends the retries with LeaseLost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import httpx

from protocol.client import ApiError
from protocol.retrying import retry_call
from protocol.storage import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_WAIT_S = 0.5  # the first retry's wait is at most this


class Stopping(Exception):
    """The worker was asked to stop while waiting or retrying."""


class LeaseLost(Exception):
    """A fenced call's lease is lost (its error code), or the heartbeat saw the lease end."""


def sleep_unless_stopped(stop: threading.Event, seconds: float) -> None:
    if stop.wait(seconds):
        raise Stopping()


def transient(exc: BaseException) -> bool:
    """Network, bucket and local I/O failures, and the server's 5xx and 429; never a lost
    lease's 409/404 nor another refusal (by its code)."""
    if isinstance(exc, ApiError):
        return not exc.lease_lost and (exc.status_code >= 500 or exc.status_code == 429)
    return isinstance(exc, httpx.HTTPError | StoreError | OSError)


def retry(
    what: str,
    call: Callable[[], T],
    *,
    stop: threading.Event,
    cap_s: float,
    cancel: threading.Event | None = None,
) -> T:
    """`call()` until it answers, retrying transient failures with backoff."""

    def lease_still_held() -> None:
        if cancel is not None and cancel.is_set() and not stop.is_set():
            raise LeaseLost("lease ended while retrying " + what)

    def warn(exc: BaseException, delay: float) -> None:
        shown = str(exc) if isinstance(exc, ApiError) else repr(exc)
        log.warning("%s failed (%s); retrying in %.1fs", what, shown, delay)

    return retry_call(
        call,
        transient=transient,
        base_s=FIRST_WAIT_S,
        cap_s=cap_s,
        sleep=lambda seconds: sleep_unless_stopped(stop, seconds),
        before_attempt=lease_still_held,
        on_retry=warn,
    )
