"""The pool learners' tests: the runs tests' app on Postgres and SQLite
(tests/server/runs/conftest.py), and helpers to register, take and attach."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import update

from server.db import db_time, transaction
from server.db_types import db_now_plus
from server.models import PoolLearner, Run
from tests.conftest import mint_token
from tests.harness.batches import FP
from tests.server.runs.conftest import admin, db, runs_app, runs_client

__all__ = ["admin", "db", "runs_app", "runs_client"]

MODEL = "smollm2-135m-instruct"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def registration(app: Any, uses: int = 10) -> dict[str, str]:
    return bearer(mint_token(app, "registration", name="reg", max_uses=uses))


def register_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "pool-a",
        "model": MODEL,
        "tokenizer_fingerprint": FP,
        "max_runs": 4,
        "gpu_type": "H100",
        "price_per_hour": 3.6,
    }
    body.update(fields)
    return body


def register(client: TestClient, app: Any, **fields: Any) -> tuple[uuid.UUID, dict[str, str]]:
    response = client.post(
        "/api/v1/learners/register", json=register_body(**fields), headers=registration(app)
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return uuid.UUID(body["learner_id"]), bearer(body["learner_token"])


def take(client: TestClient, headers: dict[str, str], n: int) -> dict[str, Any]:
    response = client.post("/api/v1/learners/take", json={"max": n}, headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def taken_ids(answer: dict[str, Any]) -> list[uuid.UUID]:
    return [uuid.UUID(r["run_id"]) for r in answer["runs"]]


def attach(client: TestClient, headers: dict[str, str], run_id: uuid.UUID) -> Any:
    return client.post(
        f"/api/v1/runs/{run_id}/learner/attach",
        json={"tokenizer_fingerprint": FP, "model": MODEL},
        headers=headers,
    )


def lapse(app: Any, run_id: uuid.UUID) -> None:
    """The run's learner lease and any take's hold run out now (database time), as if its
    learner had died."""
    with transaction(app.state.sessionmaker) as session:
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(learner_expires_at=db_now_plus(-1.0), pool_held_until=db_now_plus(-1.0))
        )


def backdate(
    app: Any, learner_id: uuid.UUID, run_ids: list[uuid.UUID], seconds: float, **run: Any
) -> None:
    """The pool learner registered, and its held runs' learner leases taken, at one instant
    `seconds` ago (database time), the pool learner seen now; `run` sets more run columns."""
    with transaction(app.state.sessionmaker) as session:
        now = db_time(session)
        began = now - timedelta(seconds=seconds)
        session.execute(
            update(PoolLearner)
            .where(PoolLearner.id == learner_id)
            .values(created_at=began, last_seen_at=now)
        )
        session.execute(
            update(Run).where(Run.id.in_(run_ids)).values(learner_attached_at=began, **run)
        )
