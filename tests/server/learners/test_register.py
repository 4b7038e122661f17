"""Pool learner registration: a registration token mints a pool_learner token (shown once,
stored as a digest); bad input is a 422 naming the field; a token of another kind is refused."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from server.models import PoolLearner, Token
from server.tokens.service import digest
from tests.conftest import mint_token
from tests.server.learners.conftest import bearer, register_body, registration

pytestmark = pytest.mark.timeout(120)


def test_register_mints_a_pool_learner_token_shown_once(runs_app, runs_client, db) -> None:
    response = runs_client.post(
        "/api/v1/learners/register",
        json=register_body(max_runs=3, memory_budget_gb=60.0),
        headers=registration(runs_app),
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["learner_token"].startswith("agr_pln_")
    learner = db.execute(select(PoolLearner)).scalar_one()
    assert str(learner.id) == body["learner_id"]
    assert (learner.max_runs, learner.memory_budget_gb, learner.price_per_hour) == (3, 60.0, 3.6)
    token = db.get(Token, learner.token_id)
    assert token is not None and token.kind == "pool_learner" and token.scope_id == learner.id
    assert token.digest == digest(body["learner_token"]) != body["learner_token"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_runs", 0),
        ("max_runs", 65),
        ("price_per_hour", -1.0),
        ("memory_budget_gb", 0),
        ("name", ""),
        ("model", ""),
        ("tokenizer_fingerprint", "x" * 129),
        ("surprise", 1),
    ],
    ids=["max-runs-0", "max-runs-65", "price-negative", "memory-0", "name-empty",
         "model-empty", "fingerprint-long", "unknown-field"],
)  # fmt: skip
def test_bad_input_is_a_422_naming_the_field(runs_app, runs_client, field, value) -> None:
    response = runs_client.post(
        "/api/v1/learners/register",
        json=register_body(**{field: value}),
        headers=registration(runs_app),
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "validation_failed"
    assert any(e["field"] == field and e["message"] for e in body["errors"]), body


def test_a_token_of_another_kind_is_refused(runs_app, runs_client, admin) -> None:
    body = register_body()
    missing = runs_client.post("/api/v1/learners/register", json=body)
    assert (missing.status_code, missing.json()["code"]) == (401, "token_missing")
    wrong = runs_client.post("/api/v1/learners/register", json=body, headers=admin)
    assert (wrong.status_code, wrong.json()["code"]) == (403, "token_kind_forbidden")
    pool = bearer(mint_token(runs_app, "pool_learner", name="p"))
    again = runs_client.post("/api/v1/learners/register", json=body, headers=pool)
    assert (again.status_code, again.json()["code"]) == (403, "token_kind_forbidden")
    # A registration token on the take, and the per-run routes: refused by kind.
    reg = registration(runs_app)
    take = runs_client.post("/api/v1/learners/take", json={"max": 1}, headers=reg)
    assert (take.status_code, take.json()["code"]) == (403, "token_kind_forbidden")


def test_a_registration_token_counts_its_uses(runs_app, runs_client) -> None:
    once = registration(runs_app, uses=1)
    first = runs_client.post("/api/v1/learners/register", json=register_body(), headers=once)
    assert first.status_code == 201
    second = runs_client.post("/api/v1/learners/register", json=register_body(), headers=once)
    assert (second.status_code, second.json()["code"]) == (401, "registration_token_exhausted")
