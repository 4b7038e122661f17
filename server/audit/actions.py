"""Every state-changing route (POST, PUT, PATCH, DELETE) of the app, in exactly one of two
tables: AUDITED, the action name its entry carries, or NOT_AUDITED, why it writes none
(docs/architecture/security.md, "The audit log"). tests/server/audit/test_actions.py walks the
app's routes and fails for a state-changing route in neither table, so a new route cannot skip
the decision. An action name may take a path parameter, e.g. `run.{action}`."""

from __future__ import annotations

import re
import string

Route = tuple[str, str]  # (method, path as the app declares it)

AUDITED: dict[Route, str] = {
    # runs, sweeps and projects
    ("POST", "/api/v1/runs"): "run.create",
    ("POST", "/api/v1/runs/{run_id}/pause"): "run.pause",
    ("POST", "/api/v1/runs/{run_id}/resume"): "run.resume",
    ("POST", "/api/v1/runs/{run_id}/cancel"): "run.cancel",
    ("POST", "/api/v1/sweeps"): "sweep.create",
    ("POST", "/api/v1/sweeps/{sweep_id}/pause"): "sweep.pause",
    ("POST", "/api/v1/sweeps/{sweep_id}/resume"): "sweep.resume",
    ("POST", "/api/v1/sweeps/{sweep_id}/cancel"): "sweep.cancel",
    ("POST", "/api/v1/projects"): "project.create",
    ("PATCH", "/api/v1/projects/{project_id}"): "project.rename",
    ("POST", "/api/v1/projects/{project_id}/tokens"): "token.create",
    ("POST", "/api/v1/projects/{project_id}/tokens/{token_id}/revoke"): "token.revoke",
    # datasets
    ("POST", "/api/v1/datasets"): "dataset.upload",
    ("DELETE", "/api/v1/datasets/{dataset_id}"): "dataset.delete",
    # tokens and sessions
    ("POST", "/api/v1/registration-tokens"): "token.create",
    ("POST", "/api/v1/registration-tokens/{token_id}/revoke"): "token.revoke",
    ("POST", "/api/v1/admin-tokens/{token_id}/revoke"): "token.revoke",
    ("POST", "/api/v1/dashboard-sessions/revoke-all"): "dashboard.logout_everywhere",
    # workers and pool learners
    ("POST", "/api/v1/workers/register"): "worker.register",
    ("POST", "/api/v1/workers/{worker_id}/trust"): "worker.trust",
    ("POST", "/api/v1/workers/{worker_id}/untrust"): "worker.untrust",
    ("POST", "/api/v1/workers/{worker_id}/revoke"): "worker.revoke",
    ("POST", "/api/v1/learners/register"): "learner.register",
    ("POST", "/api/v1/learners/{learner_id}/revoke"): "learner.revoke",
    # the dashboard's forms: the same actions as the API's
    ("POST", "/login"): "dashboard.login",
    ("POST", "/logout"): "dashboard.logout",
    ("POST", "/tokens/{kind}/{token_id}/revoke"): "token.revoke",
    ("POST", "/sessions/revoke-all"): "dashboard.logout_everywhere",
    ("POST", "/runs/new"): "run.create",
    ("POST", "/projects"): "project.create",
    ("POST", "/projects/{project_id}/rename"): "project.rename",
    ("POST", "/runs/{run_id}/{action}"): "run.{action}",
    ("POST", "/workers/{worker_id}/revoke"): "worker.revoke",
    ("POST", "/workers/{worker_id}/trust"): "worker.trust",
    ("POST", "/workers/{worker_id}/untrust"): "worker.untrust",
    ("POST", "/workers/registration-tokens"): "token.create",
    ("POST", "/learners/{learner_id}/revoke"): "learner.revoke",
}

_WORKER = (
    "a worker's lease traffic, the hot path: many calls a second per worker; its register and "
    "revoke are audited, and a refused call is recorded as a refusal"
)
_LEARNER = (
    "a run's learner at work, the hot path (the run's own token or the pool learner holding "
    "it); the run's events record what it changed, and a refused call is recorded as a refusal"
)
NOT_AUDITED: dict[Route, str] = {
    ("POST", "/api/v1/leases/acquire"): _WORKER,
    ("POST", "/api/v1/leases/heartbeat"): _WORKER,
    ("POST", "/api/v1/leases/{lease_id}/heartbeat"): _WORKER,
    ("POST", "/api/v1/leases/{lease_id}/upload"): _WORKER,
    ("POST", "/api/v1/leases/{lease_id}/complete"): _WORKER,
    ("POST", "/api/v1/leases/{lease_id}/release"): _WORKER,
    ("POST", "/api/v1/runs/{run_id}/learner/attach"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/learner/heartbeat"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/learner/fail"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/batches/claim"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/batches/{batch_id}/reject"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/uploads"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/adapters"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/metrics"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/spot-checks"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/evals/claim"): _LEARNER,
    ("POST", "/api/v1/runs/{run_id}/evals"): _LEARNER,
    ("POST", "/api/v1/learners/take"): _LEARNER,
    ("POST", "/api/v1/doctor/bucket-probes"): "a host check of `asyncgrpo doctor`: a probe "
    "object written and read back, no control-plane state",
    ("DELETE", "/api/v1/doctor/bucket-probes/{probe_id}"): "a host check of `asyncgrpo "
    "doctor`: the probe object deleted, no control-plane state",
    ("PUT", "/blobs/{key}"): "the data path: an upload to a signed URL, which carries its own "
    "signature and no token; the call that signed it is the caller's",
}


# A path parameter fills an action name only when it looks like one: a refused call's path
# parameters were never validated, and the log must not carry whatever a caller typed.
_NAME_PART = re.compile(r"^[a-z_]{1,32}$")


def action_of(method: str, path: str, path_params: dict[str, str]) -> str | None:
    """The action name of an audited route with its path parameters filled in; None for a
    route that is not audited."""
    name = AUDITED.get((method, path))
    if name is None:
        return None
    fields = [field for _, field, _, _ in string.Formatter().parse(name) if field]
    values = {field: str(path_params.get(field, "")) for field in fields}
    if not all(_NAME_PART.match(value) for value in values.values()):
        return name
    return name.format(**values)
