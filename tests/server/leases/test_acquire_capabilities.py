"""Grants go only to workers whose engine can load the run's adapter (invariant 27: declared
capabilities at registration or with the acquire), and a leasing run that no live worker can
serve says why (`serving`: no_worker_can_serve); on both databases (Postgres and SQLite)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from server.models import Worker
from server.tokens import service as tokens
from tests.server.leases.helpers import MODEL, make_run

ACQUIRE = "/api/v1/leases/acquire"
RANK_32 = {"rank": 32, "alpha": 64.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _register(client: TestClient, registration: str, name: str, **body: Any) -> str:
    answer = client.post(
        "/api/v1/workers/register",
        json={"name": name, "models": [MODEL], **body},
        headers=_h(registration),
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["token"])


def _tokens(db: Session) -> tuple[str, str]:
    """A registration token of several uses and an admin token."""
    registration = tokens.mint(db, "registration", max_uses=10).plaintext
    admin = tokens.mint(db, "admin").plaintext
    return registration, admin


def _serving(client: TestClient, admin: str, run_id: object) -> Any:
    answer = client.get(f"/api/v1/runs/{run_id}", headers=_h(admin))
    assert answer.status_code == 200, answer.text
    return answer.json()["serving"]


def test_a_rank_16_worker_gets_no_rank_32_run_and_the_run_says_why(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, lora=RANK_32)
    registration, admin = _tokens(db)
    db.commit()
    small = _register(lease_client, registration, "small", capabilities={"max_lora_rank": 16})
    assert lease_client.post(ACQUIRE, json={}, headers=_h(small)).status_code == 204

    serving = _serving(lease_client, admin, run.id)
    assert serving["code"] == "no_worker_can_serve"
    assert serving["workers"] == 1
    assert "lora.rank 32" in serving["reason"] and "--vllm-max-lora-rank 32" in serving["reason"]

    large = _register(lease_client, registration, "large", capabilities={"max_lora_rank": 32})
    granted = lease_client.post(ACQUIRE, json={}, headers=_h(large))
    assert granted.status_code == 200, granted.text
    assert granted.json()["run_id"] == str(run.id)
    assert _serving(lease_client, admin, run.id) is None  # a live worker can serve it now


def test_the_acquire_declaration_replaces_the_registration_one(
    lease_client: TestClient, db: Session
) -> None:
    """A worker restarted with a larger --vllm-max-lora-rank and its token file is served at its
    first try: the acquire's capabilities replace those it registered with, and are kept."""
    make_run(db, lora=RANK_32)
    registration, _admin = _tokens(db)
    db.commit()
    token = _register(lease_client, registration, "w", capabilities={"max_lora_rank": 16})
    raised = {"capabilities": {"max_lora_rank": 64, "dtype": "bfloat16"}}
    assert lease_client.post(ACQUIRE, json=raised, headers=_h(token)).status_code == 200
    db.expire_all()
    stored = db.execute(select(Worker.capabilities).where(Worker.name == "w")).scalar_one()
    assert stored == {"max_lora_rank": 64, "lora_target_modules": None, "dtype": "bfloat16"}


def test_target_modules_the_engine_cannot_wrap_are_not_granted(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, lora={**RANK_32, "rank": 8})
    registration, admin = _tokens(db)
    db.commit()
    token = _register(
        lease_client, registration, "w", capabilities={"lora_target_modules": ["q_proj"]}
    )
    assert lease_client.post(ACQUIRE, json={}, headers=_h(token)).status_code == 204
    assert "['v_proj']" in _serving(lease_client, admin, run.id)["reason"]
    wider = {"capabilities": {"lora_target_modules": ["q_proj", "v_proj", "o_proj"]}}
    assert lease_client.post(ACQUIRE, json=wider, headers=_h(token)).status_code == 200


def test_a_worker_that_declares_nothing_serves_every_run(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, lora=RANK_32)
    registration, admin = _tokens(db)
    db.commit()
    token = _register(lease_client, registration, "old")
    assert lease_client.post(ACQUIRE, json={}, headers=_h(token)).status_code == 200
    assert _serving(lease_client, admin, run.id) is None


def test_a_run_with_no_live_worker_says_nothing(lease_client: TestClient, db: Session) -> None:
    run = make_run(db, lora=RANK_32)
    _registration, admin = _tokens(db)
    db.commit()
    assert _serving(lease_client, admin, run.id) is None


def test_bad_capabilities_are_refused_with_the_field(lease_client: TestClient, db: Session) -> None:
    registration, _admin = _tokens(db)
    db.commit()
    for capabilities, field in (
        ({"max_lora_rank": 0}, "max_lora_rank"),
        ({"max_lora_rank": "big"}, "max_lora_rank"),
        ({"dtype": "int4"}, "dtype"),
        ({"lora_target_modules": ["q proj"]}, "lora_target_modules"),
        ({"vram": 80}, "vram"),
    ):
        answer = lease_client.post(
            "/api/v1/workers/register",
            json={"name": "w", "models": [MODEL], "capabilities": capabilities},
            headers=_h(registration),
        )
        assert answer.status_code == 422, answer.text
        body = answer.json()
        assert body["code"] == "validation_failed", body
        assert field in answer.text, body
