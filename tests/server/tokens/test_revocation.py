"""Issue 17 items 7 and 8 on both databases: dashboard sessions end server-side (logout, token
revocation, log out everywhere) and admin and registration tokens are revocable (API, CLI,
dashboard), with a guard against revoking the last live admin token."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import make_settings, mint_token
from tests.server.dashboard.test_pages import login


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _token_id(client: TestClient, headers: dict[str, str], kind: str, token: str) -> str:
    rows = client.get(f"/api/v1/{kind}-tokens", headers=headers).json()
    (row,) = [r for r in rows if token.startswith(r["prefix"])]
    return str(row["id"])


def _resume_from_old_cookie(client: TestClient, csrf: str) -> int:
    r = client.post(
        f"/runs/{uuid.uuid4()}/resume", data={"csrf_token": csrf}, follow_redirects=False
    )
    return r.status_code


def test_logout_ends_the_session_even_for_a_kept_copy_of_the_cookie(
    client: TestClient, admin_token: str
) -> None:
    csrf = login(client, admin_token)
    kept = client.cookies["agr_session"]
    assert (
        client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False).status_code == 303
    )
    client.cookies.set("agr_session", kept)  # the attacker's copy, replayed after logout
    assert client.get("/runs", follow_redirects=False).headers["location"] == "/login"
    assert _resume_from_old_cookie(client, csrf) == 303  # to /login: nothing was done


def test_revoking_an_admin_token_ends_its_sessions_only(
    client: TestClient, app, admin_token: str
) -> None:  # type: ignore[no-untyped-def]
    other = mint_token(app, "admin", name="other")
    other_client = TestClient(app)
    login(other_client, other)
    csrf = login(client, admin_token)
    r = client.post(
        f"/api/v1/admin-tokens/{_token_id(client, _bearer(admin_token), 'admin', other)}/revoke",
        headers=_bearer(admin_token),
    )
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    assert other_client.get("/runs", follow_redirects=False).status_code == 303
    assert client.get("/runs", follow_redirects=False).status_code == 200
    assert client.get("/api/v1/runs", headers=_bearer(other)).status_code == 401
    assert _resume_from_old_cookie(client, csrf) == 404  # still logged in: the run is unknown


def test_the_last_live_admin_token_needs_force(client: TestClient, admin_token: str) -> None:
    headers = _bearer(admin_token)
    token_id = _token_id(client, headers, "admin", admin_token)
    r = client.post(f"/api/v1/admin-tokens/{token_id}/revoke", headers=headers)
    assert r.status_code == 409 and "last live admin token" in r.json()["detail"]
    assert client.get("/api/v1/runs", headers=headers).status_code == 200
    r = client.post(f"/api/v1/admin-tokens/{token_id}/revoke?force=true", headers=headers)
    assert r.status_code == 200
    assert client.get("/api/v1/runs", headers=headers).status_code == 401


def test_unknown_or_wrong_kind_is_404(client: TestClient, app, admin_token: str) -> None:  # type: ignore[no-untyped-def]
    headers = _bearer(admin_token)
    registration = client.post("/api/v1/registration-tokens", json={}, headers=headers).json()
    for path in (
        f"/api/v1/admin-tokens/{uuid.uuid4()}/revoke",
        f"/api/v1/admin-tokens/{registration['id']}/revoke",
    ):
        assert client.post(path, headers=headers).status_code == 404


def test_registration_token_revoked_through_the_api(client: TestClient, admin_token: str) -> None:
    headers = _bearer(admin_token)
    minted = client.post("/api/v1/registration-tokens", json={"max_uses": 5}, headers=headers)
    body = minted.json()
    r = client.post(f"/api/v1/registration-tokens/{body['id']}/revoke", headers=headers)
    assert r.status_code == 200 and r.json()["kind"] == "registration"
    r = client.post(
        "/api/v1/workers/register",
        json={"name": "w", "gpu_type": "L4", "models": ["m"]},
        headers=_bearer(body["token"]),
    )
    assert r.status_code == 401 and "revoked" in r.text


def test_log_out_everywhere_through_the_api(client: TestClient, app, admin_token: str) -> None:  # type: ignore[no-untyped-def]
    second = TestClient(app)
    login(second, admin_token)
    login(client, admin_token)
    r = client.post("/api/v1/dashboard-sessions/revoke-all", headers=_bearer(admin_token))
    assert r.status_code == 200 and r.json()["ended"] == 2
    for browser in (client, second):
        assert browser.get("/runs", follow_redirects=False).status_code == 303
    assert client.get("/api/v1/runs", headers=_bearer(admin_token)).status_code == 200


def test_dashboard_tokens_page_revokes_and_logs_out_everywhere(
    client: TestClient, app, admin_token: str
) -> None:  # type: ignore[no-untyped-def]
    registration = mint_token(app, "registration", name="pool-a", max_uses=3)
    csrf = login(client, admin_token)
    page = client.get("/tokens")
    assert page.status_code == 200 and "pool-a" in page.text
    reg_id = _token_id(client, _bearer(admin_token), "registration", registration)
    admin_id = _token_id(client, _bearer(admin_token), "admin", admin_token)
    assert client.post(f"/tokens/registration/{reg_id}/revoke", data={}).status_code == 403
    r = client.post(
        f"/tokens/registration/{reg_id}/revoke", data={"csrf_token": csrf}, follow_redirects=False
    )
    assert r.status_code == 303
    rows = client.get("/api/v1/registration-tokens", headers=_bearer(admin_token)).json()
    assert [t["revoked_at"] is not None for t in rows if t["id"] == reg_id] == [True]
    r = client.post(f"/tokens/admin/{admin_id}/revoke", data={"csrf_token": csrf})
    assert r.status_code == 409 and "last live admin token" in r.text
    second = TestClient(app)
    login(second, admin_token)
    r = client.post("/sessions/revoke-all", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303
    assert second.get("/runs", follow_redirects=False).status_code == 303
    assert client.get("/runs", follow_redirects=False).status_code == 303
