from __future__ import annotations

from sqlalchemy import insert

from server.db import transaction
from server.models import GpuPrice
from tests.conftest import mint_token


def test_register_list_and_price_table(client, app, admin_headers):
    reg = mint_token(app, "registration", max_uses=3)
    for name, gpu, price in (("spot-a", "H100", 2.5), ("spot-b", "L4", 0.4)):
        resp = client.post(
            "/api/v1/workers/register",
            json={"name": name, "gpu_type": gpu, "gpu_count": 2, "price_per_hour": price},
            headers={"Authorization": f"Bearer {reg}"},
        )
        assert resp.status_code == 201, resp.text
    with transaction(app.state.sessionmaker) as session:
        session.execute(insert(GpuPrice).values(gpu_type="H100", price_per_hour=1.9))
    workers = {w["name"]: w for w in client.get("/api/v1/workers", headers=admin_headers).json()}
    assert workers["spot-a"]["effective_price_per_hour"] == 1.9 * 2  # admin table, per GPU
    assert workers["spot-b"]["effective_price_per_hour"] == 0.4  # self-reported
    assert all(w["status"] == "active" for w in workers.values())


def test_revoke_unknown_worker_is_404(client, admin_headers):
    resp = client.post(
        "/api/v1/workers/00000000-0000-0000-0000-000000000000/revoke", headers=admin_headers
    )
    assert resp.status_code == 404


def test_register_validates_fields(client, app):
    reg = mint_token(app, "registration", max_uses=3)
    resp = client.post(
        "/api/v1/workers/register",
        json={"name": "", "price_per_hour": -1},
        headers={"Authorization": f"Bearer {reg}"},
    )
    assert resp.status_code == 422
    fields = {e["field"] for e in resp.json()["errors"]}
    assert fields == {"name", "price_per_hour"}
