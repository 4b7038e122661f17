"""The learner's bucket transfers, kept going through a bucket outage.

Every transfer goes through protocol/transfer.py (`download_url`, `upload_presigned`, one
attempt each: the retrying happens here, in one layer); a failure that an outage explains (a
transport error, 429/5xx from the bucket, 5xx from the control plane whose own bucket calls
fail) is retried with the one retry policy, protocol/retrying.py (exponential backoff with
full jitter, capped, on tenacity) for as long as the learner lease holds: `alive()` raises once the
heartbeat has seen a 409, and a fenced call answering 409 raises ConflictError: `fencing_lost`
ends the session (unpublished work dropped, re-attach), every other code is handled by what it
means (learner/refusals.py).

Uploads: a PUT URL is conditional (If-None-Match: *) and short-lived, so after any failed PUT
fresh URLs are requested for the files not yet confirmed; the server deletes whatever sits at
an unpublished key before presigning, so a PUT that timed out but landed (its retry answering
412 ObjectExists) is simply sent again: a file counts as uploaded only on a 2xx to our own PUT
of our own bytes, and the publish check (every object present with its stated size) follows.

Downloads: a 4xx from the bucket is not retried. An expired URL after a long outage raises
`BucketRefused`, which ends the session so that a re-attach (which releases this learner's
claims) hands the batches out again with fresh URLs; a missing object (404) raises
`ObjectMissing`, and the intake rejects that batch instead (a re-attach would hand out the same
missing object forever).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from protocol import schemas_learner as sl
from protocol.client import ApiError, AsyncGrpoClient
from protocol.retrying import Backoff, retry_call
from protocol.storage import ObjectExists, PresignedPut
from protocol.transfer import ChecksumMismatch, TransferError, is_retryable
from protocol.transfer import download_url as _download_url
from protocol.transfer import upload_presigned as _upload_presigned

log = logging.getLogger(__name__)
T = TypeVar("T")


class BucketRefused(Exception):
    """A download URL the bucket refuses for good (4xx: expired or missing)."""


class ObjectMissing(BucketRefused):
    """The bucket answers 404: the object is gone, and fresh URLs would not bring it back."""


def transient_api(exc: BaseException) -> bool:
    """A control-plane call that failed because the server (or its bucket) is unreachable."""
    if isinstance(exc, ApiError):
        return exc.status_code >= 500 or exc.status_code == 429
    return isinstance(exc, httpx.TransportError)


class Retrier:
    """Retries a call while `transient(exc)` and the lease holds (`alive()` raises if not).

    A call under one idempotency key (`call_keyed`) is retried while the session is open
    (`session_open()` raises once it stops), even after the heartbeat has seen the lease end:
    its retry is safe then, since a call that landed gets its stored answer and one that did
    not is refused under the lost fencing token. The final publish needs it: the run it
    completes ends the lease, so the heartbeat can see the 409 before that publish's lost
    answer is fetched again."""

    def __init__(
        self,
        alive: Callable[[], None],
        *,
        session_open: Callable[[], None] | None = None,
        base_s: float = 0.5,
        cap_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.alive, self.base_s, self.cap_s, self.sleep = alive, base_s, cap_s, sleep
        self.session_open = session_open or alive
        self.retries = 0  # total retries (for tests and logs)

    def backoff(self) -> Backoff:
        return Backoff(base_s=self.base_s, cap_s=self.cap_s)

    def wait(self, backoff: Backoff, what: str, exc: BaseException) -> None:
        """One wait of an upload round (fresh URLs follow)."""
        delay = backoff.next_delay()
        self._retrying(what, exc, delay)
        self.sleep(delay)

    def _retrying(self, what: str, exc: BaseException, delay: float) -> None:
        self.retries += 1
        log.warning("%s failed (%r); retrying in %.1f s", what, exc, delay)

    def call(self, what: str, fn: Callable[[], T], transient: Callable[[BaseException], bool]) -> T:
        return self._retry(what, fn, transient, self.alive)

    def call_keyed(
        self, what: str, fn: Callable[[], T], transient: Callable[[BaseException], bool]
    ) -> T:
        """`fn` sends one idempotency key on every attempt: retried while the session is open."""
        return self._retry(what, fn, transient, self.session_open)

    def _retry(
        self,
        what: str,
        fn: Callable[[], T],
        transient: Callable[[BaseException], bool],
        before_attempt: Callable[[], None],
    ) -> T:
        return retry_call(
            fn,
            transient=lambda exc: isinstance(exc, Exception) and transient(exc),
            base_s=self.base_s,
            cap_s=self.cap_s,
            sleep=self.sleep,
            before_attempt=before_attempt,
            on_retry=lambda exc, delay: self._retrying(what, exc, delay),
        )

    def download(self, url: str, dest: Path, expected_sha256: str | None) -> int:
        """`download_url` until it succeeds; ChecksumMismatch as is; BucketRefused on a 4xx."""
        try:
            return self.call(
                f"download of {dest.name}",
                lambda: _download_url(url, dest, expected_sha256, attempts=1),
                is_retryable,
            )
        except ChecksumMismatch:
            raise
        except TransferError as exc:
            refused = ObjectMissing if exc.status_code == 404 else BucketRefused
            raise refused(f"download of {dest.name} refused: {exc}") from exc


def upload_version_files(
    retrier: Retrier,
    client: AsyncGrpoClient,
    run_id: str,
    request: sl.UploadsRequest,
    paths: dict[tuple[str, str], Path],
) -> dict[tuple[str, str], str]:
    """Upload every file of `request` (paths by (kind, name)), asking for fresh presigned URLs
    for the files left after any failure, until all landed or the lease is lost. Returns the
    bucket key of each file."""
    left = {(f.kind, f.name): f for f in request.files}
    keys: dict[tuple[str, str], str] = {}
    backoff = retrier.backoff()
    while left:
        body = request.model_copy(update={"files": list(left.values())})
        answer = retrier.call(
            f"upload URLs for version {request.version}",
            lambda body=body: client.request_uploads(run_id, body),  # type: ignore[misc]
            transient_api,
        )
        for put in answer.uploads:
            retrier.alive()
            try:
                _upload_presigned(
                    PresignedPut(url=put.url, headers=put.headers),
                    paths[(put.kind, put.name)],
                    attempts=1,  # this loop retries, with backoff and fresh URLs
                )
            except ObjectExists as exc:  # our timed-out PUT landed, or a fenced learner's
                retrier.wait(backoff, f"upload of {put.kind}/{put.name} (already there)", exc)
                break  # fresh URLs (the server clears the key) and send our bytes again
            except TransferError as exc:  # outage, or a URL that expired meanwhile
                retrier.wait(backoff, f"upload of {put.kind}/{put.name}", exc)
                break
            left.pop((put.kind, put.name))
            keys[(put.kind, put.name)] = put.key
            backoff.reset()
    return keys
