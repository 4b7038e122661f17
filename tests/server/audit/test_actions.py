"""Invariant 30: every state-changing route is in exactly one of server/audit/actions.py's
tables, and every audited one records through the request's audit
(docs/architecture/security.md, "The audit log"): a new route that decides neither fails here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastapi.routing
import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from server.audit import actions
from server.audit.recorder import audit_of
from tests.conftest import make_settings

pytestmark = pytest.mark.timeout(60)

CHANGING = {"POST", "PUT", "PATCH", "DELETE"}


def _routes(tmp_path: Path) -> Iterator[Any]:
    from server.app import create_app

    sqlite = f"sqlite:///{tmp_path / 'never-opened.db'}"
    app = create_app(make_settings(sqlite, tmp_path / "bucket"), migrate=False)
    for context in fastapi.routing.iter_route_contexts(app.routes):
        if isinstance(context.original_route, APIRoute):
            yield context


def _calls(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


def test_every_state_changing_route_is_audited_or_says_why_not(tmp_path: Path) -> None:
    seen: set[tuple[str, str]] = set()
    undecided, both, unrecorded = [], [], []
    for route in _routes(tmp_path):
        for method in sorted(set(route.methods) & CHANGING):
            key = (method, route.path_format)
            seen.add(key)
            if key in actions.AUDITED and key in actions.NOT_AUDITED:
                both.append(key)
            elif key not in actions.AUDITED and key not in actions.NOT_AUDITED:
                undecided.append(key)
            elif key in actions.AUDITED and audit_of not in set(_calls(route.dependant)):
                unrecorded.append(key)
    assert not undecided, (
        f"add these to server/audit/actions.py AUDITED or NOT_AUDITED: {undecided}"
    )
    assert not both, both
    assert not unrecorded, f"audited routes whose handler takes no AuditDep: {unrecorded}"
    stale = (set(actions.AUDITED) | set(actions.NOT_AUDITED)) - seen
    assert not stale, f"no such routes: {stale}"


def test_an_action_takes_its_path_parameter() -> None:
    assert actions.action_of("POST", "/runs/{run_id}/{action}", {"action": "pause"}) == "run.pause"
    assert actions.action_of("POST", "/api/v1/runs", {}) == "run.create"
    assert actions.action_of("POST", "/api/v1/leases/acquire", {}) is None
    # a refused call's unvalidated path parameter never becomes part of a name
    bogus = {"run_id": "x", "action": "Robert'); DROP"}
    assert actions.action_of("POST", "/runs/{run_id}/{action}", bogus) == "run.{action}"
