"""The error codes of the control plane's answers: every error body carries one, a stable
snake_case `code` beside the person-readable `detail`. Programs (the typed client, the learner,
the worker) branch on the code, never on the words of `detail`, which may be reworded.

This module is the one home of the codes and their HTTP statuses (docs/architecture/protocol.md,
"Error codes"; docs/guides/troubleshooting.md). A new error gets a code here first: the server
refuses to raise a code that is not in `STATUS`.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    # -- the request itself ----------------------------------------------------------------------
    validation_failed = "validation_failed"  # the body, query or path failed validation
    invalid_value = "invalid_value"  # a field's value is refused (named in `field`)
    bad_request = "bad_request"  # the framework could not read the request
    body_incomplete = "body_incomplete"  # the client disconnected mid-body
    body_too_large = "body_too_large"  # the request body is over the server's limit
    route_not_found = "route_not_found"  # no such path
    method_not_allowed = "method_not_allowed"  # the path exists, not with this method
    http_error = "http_error"  # any other refusal of the framework (its own status)
    # -- tokens and workers ----------------------------------------------------------------------
    token_missing = "token_missing"
    token_invalid = "token_invalid"
    token_revoked = "token_revoked"
    token_expired = "token_expired"
    token_kind_forbidden = "token_kind_forbidden"  # a valid token of another kind
    role_forbidden = "role_forbidden"  # a project token whose role lacks the right
    csrf_failed = "csrf_failed"  # a dashboard form without its session's (or login's) CSRF token
    registration_token_exhausted = "registration_token_exhausted"
    token_not_found = "token_not_found"
    last_admin_token = "last_admin_token"
    worker_revoked = "worker_revoked"
    worker_not_found = "worker_not_found"
    # -- runs ------------------------------------------------------------------------------------
    run_not_found = "run_not_found"
    run_ended = "run_ended"  # the run is completed, cancelled or failed
    run_preparing = "run_preparing"  # its prompt rows are being prepared: attach again later
    invalid_transition = "invalid_transition"  # pause/resume/cancel… not allowed from its status
    # -- sweeps (docs/guides/sweeps.md) ----------------------------------------------------------
    sweep_not_found = "sweep_not_found"
    sweep_invalid = "sweep_invalid"  # grid/overrides malformed: empty, not lists, duplicated
    sweep_path_unknown = "sweep_path_unknown"  # an override's path names no run config field
    sweep_combination_invalid = "sweep_combination_invalid"  # one combination fails validation
    sweep_too_large = "sweep_too_large"  # more runs than `sweeps.max_runs`
    # -- projects (docs/guides/projects.md) --------------------------------------------------------
    project_not_found = "project_not_found"
    project_name_taken = "project_name_taken"  # create or rename to a name in use
    unknown_project = "unknown_project"  # a run, sweep, dataset or token names no project
    # -- the learner -----------------------------------------------------------------------------
    held_by_another_learner = "held_by_another_learner"  # stand by and attach again
    run_not_held = "run_not_held"  # a pool learner's token on a run it does not hold
    pool_learner_not_found = "pool_learner_not_found"
    fingerprint_mismatch = "fingerprint_mismatch"
    model_mismatch = "model_mismatch"
    rewards_missing = "rewards_missing"
    target_version_behind = "target_version_behind"
    target_version_too_far = "target_version_too_far"
    version_not_next = "version_not_next"
    batch_not_claimed = "batch_not_claimed"
    batch_claimed_for_earlier_version = "batch_claimed_for_earlier_version"
    adapter_files_missing = "adapter_files_missing"
    duplicate_file = "duplicate_file"
    wrong_file_key = "wrong_file_key"
    file_not_uploaded = "file_not_uploaded"
    file_size_mismatch = "file_size_mismatch"
    # -- leases (worker and learner) -------------------------------------------------------------
    fencing_lost = "fencing_lost"  # the lease's token, state or expiry no longer holds: drop it
    lease_not_found = "lease_not_found"
    model_not_registered = "model_not_registered"
    upload_too_large = "upload_too_large"
    digest_mismatch = "digest_mismatch"
    wrong_batch_key = "wrong_batch_key"
    # -- batches, versions, datasets -------------------------------------------------------------
    batch_not_found = "batch_not_found"
    batch_of_another_worker = "batch_of_another_worker"
    batch_too_large = "batch_too_large"
    batch_unreadable = "batch_unreadable"
    batch_object_missing = "batch_object_missing"
    row_out_of_range = "row_out_of_range"
    row_unreadable = "row_unreadable"
    version_not_found = "version_not_found"
    version_deleted = "version_deleted"
    file_not_found = "file_not_found"
    dataset_not_found = "dataset_not_found"
    unknown_dataset = "unknown_dataset"  # a run names a dataset that does not exist
    dataset_failed = "dataset_failed"
    dataset_of_another_project = "dataset_of_another_project"  # a run names another's dataset
    dataset_in_use = "dataset_in_use"
    invalid_dataset_file = "invalid_dataset_file"
    row_too_large = "row_too_large"  # a row (or JSONL line) over `datasets.max_row_bytes`
    row_invalid_utf8 = "row_invalid_utf8"  # text that is not UTF-8, named by row and column
    column_invalid_utf8 = "column_invalid_utf8"  # a Parquet column name that is not UTF-8
    row_count_mismatch = "row_count_mismatch"  # the Parquet footer's row count is not the rows
    page_too_large = "page_too_large"  # a row group's pages decode to more than the bound
    page_unreadable = "page_unreadable"  # a Parquet page header that cannot be read
    batch_too_large_to_show = "batch_too_large_to_show"  # the trajectory view's decode bound
    after_invalid = "after_invalid"  # the versions feed's `after` is not run_id:ASCII digits
    # -- idempotency keys (docs/architecture/protocol.md, "Safe retries") ------------------------
    idempotency_key_invalid = "idempotency_key_invalid"  # not a UUIDv7
    idempotency_key_reused = "idempotency_key_reused"  # the key's first call was another request
    idempotency_key_expired = "idempotency_key_expired"  # older than the answers still kept
    # -- outbound URLs (webhooks, the LLM judge) -------------------------------------------------
    webhook_url_invalid = "webhook_url_invalid"  # a URL the delivery client cannot use
    webhook_url_refused = "webhook_url_refused"  # refused by the outbound policy
    judge_url_invalid = "judge_url_invalid"
    judge_url_refused = "judge_url_refused"
    # -- the local store's signed blob URLs ------------------------------------------------------
    blobs_not_served = "blobs_not_served"  # the bucket is S3: its URLs are S3's
    signature_invalid = "signature_invalid"
    length_mismatch = "length_mismatch"  # Content-Length is not the signed length
    body_length_mismatch = "body_length_mismatch"  # the body streamed another length
    bad_digest = "bad_digest"
    object_not_found = "object_not_found"
    object_exists = "object_exists"
    blob_too_large = "blob_too_large"
    bucket_probe_not_found = "bucket_probe_not_found"  # doctor: no probe object at its key
    # -- outages ---------------------------------------------------------------------------------
    database_unavailable = "database_unavailable"
    store_unavailable = "store_unavailable"
    not_ready = "not_ready"  # /readyz: the database or the bucket is not ready
    internal_error = "internal_error"


_BY_STATUS: dict[int | None, tuple[ErrorCode, ...]] = {
    400: (
        ErrorCode.bad_request,
        ErrorCode.body_incomplete,
        ErrorCode.body_length_mismatch,
        ErrorCode.bad_digest,
    ),
    401: (
        ErrorCode.token_missing,
        ErrorCode.token_invalid,
        ErrorCode.token_revoked,
        ErrorCode.token_expired,
        ErrorCode.registration_token_exhausted,
        ErrorCode.worker_revoked,
    ),
    403: (
        ErrorCode.token_kind_forbidden,
        ErrorCode.role_forbidden,
        ErrorCode.run_not_held,
        ErrorCode.csrf_failed,
        ErrorCode.signature_invalid,
        ErrorCode.length_mismatch,
    ),
    404: (
        ErrorCode.route_not_found,
        ErrorCode.token_not_found,
        ErrorCode.worker_not_found,
        ErrorCode.run_not_found,
        ErrorCode.pool_learner_not_found,
        ErrorCode.sweep_not_found,
        ErrorCode.project_not_found,
        ErrorCode.lease_not_found,
        ErrorCode.batch_not_found,
        ErrorCode.batch_object_missing,
        ErrorCode.version_not_found,
        ErrorCode.file_not_found,
        ErrorCode.dataset_not_found,
        ErrorCode.blobs_not_served,
        ErrorCode.object_not_found,
        ErrorCode.bucket_probe_not_found,
    ),
    405: (ErrorCode.method_not_allowed,),
    409: (
        ErrorCode.last_admin_token,
        ErrorCode.run_ended,
        ErrorCode.run_preparing,
        ErrorCode.invalid_transition,
        ErrorCode.held_by_another_learner,
        ErrorCode.fingerprint_mismatch,
        ErrorCode.model_mismatch,
        ErrorCode.rewards_missing,
        ErrorCode.target_version_behind,
        ErrorCode.version_not_next,
        ErrorCode.batch_not_claimed,
        ErrorCode.batch_claimed_for_earlier_version,
        ErrorCode.file_not_uploaded,
        ErrorCode.file_size_mismatch,
        ErrorCode.fencing_lost,
        ErrorCode.model_not_registered,
        ErrorCode.dataset_in_use,
        ErrorCode.project_name_taken,
    ),
    410: (ErrorCode.version_deleted,),
    412: (ErrorCode.object_exists,),
    413: (
        ErrorCode.body_too_large,
        ErrorCode.upload_too_large,
        ErrorCode.batch_too_large,
        ErrorCode.blob_too_large,
    ),
    422: (
        ErrorCode.validation_failed,
        ErrorCode.invalid_value,
        ErrorCode.target_version_too_far,
        ErrorCode.adapter_files_missing,
        ErrorCode.duplicate_file,
        ErrorCode.wrong_file_key,
        ErrorCode.digest_mismatch,
        ErrorCode.wrong_batch_key,
        ErrorCode.batch_of_another_worker,
        ErrorCode.batch_unreadable,
        ErrorCode.row_out_of_range,
        ErrorCode.row_unreadable,
        ErrorCode.unknown_dataset,
        ErrorCode.dataset_failed,
        ErrorCode.dataset_of_another_project,
        ErrorCode.invalid_dataset_file,
        ErrorCode.row_too_large,
        ErrorCode.row_invalid_utf8,
        ErrorCode.column_invalid_utf8,
        ErrorCode.row_count_mismatch,
        ErrorCode.page_too_large,
        ErrorCode.page_unreadable,
        ErrorCode.batch_too_large_to_show,
        ErrorCode.after_invalid,
        ErrorCode.idempotency_key_invalid,
        ErrorCode.idempotency_key_reused,
        ErrorCode.idempotency_key_expired,
        ErrorCode.webhook_url_invalid,
        ErrorCode.webhook_url_refused,
        ErrorCode.judge_url_invalid,
        ErrorCode.judge_url_refused,
        ErrorCode.sweep_invalid,
        ErrorCode.sweep_path_unknown,
        ErrorCode.sweep_combination_invalid,
        ErrorCode.sweep_too_large,
        ErrorCode.unknown_project,
    ),
    500: (ErrorCode.internal_error,),
    503: (ErrorCode.database_unavailable, ErrorCode.store_unavailable, ErrorCode.not_ready),
    None: (ErrorCode.http_error,),  # the status the framework answered
}

STATUS: dict[ErrorCode, int | None] = {
    code: status for status, codes in _BY_STATUS.items() for code in codes
}
"""Each code's HTTP status: one status per code (None: the framework's own status)."""

# What each code means, for people reading about it (docs/reference/error-codes.md is made from
# this table, README "Errors" says the same): a code keeps its meaning once listed.
MEANING: dict[ErrorCode, str] = {
    ErrorCode.validation_failed: (
        "the body, query or path failed validation (`errors` names each field)"
    ),
    ErrorCode.invalid_value: "a field's value is refused (`field` names it)",
    ErrorCode.bad_request: "the request could not be read",
    ErrorCode.body_incomplete: "the client disconnected before the body was complete",
    ErrorCode.body_too_large: "the body is over `security.max_body_bytes`",
    ErrorCode.route_not_found: "no such path",
    ErrorCode.method_not_allowed: "the path exists, not with this method",
    ErrorCode.http_error: "any other refusal of the HTTP framework",
    ErrorCode.token_missing: "no bearer token",
    ErrorCode.token_invalid: "not a token of this server",
    ErrorCode.token_revoked: "the token was revoked",
    ErrorCode.token_expired: "the token expired",
    ErrorCode.token_kind_forbidden: (
        "a valid token of another kind (e.g. a worker token on an admin call)"
    ),
    ErrorCode.role_forbidden: (
        "a project token whose role may not make this call, or a `ci` token on a run it did not "
        "create"
    ),
    ErrorCode.csrf_failed: (
        "a dashboard form (or POST) without its session's CSRF token, or the login form without "
        "its own"
    ),
    ErrorCode.registration_token_exhausted: "the registration token reached its `max_uses`",
    ErrorCode.token_not_found: "no such token to revoke",
    ErrorCode.last_admin_token: "revoking the last live admin token (pass `force=true`)",
    ErrorCode.worker_revoked: "the worker was revoked (or its token has no worker)",
    ErrorCode.worker_not_found: "no such worker",
    ErrorCode.run_not_found: "no such run (or not the run of this learner token)",
    ErrorCode.run_ended: "the run is completed, cancelled or failed",
    ErrorCode.run_preparing: (
        "the run's prompt rows are being prepared: attach again once it is `pending`"
    ),
    ErrorCode.invalid_transition: (
        "pause, resume or cancel is not allowed from the run's status (`status`)"
    ),
    ErrorCode.sweep_not_found: "no such sweep",
    ErrorCode.sweep_invalid: (
        "a sweep's `grid` or `overrides` is malformed: both or neither given, empty, a grid value "
        "that is not a non-empty list, or two combinations alike (`field` names it)"
    ),
    ErrorCode.sweep_path_unknown: (
        "a sweep's field path names no run config field (`field` names it; paths are dotted, "
        "e.g. `grpo.learning_rate`)"
    ),
    ErrorCode.sweep_combination_invalid: (
        "a combination of the sweep is not a valid run config: nothing was created "
        "(`combination`, `overrides`, `field` and `errors` name it)"
    ),
    ErrorCode.sweep_too_large: "a sweep would create more runs than `sweeps.max_runs`",
    ErrorCode.project_not_found: "no such project",
    ErrorCode.project_name_taken: "a project of that name exists (`field`: name)",
    ErrorCode.unknown_project: (
        "a run, sweep, dataset or registration token names a project (by name or id) that does "
        "not exist (`field` names it)"
    ),
    ErrorCode.held_by_another_learner: "another learner holds the run: stand by and attach again",
    ErrorCode.run_not_held: (
        "a pool learner's token reaches only the runs it holds (take them first: "
        "`POST /api/v1/learners/take`)"
    ),
    ErrorCode.pool_learner_not_found: "no such pool learner",
    ErrorCode.fingerprint_mismatch: "the learner's tokenizer differs from the run's",
    ErrorCode.model_mismatch: "the learner loaded another base model than the run's",
    ErrorCode.rewards_missing: "the learner's host cannot load a reward of the run (the run fails)",
    ErrorCode.target_version_behind: "a claim's `target_version` is not above the current version",
    ErrorCode.target_version_too_far: "a claim's `target_version` is too far ahead",
    ErrorCode.version_not_next: "a publish is not exactly the current version + 1",
    ErrorCode.batch_not_claimed: "the batch is not claimed under this learner token",
    ErrorCode.batch_claimed_for_earlier_version: (
        "a publish consumes batches claimed for an earlier version"
    ),
    ErrorCode.adapter_files_missing: "a publish lacks a required adapter file",
    ErrorCode.duplicate_file: "a file is listed twice",
    ErrorCode.wrong_file_key: "a published file is not at its version's key",
    ErrorCode.file_not_uploaded: "a published file is not in the bucket",
    ErrorCode.file_size_mismatch: "a published file's size differs from the bucket's",
    ErrorCode.fencing_lost: (
        "the lease's fencing token, state or expiry no longer holds: drop the work, re-acquire "
        "or re-attach"
    ),
    ErrorCode.lease_not_found: "not a lease of this worker",
    ErrorCode.model_not_registered: "the worker asks for a model it did not register with",
    ErrorCode.upload_too_large: "a batch or dataset file over its size limit",
    ErrorCode.digest_mismatch: "the manifest's sha256 is not the one the batch was uploaded with",
    ErrorCode.wrong_batch_key: "the manifest's key is not the lease's batch key",
    ErrorCode.batch_not_found: "no such batch in this run",
    ErrorCode.batch_of_another_worker: "a spot check names a worker that did not make the batch",
    ErrorCode.batch_too_large: "the batch is over the trajectory sample's bound",
    ErrorCode.batch_unreadable: "the batch's object cannot be read as a trajectory batch",
    ErrorCode.batch_object_missing: "the batch's object is no longer in the bucket",
    ErrorCode.row_out_of_range: "the sample's row is outside the batch",
    ErrorCode.row_unreadable: "the sample's row does not parse",
    ErrorCode.version_not_found: "no such adapter version",
    ErrorCode.version_deleted: "the adapter version was deleted by retention",
    ErrorCode.file_not_found: "the version has no such file",
    ErrorCode.dataset_not_found: "no such dataset",
    ErrorCode.unknown_dataset: "a run names a dataset that does not exist",
    ErrorCode.dataset_failed: "a run names a dataset whose check failed",
    ErrorCode.dataset_of_another_project: (
        "a run names an uploaded dataset of another project (`field`: `dataset.id` or "
        "`eval.dataset.id`): upload it to the run's project"
    ),
    ErrorCode.dataset_in_use: "deleting a dataset a run uses",
    ErrorCode.invalid_dataset_file: "an uploaded dataset file does not parse",
    ErrorCode.row_too_large: (
        "a dataset row (or JSONL line) over `datasets.max_row_bytes` (`field`: `file`, the row "
        "named)"
    ),
    ErrorCode.row_invalid_utf8: "dataset text that is not UTF-8 (the row and column named)",
    ErrorCode.column_invalid_utf8: "a Parquet column name that is not UTF-8",
    ErrorCode.row_count_mismatch: "a Parquet footer's row count is not the rows the file holds",
    ErrorCode.page_too_large: (
        "a Parquet row group's pages decode to more than the upload's bound (write smaller pages)"
    ),
    ErrorCode.page_unreadable: "a Parquet page header that cannot be read",
    ErrorCode.batch_too_large_to_show: (
        "the trajectory view would decode more than its bound (`field`: `batch_id`)"
    ),
    ErrorCode.after_invalid: "the versions feed's `after` is not `run_id:ASCII digits`",
    ErrorCode.idempotency_key_invalid: "an `Idempotency-Key` that is not a UUIDv7",
    ErrorCode.idempotency_key_reused: (
        "an `Idempotency-Key` already used for another request (another route or body): make a "
        "new key per call"
    ),
    ErrorCode.idempotency_key_expired: (
        "an `Idempotency-Key` older than the answers the server still keeps "
        "(`idempotency_retention_s`): its call may have been applied; it is never applied again"
    ),
    ErrorCode.webhook_url_invalid: (
        "`alarms.webhook_url` is not a URL the delivery client can use (or a non-canonical IP "
        "literal)"
    ),
    ErrorCode.webhook_url_refused: "`alarms.webhook_url` is refused by the outbound policy",
    ErrorCode.judge_url_invalid: "an `llm_judge` `base_url` is not a URL the client can use",
    ErrorCode.judge_url_refused: "an `llm_judge` `base_url` is refused by the outbound policy",
    ErrorCode.blobs_not_served: "signed `/blobs/` URLs exist only with a local-folder bucket",
    ErrorCode.signature_invalid: "a `/blobs/` URL's signature, expiry or key is refused",
    ErrorCode.length_mismatch: "`Content-Length` is not the signed length",
    ErrorCode.body_length_mismatch: "the streamed body is not the signed length",
    ErrorCode.bad_digest: "the body's sha256 is not the signed one",
    ErrorCode.object_not_found: "no object at the key",
    ErrorCode.object_exists: "the key exists and the URL may not overwrite it",
    ErrorCode.blob_too_large: "a `/blobs/` body over `security.max_blob_bytes`",
    ErrorCode.bucket_probe_not_found: (
        "no object at the bucket probe's key: never uploaded, already checked, or swept"
    ),
    ErrorCode.database_unavailable: "the database is unreachable: retry after `Retry-After`",
    ErrorCode.store_unavailable: "the bucket is unreachable: retry after `Retry-After`",
    ErrorCode.not_ready: (
        "`GET /readyz`: the database or the bucket is not ready (`database`, `bucket` say which)"
    ),
    ErrorCode.internal_error: "a bug (the server logs it)",
}


LEASE_LOST = frozenset({ErrorCode.fencing_lost, ErrorCode.lease_not_found})
"""A fenced call's lease is gone (its token, state or expiry no longer holds, or it is not a
lease of this caller): drop the work, never retry."""

ATTACH_WAIT = frozenset({ErrorCode.held_by_another_learner, ErrorCode.run_preparing})
"""An attach refused for now: wait as a standby and attach again. Every other refusal of attach
(another 409, the run not found, a token refused) means the learner cannot train the run: it
stops."""


def status_of(code: ErrorCode | str) -> int | None:
    """The code's HTTP status; ValueError for a code not in the table."""
    return STATUS[ErrorCode(code)]
