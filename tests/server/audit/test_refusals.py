"""Refused calls (401, 403) are recorded in a transaction of their own, at most
`audit.refusals_per_minute` a minute per (source, token prefix), the rest counted in one
suppressed entry; the source address is the connection's, or X-Forwarded-For's only from a
trusted proxy (docs/guides/audit.md, "Refused calls" and "Behind a proxy")."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from server.audit.source import networks, source_address
from tests.conftest import make_settings, mint_token
from tests.server.audit.conftest import bearer, entries

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def audit_app(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    from server.app import create_app

    audit = {"refusals_per_minute": 3, "trusted_proxies": ["10.0.0.0/8"]}
    application = create_app(make_settings(db_url, tmp_path / "bucket", audit=audit), migrate=True)
    yield application
    application.state.engine.dispose()


def _client(app: Any, address: str) -> TestClient:
    return TestClient(app, client=(address, 40000))


def test_refusals_are_recorded_with_the_token_when_known(audit_app: Any) -> None:
    worker = mint_token(audit_app, "worker", name="w-7", scope_id=uuid.uuid4())
    with _client(audit_app, "192.0.2.7") as client:
        assert client.get("/api/v1/runs").status_code == 401
        assert client.get("/api/v1/runs", headers=bearer(worker)).status_code == 403
        assert (
            client.post("/api/v1/projects", json={"name": "x"}, headers=bearer(worker)).status_code
            == 403
        )
    missing, wrong_kind, project = entries(audit_app)
    assert (missing.action, missing.outcome, missing.token_id) == (
        "GET /api/v1/runs",
        "unauthorized",
        None,
    )
    assert missing.detail == {"status": 401, "code": "token_missing"}
    assert (wrong_kind.outcome, wrong_kind.role, wrong_kind.token_name) == (
        "forbidden",
        "worker",
        "w-7",
    )
    assert wrong_kind.detail == {"status": 403, "code": "token_kind_forbidden"}
    assert (project.action, project.object_type) == ("project.create", None)
    assert {e.source for e in (missing, wrong_kind, project)} == {"192.0.2.7"}


def test_a_refused_worker_call_is_recorded_though_worker_calls_are_not(audit_app: Any) -> None:
    """The lease calls are not audited (the hot path), but a refused one is a refusal."""
    with _client(audit_app, "192.0.2.10") as client:
        answer = client.post("/api/v1/leases/acquire", json={}, headers=bearer("agr_wkr_nope"))
        assert answer.status_code == 401
    [entry] = entries(audit_app)
    assert (entry.action, entry.outcome) == ("POST /api/v1/leases/acquire", "unauthorized")


def test_refusals_past_the_limit_are_counted_in_one_entry(audit_app: Any) -> None:
    worker = mint_token(audit_app, "worker", name="w", scope_id=uuid.uuid4())
    with _client(audit_app, "192.0.2.8") as client:
        for _ in range(7):
            assert client.get("/api/v1/runs", headers=bearer("agr_adm_guessed")).status_code == 401
        # another token prefix from the same address has a window of its own
        assert client.get("/api/v1/runs", headers=bearer(worker)).status_code == 403
    with _client(audit_app, "192.0.2.9") as client:  # and so has another address
        assert client.get("/api/v1/runs").status_code == 401
    rows = entries(audit_app)
    guessed = [r for r in rows if r.source == "192.0.2.8" and r.token_prefix is None]
    assert [r.outcome for r in guessed] == ["unauthorized"] * 3 + ["suppressed"]
    assert guessed[-1].count == 4
    assert sum(r.count for r in guessed) == 7  # every refusal is counted, none dropped
    assert [r.outcome for r in rows if r.role == "worker"] == ["forbidden"]
    assert [r.outcome for r in rows if r.source == "192.0.2.9"] == ["unauthorized"]


def test_a_forwarded_address_is_read_from_trusted_proxies_only(audit_app: Any) -> None:
    admin = bearer(mint_token(audit_app, "admin", name="a"))
    forwarded = {**admin, "X-Forwarded-For": "203.0.113.5, 10.1.2.3"}
    with _client(audit_app, "10.0.0.2") as proxied:  # a trusted proxy
        assert (
            proxied.post("/api/v1/projects", json={"name": "a"}, headers=forwarded).status_code
            == 201
        )
    with _client(audit_app, "198.51.100.1") as direct:  # anyone else: the header is ignored
        assert (
            direct.post("/api/v1/projects", json={"name": "b"}, headers=forwarded).status_code
            == 201
        )
    assert [e.source for e in entries(audit_app)] == ["203.0.113.5", "198.51.100.1"]


def _request(peer: str, forwarded: str | None) -> Request:
    headers = [] if forwarded is None else [(b"x-forwarded-for", forwarded.encode())]
    return Request({"type": "http", "client": (peer, 1), "headers": headers})


@pytest.mark.parametrize(
    ("peer", "forwarded", "recorded"),
    [
        ("10.0.0.1", "203.0.113.5", "203.0.113.5"),
        ("10.0.0.1", "1.1.1.1, 203.0.113.5, 10.0.0.9", "203.0.113.5"),  # the nearest untrusted
        ("10.0.0.1", None, "10.0.0.1"),
        ("10.0.0.1", "10.0.0.7", "10.0.0.7"),  # only proxies: the farthest one
        ("192.0.2.1", "203.0.113.5", "192.0.2.1"),  # not a proxy: its header is not believed
        ("::1", "203.0.113.5", "::1"),
    ],
)
def test_source_address(peer: str, forwarded: str | None, recorded: str) -> None:
    assert source_address(_request(peer, forwarded), networks(["10.0.0.0/8"])) == recorded
