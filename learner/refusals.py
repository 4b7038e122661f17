"""What the learner does with each 409 a learner call can answer, by its code (the table of
docs/architecture/learner.md, "Refusals by code"). This module is that table's one home: the
call sites ask `on_409(call, exc)` and act on the answer, never on the words of `detail`.

Only the codes of LEASE_LOST mean the lease is gone (re-attach, the unpublished work dropped).
A publish whose answer was lost is reconciled, a file the bucket lost is uploaded again, a
rejection or an eval post that had already landed is done. When the server's record shows that
this session's unpublished work no longer fits it (versions past the one it builds, batches it
trained on that are not its own), the work must not be published: `Diverged`, and the learner
resumes from the server's record. A code outside the table is a bug of one side: it is raised.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Literal

from protocol.client import ApiError, AsyncGrpoClient, ConflictError
from protocol.error_codes import ATTACH_WAIT, LEASE_LOST, STATUS, ErrorCode
from protocol.schemas_learner import RejectReason

log = logging.getLogger(__name__)

Call = Literal[
    "attach",
    "heartbeat",
    "fail",
    "claim",
    "reject",
    "uploads",
    "publish",
    "metrics",
    "spot_check",
    "eval_claim",
    "eval_results",
]


class OnConflict(StrEnum):
    stand_by = "stand_by"  # wait and attach again
    stop = "stop"  # this learner cannot train the run: it stops
    lease_lost = "lease_lost"  # drop the unpublished work and re-attach
    reconcile = "reconcile"  # a publish: find whether the version had landed
    re_upload = "re_upload"  # upload the named file again and publish again
    done = "done"  # what the call asked for had already happened
    diverged = "diverged"  # the unpublished work no longer fits the server's record
    unexpected = "unexpected"  # not in the table: raised


class Diverged(Exception):
    """The server's record no longer fits this session's unpublished work (versions past the one
    it builds, batches not its own): that work is not published; the learner re-attaches and
    resumes from the server's last version."""


# the lease codes a 409 carries (lease_not_found, a worker's, is a 404)
_LEASE = dict.fromkeys((c for c in LEASE_LOST if STATUS[c] == 409), OnConflict.lease_lost)

ON_409: dict[Call, dict[ErrorCode, OnConflict]] = {
    "attach": {
        **dict.fromkeys(ATTACH_WAIT, OnConflict.stand_by),
        ErrorCode.run_ended: OnConflict.stop,
        ErrorCode.fingerprint_mismatch: OnConflict.stop,
        ErrorCode.model_mismatch: OnConflict.stop,
        ErrorCode.rewards_missing: OnConflict.stop,
    },
    "heartbeat": _LEASE,
    # the learner stops after `fail` either way; a refusal is only logged
    "fail": {**_LEASE, ErrorCode.run_ended: OnConflict.done},
    "claim": {**_LEASE, ErrorCode.target_version_behind: OnConflict.diverged},
    "reject": {**_LEASE, ErrorCode.batch_not_claimed: OnConflict.done},
    "uploads": {**_LEASE, ErrorCode.version_not_next: OnConflict.reconcile},
    "publish": {
        **_LEASE,
        ErrorCode.version_not_next: OnConflict.reconcile,
        ErrorCode.file_not_uploaded: OnConflict.re_upload,
        ErrorCode.file_size_mismatch: OnConflict.re_upload,
        ErrorCode.batch_not_claimed: OnConflict.diverged,
        ErrorCode.batch_claimed_for_earlier_version: OnConflict.diverged,
    },
    "metrics": _LEASE,
    "spot_check": _LEASE,
    "eval_claim": _LEASE,
    "eval_results": {**_LEASE, ErrorCode.batch_not_claimed: OnConflict.done},
}

# 409 codes no learner call answers (admin and worker calls).
NOT_LEARNER_409 = frozenset(
    {
        ErrorCode.last_admin_token,
        ErrorCode.invalid_transition,
        ErrorCode.model_not_registered,
        ErrorCode.dataset_in_use,
        ErrorCode.project_name_taken,
    }
)


def on_409(call: Call, exc: ApiError) -> OnConflict:
    """What the learner does with this answer of `call` (`unexpected` for an answer that is not
    a 409 or whose code is not in the table)."""
    if exc.status_code != 409 or exc.code is None:
        return OnConflict.unexpected
    try:
        code = ErrorCode(exc.code)
    except ValueError:
        return OnConflict.unexpected
    return ON_409[call].get(code, OnConflict.unexpected)


def landed_version(exc: ApiError, version: int, sha256: str | None) -> str:
    """The run's status when the `version_not_next` answer `exc` says that `version`, whose
    content address is `sha256`, is already published (the publish landed, its answer was
    lost); else Diverged. The fence held in the same transaction, so only this session has
    published since it attached."""
    body = exc.body if isinstance(exc.body, dict) else {}
    current, theirs, status = (
        body.get("current_version"),
        body.get("version_sha256"),
        body.get("run_status"),
    )
    if (
        isinstance(current, int)
        and current >= version
        and sha256 is not None
        and theirs == sha256
        and isinstance(status, str)
    ):
        return status
    raise Diverged(
        f"version {version} cannot be published: the server is at version {current}"
        + ("" if theirs is None else f" and its version {version} is not this session's")
    )


def reject_batch(
    client: AsyncGrpoClient,
    run_id: str,
    batch_id: str,
    fencing: int,
    reason: RejectReason,
    detail: str | None,
) -> None:
    """Reject a claimed batch; a `batch_not_claimed` answer means it is no longer this
    learner's (an earlier try of this rejection landed): nothing is left to do."""
    try:
        client.reject_batch(run_id, batch_id, fencing, reason, detail)
    except ConflictError as exc:
        if on_409("reject", exc) is not OnConflict.done:
            raise
        log.info("batch %s was no longer claimed by this learner (%s)", batch_id, exc.code)
