"""Invariant 9 (secrets) and 10 (least privilege) through the real API on Postgres."""

from __future__ import annotations

import subprocess

import pytest
from sqlalchemy import update

from server.db import transaction
from server.db_types import db_now
from server.models import Token
from tests.conftest import mint_token


def _register(client, reg: str, name: str = "w1"):  # type: ignore[no-untyped-def]
    return client.post(
        "/api/v1/workers/register",
        json={"name": name, "gpu_type": "L4", "price_per_hour": 0.7, "models": ["m"]},
        headers={"Authorization": f"Bearer {reg}"},
    )


def _new_registration(client, admin_headers, **body):  # type: ignore[no-untyped-def]
    resp = client.post("/api/v1/registration-tokens", json=body, headers=admin_headers)
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_tokens_are_prefixed_and_stored_only_as_digests(client, admin_headers, pg_url):
    reg = _new_registration(client, admin_headers, max_uses=2)
    assert reg["token"].startswith("agr_reg_") and len(reg["token"]) > 40
    worker = _register(client, reg["token"]).json()
    assert worker["token"].startswith("agr_wkr_")
    admin_plain = admin_headers["Authorization"].split()[1]
    dump = subprocess.run(
        ["pg_dump", "--data-only", pg_url.replace("postgresql+psycopg", "postgresql")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "agr_reg_" in dump  # the display prefix is stored…
    for plaintext in (reg["token"], worker["token"], admin_plain):
        assert plaintext not in dump  # …never the token itself
        assert plaintext[len("agr_xxx_") :] not in dump


def test_registration_token_use_limit(client, admin_headers):
    reg = _new_registration(client, admin_headers, max_uses=1)
    assert _register(client, reg["token"], "a").status_code == 201
    second = _register(client, reg["token"], "b")
    assert second.status_code == 401
    assert "use limit" in second.json()["detail"]


def test_expired_registration_token_is_refused(client, admin_headers, app):
    reg = _new_registration(client, admin_headers, max_uses=5)
    with transaction(app.state.sessionmaker) as session:
        session.execute(update(Token).where(Token.id == reg["id"]).values(expires_at=db_now()))
    resp = _register(client, reg["token"])
    assert resp.status_code == 401
    assert resp.json()["detail"] == "token expired"


def test_revoked_worker_token_fails_on_next_request(client, admin_headers):
    reg = _new_registration(client, admin_headers)
    worker = _register(client, reg["token"]).json()
    wh = {"Authorization": f"Bearer {worker['token']}"}
    # a worker-authenticated call that exists from this issue on: admin endpoints answer 403
    assert client.get("/api/v1/workers", headers=wh).status_code == 403
    revoked = client.post(f"/api/v1/workers/{worker['id']}/revoke", headers=admin_headers)
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    after = client.get("/api/v1/workers", headers=wh)
    assert after.status_code == 401
    assert after.json()["detail"] == "token revoked"


@pytest.mark.parametrize("kind", ["worker", "learner", "registration"])
def test_non_admin_tokens_get_403_on_admin_endpoints(client, app, kind):
    token = mint_token(app, kind)
    headers = {"Authorization": f"Bearer {token}"}
    for method, path in (
        ("GET", "/api/v1/workers"),
        ("POST", "/api/v1/registration-tokens"),
    ):
        resp = client.request(method, path, headers=headers, json={} if method == "POST" else None)
        assert resp.status_code == 403, (path, resp.text)


def test_missing_unknown_and_malformed_tokens_get_401(client):
    assert client.get("/api/v1/workers").status_code == 401
    for bad in ("agr_adm_nottherealtoken", "garbage", "agr_zzz_x"):
        resp = client.get("/api/v1/workers", headers={"Authorization": f"Bearer {bad}"})
        assert resp.status_code == 401


def test_unknown_fields_are_422_with_the_field_named(client, admin_headers):
    resp = client.post(
        "/api/v1/registration-tokens", json={"max_uses": 1, "colour": "red"}, headers=admin_headers
    )
    assert resp.status_code == 422
    assert resp.json()["errors"][0]["field"] == "colour"


def test_bad_values_are_422_with_reason(client, admin_headers):
    resp = client.post("/api/v1/registration-tokens", json={"max_uses": 0}, headers=admin_headers)
    assert resp.status_code == 422
    err = resp.json()["errors"][0]
    assert err["field"] == "max_uses" and "greater than or equal to 1" in err["message"]


def test_oversized_body_is_413(app, client, admin_headers):
    limit = app.state.settings.security.max_body_bytes
    resp = client.post(
        "/api/v1/registration-tokens",
        content=b"{" + b" " * (limit + 1) + b"}",
        headers={**admin_headers, "Content-Type": "application/json"},
    )
    assert resp.status_code == 413
