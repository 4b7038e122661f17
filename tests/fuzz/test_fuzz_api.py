"""API fuzzing (issue 9, item 3): schemathesis against the control plane's own OpenAPI schema,
in-process over ASGI, on a fresh Postgres database holding real objects made through the API
(tests/fuzz/seed.py).

- no 5xx: every operation, positive and negative generated requests (explicit examples, the
  coverage phase's boundary values, then fuzzing), sent with the token kind the operation takes
  and, where it has path ids, sent again at the real objects, never gets a 5xx, and responses
  conform to the schema where the response is declared;
- no ignored auth: every operation outside the open set answers 401 without a token or with a
  malformed one, and 403 to each other token kind (worker tokens on learner/admin calls, ...);
  the dashboard's pages redirect to /login without a session (a bearer token is no session);
- unknown body fields: 422 naming the field, on every operation with a JSON body.

Bounded and deterministic: a fixed number of examples per operation, a fixed seed,
derandomized Hypothesis, no example database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from tests.conftest import make_settings
from tests.fuzz.driver import run_operations
from tests.fuzz.operations import (
    ALSO_ACCEPTED,
    DASHBOARD_OPEN,
    KINDS,
    OPEN_OPERATIONS,
    bearer_kinds,
    dashboard_pages,
    fill_path,
    real_path_ids,
    schema_security,
)
from tests.fuzz.seed import Seeded, seed

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(240)]

CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]
MAX_EXAMPLES = 5  # per operation in the fuzzing phase (plus examples and coverage cases)
AUTH_EXAMPLES = 2  # auth is decided before the body is read: a few requests per operation do
UNKNOWN_FIELD = "x_fuzz_unknown_field"


@dataclass
class FuzzEnv:
    app: FastAPI
    seeded: Seeded
    kinds: dict[tuple[str, str], frozenset[str]]

    def taken(self, case: Any) -> frozenset[str]:
        """The token kinds the operation takes (none: an open one)."""
        return self.kinds[(case.operation.method.upper(), case.operation.path)]

    def kind(self, case: Any) -> str | None:
        """A token kind the operation takes (the first by name), or None for an open one."""
        return min(self.taken(case), default=None)

    def headers(self, kind: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.seeded.token(kind)}"} if kind else {}

    def real_ids(self, case: Any) -> dict[str, str]:
        real = real_path_ids(self.seeded, case.operation.method.upper(), case.operation.path)
        return {name: real[name] for name in case.path_parameters or {} if name in real}


@pytest.fixture
def fuzz_env(pg_url: str, tmp_path: Path) -> Iterator[FuzzEnv]:
    from server.app import create_app

    app = create_app(make_settings(pg_url, tmp_path / "bucket"), migrate=True)
    seeded = seed(app)
    yield FuzzEnv(app, seeded, bearer_kinds(app))
    app.state.engine.dispose()


def load_schema(
    env: FuzzEnv, *, mode: str, max_examples: int, coverage: bool, allow_x00: bool = True
) -> Any:
    """The app's schema with a fixed seed; `coverage` adds schemathesis' coverage phase (boundary
    and malformed values of every parameter) to the explicit examples and the fuzzing phase."""
    config = schemathesis.Config.from_dict(
        {
            "seed": 0,
            "phases": {"coverage": {"enabled": coverage}},
            "generation": {
                "mode": mode,
                "max-examples": max_examples,
                "deterministic": True,
                "with-security-parameters": False,
                "allow-x00": allow_x00,
                "database": "none",
            },
        }
    )
    return schemathesis.openapi.from_asgi("/openapi.json", env.app, config=config)


def test_open_operations_are_exactly_the_expected_ones(fuzz_env: FuzzEnv) -> None:
    """Every operation but the open ones declares bearer security and has a guard of one kind
    (or of every kind: the host checks); a new unauthenticated endpoint fails here until it is
    added to OPEN_OPERATIONS on purpose. Likewise every dashboard page but the login page
    demands a session."""
    security = schema_security(fuzz_env.app.openapi())
    open_ops = {key for key, secured in security.items() if not secured}
    assert open_ops == OPEN_OPERATIONS
    for key, secured in security.items():
        kinds = fuzz_env.kinds[key]
        assert bool(kinds) == secured, (key, kinds)
        assert kinds <= set(KINDS), (key, kinds)
    pages = dashboard_pages(fuzz_env.app)
    assert pages, "the dashboard has no pages"
    assert {key for key, protected in pages.items() if not protected} == DASHBOARD_OPEN


def _send_and_check(case: Any, headers: dict[str, str]) -> None:
    """Send and validate (in-process, an unhandled exception reaches the caller and fails)."""
    case.validate_response(case.call(headers=headers), checks=CHECKS, headers=headers)


@pytest.mark.timeout(600)  # ~70 s of CPU; wall time grows with contention on 2 cores
def test_no_server_errors(fuzz_env: FuzzEnv, subtests: Any) -> None:
    """Positive and negative requests with the operation's own token kind: no 5xx, and the
    response conforms where the schema declares it; again at the real objects' ids."""

    def check(case: Any) -> None:
        headers = fuzz_env.headers(fuzz_env.kind(case))
        _send_and_check(case, headers)
        real = fuzz_env.real_ids(case)
        if real:
            case.path_parameters = {**case.path_parameters, **real}
            _send_and_check(case, headers)

    schema = load_schema(fuzz_env, mode="all", max_examples=MAX_EXAMPLES, coverage=True)
    run_operations(schema, check, subtests)


def _status(case: Any, headers: dict[str, str]) -> int:
    return int(case.call(headers=headers).status_code)


def test_no_ignored_auth(fuzz_env: FuzzEnv, subtests: Any) -> None:
    """No token or a malformed one: 401; a valid token of a kind the operation does not take (a
    worker token on a learner or admin call, ...): 403 — on every operation outside the open
    set, at real ids."""

    def check(case: Any) -> None:
        kind = fuzz_env.kind(case)
        if kind is None:
            return
        case.path_parameters = {**(case.path_parameters or {}), **fuzz_env.real_ids(case)}
        forged = f"agr_{kind[:3]}_" + uuid.uuid4().hex
        unauthenticated = {
            "no header": {},
            "empty bearer": {"Authorization": "Bearer "},
            "basic scheme": {"Authorization": "Basic YWRtaW46YWRtaW4="},
            "garbage": {"Authorization": "Bearer not-a-token"},
            "forged prefix": {"Authorization": f"Bearer {forged}"},
        }
        got = {name: _status(case, headers) for name, headers in unauthenticated.items()}
        assert got == dict.fromkeys(unauthenticated, 401), (case.operation.label, got)
        taken = fuzz_env.taken(case)
        accepted = taken.union(*(ALSO_ACCEPTED.get(k, frozenset()) for k in taken))
        others = [k for k in KINDS if k not in accepted]
        got = {k: _status(case, fuzz_env.headers(k)) for k in others}
        assert got == dict.fromkeys(others, 403), (case.operation.label, got)

    # No NUL in bodies here: text Postgres cannot store is refused (422) before authentication,
    # like malformed JSON; this test is about tokens.
    schema = load_schema(
        fuzz_env, mode="positive", max_examples=AUTH_EXAMPLES, coverage=False, allow_x00=False
    )
    run_operations(schema, check, subtests)


def test_unknown_body_fields_are_refused(fuzz_env: FuzzEnv, subtests: Any) -> None:
    """A generated body plus one unknown top-level field, with the right token at real ids:
    422 naming that field (request models forbid extra fields)."""
    checked: list[str] = []

    def check(case: Any) -> None:
        if case.operation.body is None or not len(case.operation.body):
            return
        body = case.body if isinstance(case.body, dict) else {}
        case.body = {**body, UNKNOWN_FIELD: 1}
        case.path_parameters = {**(case.path_parameters or {}), **fuzz_env.real_ids(case)}
        response = case.call(headers=fuzz_env.headers(fuzz_env.kind(case)))
        assert response.status_code == 422, (case.operation.label, response.text)
        fields = [e["field"] for e in response.json()["errors"]]
        assert UNKNOWN_FIELD in fields, (case.operation.label, fields)
        checked.append(case.operation.label)

    schema = load_schema(fuzz_env, mode="positive", max_examples=1, coverage=False, allow_x00=False)
    run_operations(schema, check, subtests)
    assert len(set(checked)) >= 15, sorted(set(checked))


def test_dashboard_pages_need_a_session(fuzz_env: FuzzEnv) -> None:
    """Every protected dashboard page, without a session cookie, with a forged one, or with an
    admin bearer header (a token is not a session): a redirect to /login, never a page."""
    pages = {k for k, protected in dashboard_pages(fuzz_env.app).items() if protected}
    attempts: list[tuple[dict[str, str], dict[str, str]]] = [
        ({}, {}),
        ({}, {"agr_session": "forged.session.value"}),
        (fuzz_env.headers("admin"), {}),
    ]
    with TestClient(fuzz_env.app, follow_redirects=False) as client:
        for method, path in sorted(pages):
            url = fill_path(path, fuzz_env.seeded)
            for headers, cookies in attempts:
                client.cookies.clear()
                client.cookies.update(cookies)
                response = client.request(method, url, headers=headers)
                assert response.status_code == 303, (method, url, response.status_code)
                assert response.headers["location"] == "/login", (method, url)
