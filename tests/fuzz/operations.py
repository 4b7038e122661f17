"""Which token kind each API operation takes, read from the app itself (the bearer scheme its
route's dependencies read, and its OpenAPI security), and the real ids the fuzzer substitutes
into path parameters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fastapi.routing
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from server import deps
from server.models.project import DEFAULT_PROJECT_ID
from server.tokens.access import CALLER_KINDS as CALLER
from server.tokens.auth import ALL_KINDS
from tests.fuzz.seed import Seeded

KINDS = ("admin", "project", "registration", "worker", "learner", "pool_learner")
# Kinds a scheme's guard takes beside its own: a run's learner calls (the LearnerToken scheme)
# take a pool learner's token too, whose reach (the runs it holds, else 403 run_not_held, after
# the body is validated) the service checks: tests/server/learners/test_reach.py.
ALSO_ACCEPTED = {"learner": frozenset({"pool_learner"})}
# The host checks' `require_any_token` reads these schemes.
ANY_TOKEN_KINDS = frozenset(ALL_KINDS)
# The calls of runs, sweeps, datasets and projects read both (server/tokens/access.py); the
# fuzzer calls them with its admin token; a project token's answers there (404 for another
# project's objects, 403 for a role's missing right) are tests/server/tokens/test_access.py's.
CALLER_KINDS = frozenset(CALLER)

# Operations that take no bearer token (docs/architecture/protocol.md, "Open calls and the
# dashboard": /healthz and /metrics are open; /blobs/* URLs carry their own signature). /docs and
# /openapi.json are not in the schema.
OPEN_OPERATIONS = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/blobs/{key}"),
    ("PUT", "/blobs/{key}"),
}


def _calls(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


def _api_routes(app: FastAPI) -> Iterator[Any]:
    """The app's API routes with their full paths. FastAPI >= 0.16x keeps included routers as
    branches (iter_route_contexts flattens them); older versions list APIRoutes directly."""
    iter_contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if iter_contexts is None:
        yield from (r for r in app.routes if isinstance(r, APIRoute))
        return
    for context in iter_contexts(app.routes):
        if isinstance(context.original_route, APIRoute):
            yield context


def bearer_kinds(app: FastAPI) -> dict[tuple[str, str], frozenset[str]]:
    """(METHOD, path) -> the token kinds whose bearer schemes (server/request_deps.py
    BEARER_SCHEMES) its dependencies read: one kind for most operations, admin and project for
    the calls a project token may make, every process kind for the host checks
    (server/tokens/auth.py `require_any_token`), none for the open ones."""
    schemes = deps.BEARER_SCHEMES.items()
    found: dict[tuple[str, str], frozenset[str]] = {}
    for route in _api_routes(app):
        calls = list(_calls(route.dependant))
        kinds = frozenset(kind for kind, scheme in schemes if any(c is scheme for c in calls))
        assert len(kinds) <= 1 or kinds in (ANY_TOKEN_KINDS, CALLER_KINDS), (route.path, kinds)
        for method in route.methods:
            # Starlette's `{key:path}` converter appears as `{key}` in the OpenAPI schema.
            found[(method, route.path_format)] = kinds
    return found


def schema_security(schema: dict[str, Any]) -> dict[tuple[str, str], bool]:
    """(METHOD, path) -> whether the OpenAPI operation declares a security requirement."""
    out: dict[tuple[str, str], bool] = {}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            out[(method.upper(), path)] = bool(operation.get("security"))
    return out


def real_path_ids(seeded: Seeded, method: str, path: str) -> dict[str, str]:
    """Real ids for the path parameters of an operation. Destructive admin calls get the victim
    run / worker so that they do not end the live ones the other operations need."""
    destructive_run = method == "POST" and path.rsplit("/", 1)[-1] in {"pause", "resume", "cancel"}
    revoke = path.endswith("/revoke")
    return {
        "run_id": str(seeded.victim_run_id if destructive_run else seeded.run_id),
        "worker_id": str(seeded.victim_worker_id if revoke else seeded.worker_id),
        "lease_id": str(seeded.lease_id),
        "batch_id": str(seeded.batch_id),
        "version": "latest",
        # No such token: revoking the fuzzer's own admin token would end the other operations.
        "token_id": "00000000-0000-4000-8000-000000000000",
        # No pool learner is seeded: its revoke answers 404.
        "learner_id": "00000000-0000-4000-8000-000000000000",
        # The default project, which every database has (the dashboard's rename form).
        "project_id": str(DEFAULT_PROJECT_ID),
    }


# Dashboard pages (not in the OpenAPI schema) that need no session: the login page and form,
# and `/`, which only redirects to /runs.
# the API docs (Swagger UI served from the package) and the icon are public, as /openapi.json is
DASHBOARD_OPEN = {
    ("GET", "/"),
    ("GET", "/login"),
    ("POST", "/login"),
    ("GET", "/docs"),
    ("GET", "/favicon.ico"),
}


def dashboard_pages(app: FastAPI) -> dict[tuple[str, str], bool]:
    """(METHOD, path) -> whether the page demands a dashboard login, for the routes left out
    of the OpenAPI schema."""
    from server.dashboard import web

    guards = {web.require_login, web.require_csrf}
    pages: dict[tuple[str, str], bool] = {}
    for route in _api_routes(app):
        if route.include_in_schema:
            continue
        protected = any(c in guards for c in _calls(route.dependant))
        for method in route.methods:
            pages[(method, route.path_format)] = protected
    return pages


def fill_path(path: str, seeded: Seeded) -> str:
    """The path with its parameters set to real objects (or plausible values)."""
    values = {
        **real_path_ids(seeded, "GET", path),
        "action": "pause",
        "kind": "registration",
        "name": "adapter_model.safetensors",
    }
    for name, value in values.items():
        path = path.replace("{" + name + "}", value)
    assert "{" not in path, path
    return path
