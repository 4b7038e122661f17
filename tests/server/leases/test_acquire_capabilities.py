"""Grants go only to workers whose engine can load the run's adapter (invariant 27: declared
capabilities at registration or with the acquire), and a leasing run that no live worker can
serve says why (`serving`: no_worker_can_serve); on both databases (Postgres and SQLite)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from markupsafe import escape
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from protocol.client import AsyncGrpoClient
from server.models import Worker
from server.tokens import service as tokens
from tests.server.dashboard.test_pages import login
from tests.server.leases.helpers import MODEL, make_run, make_worker
from tests.server.leases.lease_paths import Answered
from worker import capabilities as worker_caps
from worker.config import WorkerSettings
from worker.registration import obtain_credentials

ACQUIRE = "/api/v1/leases/acquire"
TOOLS = {"name": "tool_calls", "tools": ["calculator"], "max_turns": 2, "max_total_tokens": 512}
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
    lease_client: TestClient, db: Session, answered: Answered
) -> None:
    """Issue 49: a worker registered with max rank 16 gets no lease of a rank-32 run, which says
    `no_worker_can_serve` with the reason in its API and on its page; a worker with rank 32
    then serves it."""
    run = make_run(db, lora=RANK_32)
    registration, admin = _tokens(db)
    db.commit()
    small = _register(lease_client, registration, "small", capabilities={"max_lora_rank": 16})
    assert lease_client.post(ACQUIRE, json={}, headers=_h(small)).status_code == 204

    serving = _serving(lease_client, admin, run.id)
    assert serving["code"] == "no_worker_can_serve"
    assert serving["workers"] == 1
    assert "lora.rank 32 > largest max_lora_rank 16 among 1 live worker" in serving["reason"]
    assert "--vllm-max-lora-rank 32" in serving["reason"]
    login(lease_client, admin)
    page = lease_client.get(f"/runs/{run.id}").text
    banner = page.split('id="run-serving"')[1].split("</div>")[0]
    assert 'data-code="no_worker_can_serve"' in banner
    assert str(escape(serving["reason"])) in banner
    assert "worker --vllm-max-lora-rank" in banner  # the symptom's settings

    large = _register(lease_client, registration, "large", capabilities={"max_lora_rank": 32})
    granted = lease_client.post(ACQUIRE, json={}, headers=_h(large))
    assert granted.status_code == 200, granted.text
    lease = granted.json()
    assert lease["run_id"] == str(run.id)
    assert lease["lora"] == {"rank": 32, "target_modules": ["q_proj", "v_proj"]}
    assert _serving(lease_client, admin, run.id) is None  # a live worker can serve it now
    assert 'id="run-serving"' not in lease_client.get(f"/runs/{run.id}").text
    answered.expect({"acquire": 2})


def test_the_largest_rank_among_the_live_workers_is_named(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, lora={**RANK_32, "rank": 24})
    registration, admin = _tokens(db)
    db.commit()
    for name, rank in (("a", 8), ("b", 16)):
        _register(lease_client, registration, name, capabilities={"max_lora_rank": rank})
    reason = _serving(lease_client, admin, run.id)["reason"]
    assert "(2 live workers)" in reason
    assert "lora.rank 24 > largest max_lora_rank 16 among 2 live workers" in reason
    assert "--vllm-max-lora-rank 32" in reason  # vLLM's smallest rank that holds 24


def test_an_environment_no_live_worker_runs_is_said_too(
    lease_client: TestClient, db: Session
) -> None:
    run = make_run(db, environment=TOOLS)
    registration, admin = _tokens(db)
    db.commit()
    token = _register(lease_client, registration, "plain")  # declares single_turn only
    assert lease_client.post(ACQUIRE, json={}, headers=_h(token)).status_code == 204
    serving = _serving(lease_client, admin, run.id)
    assert serving["code"] == "no_worker_can_serve"
    assert "environment 'tool_calls' is declared by none of them" in serving["reason"]
    assert "--environment-modules" in serving["reason"]
    every = {"environments": ["single_turn", "tool_calls", "guess_number"]}
    assert lease_client.post(ACQUIRE, json=every, headers=_h(token)).status_code == 200
    assert _serving(lease_client, admin, run.id) is None


def test_an_offline_worker_is_not_counted(lease_client: TestClient, db: Session) -> None:
    run = make_run(db, lora=RANK_32)
    registration, admin = _tokens(db)
    db.commit()
    _register(lease_client, registration, "small", capabilities={"max_lora_rank": 16})
    assert _serving(lease_client, admin, run.id)["code"] == "no_worker_can_serve"
    db.execute(update(Worker).values(last_seen_at=datetime(2020, 1, 1, tzinfo=UTC)))
    db.commit()
    assert _serving(lease_client, admin, run.id) is None  # silent: nothing known of it


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
    _, token = make_worker(db)
    db.commit()
    for capabilities, field in (
        ({"max_lora_rank": 0}, "capabilities.max_lora_rank"),
        ({"max_lora_rank": -16}, "capabilities.max_lora_rank"),
        ({"max_lora_rank": "big"}, "capabilities.max_lora_rank"),
        ({"max_lora_rank": 4096}, "capabilities.max_lora_rank"),
        ({"dtype": "int4"}, "capabilities.dtype"),
        ({"lora_target_modules": ["q proj"]}, "capabilities.lora_target_modules.0"),
        ({"vram": 80}, "capabilities.vram"),
    ):
        for path, body, headers in (
            ("/api/v1/workers/register", {"name": "w", "models": [MODEL]}, _h(registration)),
            (ACQUIRE, {}, _h(token)),
        ):
            answer = lease_client.post(
                path, json={**body, "capabilities": capabilities}, headers=headers
            )
            assert answer.status_code == 422, answer.text
            errors = answer.json()
            assert errors["code"] == "validation_failed", errors
            assert [e["field"] for e in errors["errors"]] == [field], errors


def test_the_workers_own_declarations_through_the_typed_client(
    lease_client: TestClient, lease_app: FastAPI, db: Session, tmp_path: Path
) -> None:
    """The worker's registration (worker/registration.py) declares its vLLM engine's largest
    rank; restarted with a larger --vllm-max-lora-rank and the same token file, its first
    acquire declares the new one and is served."""
    run = make_run(db, lora=RANK_32)
    registration, admin = _tokens(db)
    db.commit()

    def settings(rank: int) -> WorkerSettings:
        return WorkerSettings(
            server_url="http://testserver",
            registration_token=registration,
            backend="vllm",
            model=MODEL,
            state_dir=tmp_path,
            vllm={"max_lora_rank": rank},  # type: ignore[arg-type]
        )

    creds = obtain_credentials(
        settings(16),
        environments=["single_turn"],
        stop=threading.Event(),
        new_client=lambda token: AsyncGrpoClient(
            "http://testserver", token, http=TestClient(lease_app)
        ),
    )
    listed = lease_client.get("/api/v1/workers", headers=_h(admin)).json()
    assert [w["capabilities"] for w in listed] == [
        {"max_lora_rank": 16, "lora_target_modules": None, "dtype": None}
    ]
    client = AsyncGrpoClient("http://testserver", creds.token, http=lease_client)
    small = worker_caps.declared(settings(16), "float32")
    lease, _ = client.acquire_lease_and_versions(models=[MODEL], capabilities=small)
    assert lease is None
    assert _serving(lease_client, admin, run.id)["code"] == "no_worker_can_serve"
    large = worker_caps.declared(settings(32), "bfloat16")
    lease, _ = client.acquire_lease_and_versions(models=[MODEL], capabilities=large)
    assert lease is not None and lease.lora is not None and lease.lora.rank == 32
    assert worker_caps.lease_refusal(lease, large) is None
    listed = lease_client.get("/api/v1/workers", headers=_h(admin)).json()
    assert [w["capabilities"] for w in listed] == [
        {"max_lora_rank": 32, "lora_target_modules": None, "dtype": "bfloat16"}
    ]
