"""Typed HTTP client for every endpoint of the control plane (httpx by default; any client of
the httpx API it is handed works: httpx2, Starlette's TestClient over either).

Used by the worker, the learner, the tests and CI scripts. Transient failures (connection
errors, timeouts, 502/503/504, 429) are retried with exponential backoff and jitter; any other
error status raises an `ApiError` subclass at once. Each state-changing call carries an
Idempotency-Key made once per call and sent again on its retries, so a retry of a call whose
answer was lost gets that answer, never a second grant, claim or a 409
(docs/architecture/protocol.md, "Safe retries").
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from protocol import schemas_learner as sl
from protocol.capabilities import WorkerCapabilities
from protocol.error_codes import LEASE_LOST
from protocol.idempotency import IDEMPOTENCY_HEADER, new_key
from protocol.retrying import Backoff
from protocol.schemas import (
    VERSIONS_HEADER,
    BatchManifest,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatsRequest,
    HeartbeatsResponse,
    Lease,
    LeaseAcquireRequest,
    LeaseBeat,
    ReleaseReason,
    ReleaseRequest,
    ReleaseResponse,
    UploadRequest,
    UploadResponse,
    VersionNotice,
    VersionsResponse,
    format_after,
    parse_versions_header,
)
from protocol.schemas_doctor import BucketProbe, BucketProbeChecked, RunModel, TokenCheck

T = TypeVar("T", bound=BaseModel)

# The lease calls that take an Idempotency-Key: heartbeat and upload change nothing a repeat
# would change again (an extension, a fresh URL for the same key).
_KEYED_LEASE_CALLS = frozenset({"complete", "release"})

TRANSIENT_STATUS = {429, 502, 503, 504}


def _transport_errors() -> tuple[type[Exception], ...]:
    """httpx's transport errors, and httpx2's when it is installed: the client may be handed an
    httpx2 client (Starlette's TestClient is one then), whose errors do not derive from httpx's
    (docs/decisions/0016-http-client-library.md)."""
    try:
        import httpx2
    except ImportError:
        return (httpx.TransportError,)
    return (httpx.TransportError, httpx2.TransportError)


TRANSIENT_ERRORS = _transport_errors()


class ApiError(Exception):
    """An error answer from the control plane. Programs branch on `code` (a stable snake_case
    name, protocol/error_codes.py), never on the words of `detail`, which are for people."""

    def __init__(self, status_code: int, detail: Any, body: Any = None) -> None:
        super().__init__(f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail
        self.body = body
        code = body.get("code") if isinstance(body, dict) else None
        self.code: str | None = code if isinstance(code, str) else None

    @property
    def lease_lost(self) -> bool:
        """The fenced call's lease is gone (lost fencing, or not a lease of this caller)."""
        return self.code in LEASE_LOST


class BadRequestError(ApiError): ...


class UnauthorizedError(ApiError): ...


class ForbiddenError(ApiError): ...


class NotFoundError(ApiError): ...


class ConflictError(ApiError):
    """409: a fenced call lost its lease (drop the work) or a state change was refused."""


class ValidationFailed(ApiError): ...


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: ValidationFailed,
}


def _raise_for(response: httpx.Response) -> None:
    try:
        body = response.json()
        detail = body.get("detail", body) if isinstance(body, dict) else body
    except ValueError:
        body, detail = None, response.text
    raise _BY_STATUS.get(response.status_code, ApiError)(response.status_code, detail, body)


class AsyncGrpoClient:
    """Client of one control plane with one bearer token."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        http: httpx.Client | None = None,
        timeout_s: float = 30.0,
        max_retries: int = 5,
        retry_cap_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.http = http or httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self.max_retries = max_retries
        self.retry_cap_s = retry_cap_s
        self._sleep = sleep

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AsyncGrpoClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        token: str | None = None,
        timeout_s: float | None = None,
        idempotent: bool | str = False,
    ) -> httpx.Response:
        """Send with retries on transient failures; raise ApiError on other error statuses.
        `idempotent`: one Idempotency-Key for the call, sent on each of its retries (a string:
        that key, which the caller made for a logical call it may send again)."""
        headers = {}
        bearer = token or self.token
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        if idempotent:
            headers[IDEMPOTENCY_HEADER] = idempotent if isinstance(idempotent, str) else new_key()
        backoff = Backoff(cap_s=self.retry_cap_s)
        url = path if path.startswith("http") else self.base_url + path
        for attempt in range(self.max_retries + 1):
            try:
                # the client's own timeout when none is asked for: Starlette's TestClient (on
                # httpx2) refuses httpx's USE_CLIENT_DEFAULT and warns on request(timeout=...)
                request = self.http.build_request(
                    method,
                    url,
                    json=json,
                    params=params,
                    headers=headers,
                    timeout=self.http.timeout if timeout_s is None else timeout_s,
                )
                response = self.http.send(request)
            except TRANSIENT_ERRORS:
                if attempt == self.max_retries:
                    raise
                self._sleep(backoff.next_delay())
                continue
            if response.status_code in TRANSIENT_STATUS and attempt < self.max_retries:
                self._sleep(backoff.next_delay())
                continue
            if response.status_code >= 400:
                _raise_for(response)
            return response
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        return None if response.status_code == 204 else response.json()

    def _model(self, model: type[T], method: str, path: str, **kwargs: Any) -> T | None:
        response = self.request(method, path, **kwargs)
        if response.status_code == 204:
            return None
        return model.model_validate(response.json())

    @staticmethod
    def _body(body: BaseModel | dict[str, Any]) -> Any:
        return (
            body.model_dump(mode="json", exclude_unset=False)
            if isinstance(body, BaseModel)
            else body
        )

    # -- anyone -------------------------------------------------------------------------------

    def healthz(self) -> dict[str, Any]:
        return dict(self._json("GET", "/healthz"))

    # -- admin: runs ----------------------------------------------------------------------------

    def create_run(
        self, config: BaseModel | dict[str, Any], project: str | None = None
    ) -> dict[str, Any]:
        """201 with the run and its learner token (shown once); in `project` (its name or id;
        the `default` project when None)."""
        params = {"project": project} if project else None
        return dict(self._json("POST", "/api/v1/runs", json=self._body(config), params=params))

    def list_runs(
        self, status: str | None = None, project: str | None = None
    ) -> list[dict[str, Any]]:
        """Runs, newest first; of one status and one project (name or id) when given."""
        params = _without_none({"status": status, "project": project}, "status", "project")
        return list(self._json("GET", "/api/v1/runs", params=params or None))

    def get_run(self, run_id: str) -> dict[str, Any]:
        return dict(self._json("GET", f"/api/v1/runs/{run_id}"))

    def pause_run(self, run_id: str) -> dict[str, Any]:
        return dict(self._json("POST", f"/api/v1/runs/{run_id}/pause"))

    def resume_run(self, run_id: str) -> dict[str, Any]:
        return dict(self._json("POST", f"/api/v1/runs/{run_id}/resume"))

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        return dict(self._json("POST", f"/api/v1/runs/{run_id}/cancel"))

    def run_metrics(self, run_id: str, since_step: int | None = None) -> dict[str, Any]:
        params = {"since_step": since_step} if since_step is not None else None
        return dict(self._json("GET", f"/api/v1/runs/{run_id}/metrics", params=params))

    def run_ledger(self, run_id: str) -> dict[str, Any]:
        return dict(self._json("GET", f"/api/v1/runs/{run_id}/ledger"))

    def list_adapters(self, run_id: str) -> list[dict[str, Any]]:
        return list(self._json("GET", f"/api/v1/runs/{run_id}/adapters"))

    def get_adapter(self, run_id: str, version: int | str = "latest") -> dict[str, Any]:
        """`version` is an integer, 'latest' or 'final'; files come with download URLs."""
        return dict(self._json("GET", f"/api/v1/runs/{run_id}/adapters/{version}"))

    # -- admin: sweeps --------------------------------------------------------------------------

    def create_sweep(self, body: dict[str, Any]) -> dict[str, Any]:
        """201 with the sweep, its runs and each run's learner token (shown once); 422 naming
        the combination and the field when any combination is refused (nothing is created)."""
        return dict(self._json("POST", "/api/v1/sweeps", json=body))

    def list_sweeps(self, project: str | None = None) -> list[dict[str, Any]]:
        """Sweeps, newest first; of one project (name or id) when given."""
        params = {"project": project} if project else None
        return list(self._json("GET", "/api/v1/sweeps", params=params))

    # -- admin: projects --------------------------------------------------------------------------

    def create_project(self, name: str) -> dict[str, Any]:
        """201 with the project; 409 project_name_taken when the name is in use."""
        return dict(self._json("POST", "/api/v1/projects", json={"name": name}))

    def list_projects(self) -> list[dict[str, Any]]:
        """Every project, by name."""
        return list(self._json("GET", "/api/v1/projects"))

    def rename_project(self, project_id: str, name: str) -> dict[str, Any]:
        """The renamed project; 409 project_name_taken, 404 project_not_found."""
        return dict(self._json("PATCH", f"/api/v1/projects/{project_id}", json={"name": name}))

    def create_project_token(
        self, project_id: str, name: str, role: str, ttl_hours: float | None = None
    ) -> dict[str, Any]:
        """201 with a project token of `role` (the token itself only in this answer)."""
        body = {"name": name, "role": role, "ttl_hours": ttl_hours}
        return dict(self._json("POST", f"/api/v1/projects/{project_id}/tokens", json=body))

    def list_project_tokens(self, project_id: str) -> list[dict[str, Any]]:
        """The project's API tokens, newest first (never the tokens themselves)."""
        return list(self._json("GET", f"/api/v1/projects/{project_id}/tokens"))

    def revoke_project_token(self, project_id: str, token_id: str) -> dict[str, Any]:
        """The revoked token; 404 token_not_found for a token of another project."""
        url = f"/api/v1/projects/{project_id}/tokens/{token_id}/revoke"
        return dict(self._json("POST", url))

    def get_sweep(self, sweep_id: str) -> dict[str, Any]:
        """The sweep and its runs: overrides, status, versions, reward, eval, waste, spend."""
        return dict(self._json("GET", f"/api/v1/sweeps/{sweep_id}"))

    def sweep_action(self, sweep_id: str, action: str, reason: str | None = None) -> dict[str, Any]:
        """pause, resume or cancel every run of the sweep; each run's outcome (moved, or the
        refusal's code when its status does not allow the action)."""
        body = {"reason": reason} if reason else None
        return dict(self._json("POST", f"/api/v1/sweeps/{sweep_id}/{action}", json=body))

    # -- admin: audit ---------------------------------------------------------------------------

    def list_audit(self, *, limit: int = 100, cursor: int | None = None, **filters: Any) -> Any:
        """One page of the audit log, newest first: `entries` and `next_cursor` (None on the
        last page). Filters: action, project_id, token_id, object_type, object_id, outcome,
        since, until (docs/guides/audit.md); a None filter is left out."""
        params = {k: v for k, v in filters.items() if v is not None}
        params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        return dict(self._json("GET", "/api/v1/audit", params=params))

    # -- admin: fleet ---------------------------------------------------------------------------

    def create_registration_token(
        self, *, name: str | None = None, ttl_hours: float = 24.0, max_uses: int = 1
    ) -> dict[str, Any]:
        body = {"name": name, "ttl_hours": ttl_hours, "max_uses": max_uses}
        return dict(self._json("POST", "/api/v1/registration-tokens", json=body))

    def list_workers(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/api/v1/workers"))

    def revoke_worker(self, worker_id: str) -> dict[str, Any]:
        return dict(self._json("POST", f"/api/v1/workers/{worker_id}/revoke"))

    # -- host checks (any token; asyncgrpo doctor) ----------------------------------------------

    def doctor_token(self) -> TokenCheck:
        """The bearer token as the server sees it, and the server's release."""
        answer = self._model(TokenCheck, "GET", "/api/v1/doctor/token")
        assert answer is not None
        return answer

    def doctor_run(self, run_id: str) -> RunModel:
        """The run's base model and tokenizer fingerprint."""
        answer = self._model(RunModel, "GET", f"/api/v1/doctor/runs/{run_id}")
        assert answer is not None
        return answer

    def create_bucket_probe(self) -> BucketProbe:
        answer = self._model(BucketProbe, "POST", "/api/v1/doctor/bucket-probes")
        assert answer is not None
        return answer

    def check_bucket_probe(self, probe_id: str) -> BucketProbeChecked:
        """The probe's object as the server's bucket holds it (then deleted)."""
        path = f"/api/v1/doctor/bucket-probes/{probe_id}"
        answer = self._model(BucketProbeChecked, "DELETE", path)
        assert answer is not None
        return answer

    # -- registration ---------------------------------------------------------------------------

    def register_worker(
        self,
        registration_token: str,
        *,
        name: str,
        gpu_type: str = "cpu",
        gpu_count: int = 1,
        price_per_hour: float = 0.0,
        models: list[str] | None = None,
        environments: list[str] | None = None,
        capabilities: WorkerCapabilities | None = None,
    ) -> dict[str, Any]:
        """201 with the worker id and the worker token (shown once). `environments`: what the
        worker can run (None: single_turn only); `capabilities`: what its engine can load
        (None: every run)."""
        body: dict[str, Any] = {
            "name": name,
            "gpu_type": gpu_type,
            "gpu_count": gpu_count,
            "price_per_hour": price_per_hour,
            "models": models or [],
        }
        if environments is not None:
            body["environments"] = environments
        if capabilities is not None:
            body["capabilities"] = capabilities.model_dump(mode="json")
        return dict(
            self._json("POST", "/api/v1/workers/register", json=body, token=registration_token)
        )

    def register_pool_learner(
        self,
        registration_token: str,
        *,
        name: str,
        model: str,
        tokenizer_fingerprint: str,
        max_runs: int = 1,
        memory_budget_gb: float | None = None,
        gpu_type: str | None = None,
        price_per_hour: float | None = None,
    ) -> sl.LearnerRegistered:
        """201 with the pool learner's id and its pool_learner token (agr_pln_…, shown once)."""
        body = sl.LearnerRegister(
            name=name,
            model=model,
            tokenizer_fingerprint=tokenizer_fingerprint,
            max_runs=max_runs,
            memory_budget_gb=memory_budget_gb,
            gpu_type=gpu_type,
            price_per_hour=price_per_hour,
        )
        return self._learner(
            sl.LearnerRegistered,
            "/api/v1/learners/register",
            body,
            idempotent=False,
            token=registration_token,
        )

    # -- pool learner calls ----------------------------------------------------------------------

    def take_runs(
        self, max_runs: int = 1, memory: sl.LearnerMemory | None = None
    ) -> sl.TakeResponse:
        """Take up to `max_runs` runs that need a learner (an empty `runs` when there is none);
        attach to each within `hold_s`. With `memory`, only runs that fit it beside those held
        (the others in `left`, with the reason). Not keyed (the take has no Idempotency-Key): a
        retry whose first answer was lost finds the run it took in `held`."""
        body = sl.TakeRequest(max=max_runs, memory=memory)
        return self._learner(sl.TakeResponse, "/api/v1/learners/take", body, idempotent=False)

    # -- worker calls (lease engine) -------------------------------------------------------------

    def acquire_lease(
        self, *, models: list[str] | None = None, wait_s: float = 0.0, timeout_s: float = 30.0
    ) -> Lease | None:
        """A lease, or None when nothing is admissible (after the long-poll, if any)."""
        lease, _versions = self.acquire_lease_and_versions(
            models=models, wait_s=wait_s, timeout_s=timeout_s
        )
        return lease

    def acquire_lease_and_versions(
        self,
        *,
        models: list[str] | None = None,
        wait_s: float = 0.0,
        timeout_s: float = 30.0,
        environments: list[str] | None = None,
        capabilities: WorkerCapabilities | None = None,
    ) -> tuple[Lease | None, dict[uuid.UUID, int]]:
        """A lease (or None when nothing is admissible after the long-poll, if any), and the
        current version of every running run of the worker's base models (the answer's
        X-Asyncgrpo-Versions header, on the 200 and on the 204)."""
        body = LeaseAcquireRequest(
            models=models, wait_s=wait_s, environments=environments, capabilities=capabilities
        )
        response = self.request(
            "POST",
            "/api/v1/leases/acquire",
            # a server from before them refuses fields it does not know
            json=_without_none(self._body(body), "environments", "capabilities"),
            timeout_s=wait_s + timeout_s,
            idempotent=True,
        )
        versions = parse_versions_header(response.headers.get(VERSIONS_HEADER))
        if response.status_code == 204:
            return None, versions
        return Lease.model_validate(response.json()), versions

    def wait_versions(
        self, after: Mapping[uuid.UUID, int], *, wait_s: float, timeout_s: float = 30.0
    ) -> list[VersionNotice]:
        """Runs of the worker's base models whose current version is newer than `after` names
        (a run not named: any version past 0), with the adapter download a lease of that
        version carries; waits up to wait_s (capped by the server) for one. [] when none."""
        params = {
            "after": [format_after(run_id, version) for run_id, version in after.items()],
            "wait_s": wait_s,
        }
        found = self._model(
            VersionsResponse, "GET", "/api/v1/versions", params=params, timeout_s=wait_s + timeout_s
        )
        return [] if found is None else found.versions

    def _lease_call(
        self,
        model: type[T],
        lease: Lease,
        op: str,
        body: BaseModel | dict[str, Any],
        timeout_s: float | None = None,
    ) -> T:
        result = self._model(
            model,
            "POST",
            f"/api/v1/leases/{lease.lease_id}/{op}",
            json=self._body(body),
            timeout_s=timeout_s,
            idempotent=op in _KEYED_LEASE_CALLS,
        )
        assert result is not None
        return result

    def heartbeat_lease(self, lease: Lease) -> HeartbeatResponse:
        """Extend the lease; `abort: true` means drop the work (409 raises ConflictError)."""
        return self._lease_call(
            HeartbeatResponse, lease, "heartbeat", HeartbeatRequest(fencing=lease.fencing)
        )

    def heartbeat_leases(self, leases: Sequence[Lease]) -> HeartbeatsResponse:
        """Heartbeats of several held leases in one call; each answered on its own (a lost
        lease is a 404 or 409 entry, not an exception)."""
        body = HeartbeatsRequest(
            leases=[LeaseBeat(lease_id=lease.lease_id, fencing=lease.fencing) for lease in leases]
        )
        result = self._model(
            HeartbeatsResponse, "POST", "/api/v1/leases/heartbeat", json=self._body(body)
        )
        if result is None:
            raise ApiError(204, "unexpected empty answer")
        return result

    def upload_url(self, lease: Lease, *, size: int, sha256: str) -> UploadResponse:
        """A presigned PUT for the lease's batch key, bound to this size and sha256."""
        body = UploadRequest(fencing=lease.fencing, size=size, sha256=sha256)
        return self._lease_call(UploadResponse, lease, "upload", body)

    def complete_lease(self, lease: Lease, manifest: BatchManifest) -> CompleteResponse:
        body = CompleteRequest(fencing=lease.fencing, manifest=manifest)
        return self._lease_call(CompleteResponse, lease, "complete", body)

    def release_lease(
        self,
        lease: Lease,
        *,
        reason: ReleaseReason | None = None,
        timeout_s: float | None = None,
        prompt_row_ids: list[int] | None = None,
    ) -> ReleaseResponse:
        """Prompts back to the front of the queue now (e.g. a spot preemption notice);
        `prompt_row_ids` with reason prompt_too_long: the rows that did not fit."""
        body = ReleaseRequest(fencing=lease.fencing, reason=reason, prompt_row_ids=prompt_row_ids)
        json = _without_none(self._body(body), "prompt_row_ids")
        return self._lease_call(ReleaseResponse, lease, "release", json, timeout_s)

    # -- learner calls ---------------------------------------------------------------------------

    def _learner(
        self,
        model: type[T],
        path: str,
        body: BaseModel,
        idempotent: bool | str = True,
        **kwargs: Any,
    ) -> T:
        result = self._model(
            model, "POST", path, json=self._body(body), idempotent=idempotent, **kwargs
        )
        if result is None:
            raise ApiError(204, "unexpected empty answer")
        return result

    def learner_attach(
        self,
        run_id: str,
        tokenizer_fingerprint: str,
        *,
        name: str = "learner",
        reward_names: list[str] | None = None,
        model: str | None = None,
    ) -> sl.AttachResponse:
        """Become the run's one learner (409 while another learner's lease is live, when
        `reward_names` lacks one of the run's rewards: the run is then failed, or when `model`
        is not the run's base model)."""
        body = sl.AttachRequest(
            tokenizer_fingerprint=tokenizer_fingerprint,
            name=name,
            reward_names=reward_names,
            model=model,
        )
        return self._learner(sl.AttachResponse, f"/api/v1/runs/{run_id}/learner/attach", body)

    def learner_heartbeat(self, run_id: str, fencing: int) -> sl.HeartbeatResponse:
        body = sl.HeartbeatRequest(fencing=fencing)
        path = f"/api/v1/runs/{run_id}/learner/heartbeat"
        return self._learner(sl.HeartbeatResponse, path, body, idempotent=False)

    def fail_run(self, run_id: str, fencing: int, reason: str) -> sl.FailResponse:
        """Report an error a restart cannot fix: the run becomes `failed` with this reason."""
        body = sl.FailRequest(fencing=fencing, reason=reason[:2000])
        return self._learner(sl.FailResponse, f"/api/v1/runs/{run_id}/learner/fail", body)

    def claim_batches(
        self,
        run_id: str,
        fencing: int,
        max_groups: int,
        *,
        wait_s: float = 0.0,
        target_version: int | None = None,
    ) -> sl.ClaimResponse:
        """Next accepted batches (long-poll up to wait_s, capped by the server), claimed to be
        trained into target_version (None: current + 1). A publish that has meanwhile reached
        target_version makes it a 409 (ConflictError whose body names current_version)."""
        body = sl.ClaimRequest(
            fencing=fencing, max_groups=max_groups, wait_s=wait_s, target_version=target_version
        )
        path = f"/api/v1/runs/{run_id}/batches/claim"
        return self._learner(sl.ClaimResponse, path, body, timeout_s=wait_s + 30.0)

    def reject_batch(
        self,
        run_id: str,
        batch_id: str,
        fencing: int,
        reason: sl.RejectReason,
        detail: str | None = None,
    ) -> sl.RejectResponse:
        body = sl.RejectRequest(fencing=fencing, reason=reason, detail=detail)
        path = f"/api/v1/runs/{run_id}/batches/{batch_id}/reject"
        return self._learner(sl.RejectResponse, path, body)

    def request_uploads(self, run_id: str, body: sl.UploadsRequest) -> sl.UploadsResponse:
        """Presigned conditional PUTs for version N+1's adapter and checkpoint files."""
        return self._learner(sl.UploadsResponse, f"/api/v1/runs/{run_id}/uploads", body)

    def publish_adapter(
        self, run_id: str, body: sl.PublishRequest, idempotency_key: str | None = None
    ) -> sl.PublishResponse:
        """Register version N+1 and consume the batches it was trained on. `idempotency_key`:
        the caller's key for this publish, when it may send the same body again after an answer
        it never got (protocol.idempotency.new_key); else one key for this call's retries."""
        path = f"/api/v1/runs/{run_id}/adapters"
        return self._learner(sl.PublishResponse, path, body, idempotent=idempotency_key or True)

    def post_learner_metrics(
        self, run_id: str, fencing: int, points: list[sl.MetricPointIn]
    ) -> sl.MetricsAccepted:
        body = sl.MetricsRequest(fencing=fencing, points=points)
        return self._learner(sl.MetricsAccepted, f"/api/v1/runs/{run_id}/metrics", body)

    def spot_check(self, run_id: str, body: sl.SpotCheckRequest) -> sl.SpotCheckResponse:
        return self._learner(sl.SpotCheckResponse, f"/api/v1/runs/{run_id}/spot-checks", body)

    # -- evaluation during training ------------------------------------------------------------

    def claim_evals(
        self, run_id: str, fencing: int, *, max_batches: int = 4, wait_s: float = 0.0
    ) -> sl.EvalClaimResponse:
        """Uploaded eval batches, claimed by this learner (long-poll up to wait_s)."""
        body = sl.EvalClaimRequest(fencing=fencing, max_batches=max_batches, wait_s=wait_s)
        path = f"/api/v1/runs/{run_id}/evals/claim"
        return self._learner(sl.EvalClaimResponse, path, body, timeout_s=wait_s + 30.0)

    def post_eval_results(self, run_id: str, body: sl.EvalResultsRequest) -> sl.EvalResultsResponse:
        """The scores of one claimed eval batch's samples."""
        return self._learner(sl.EvalResultsResponse, f"/api/v1/runs/{run_id}/evals", body)

    def run_evals(self, run_id: str) -> dict[str, Any]:
        """Eval results per version (admin)."""
        return self._json("GET", f"/api/v1/runs/{run_id}/evals")  # type: ignore[no-any-return]


def _without_none(body: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The body without these optional fields when unset (servers from before them refuse
    unknown fields)."""
    return {k: v for k, v in body.items() if not (k in keys and v is None)}
