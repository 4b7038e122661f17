"""POST /api/v1/runs: validation reaches the API, rows are queued up front, the learner token
is shown once and stored only as a digest."""

from __future__ import annotations

import hashlib
import time
import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from protocol import datasets
from protocol.run_config import RunConfig
from server.models import DatasetRow, PromptRow, Run, Token
from server.runs import service
from tests.conftest import mint_token
from tests.server.runs.conftest import example_config


def test_example_config_is_accepted(runs_client, admin, db: Session) -> None:  # type: ignore[no-untyped-def]
    config = example_config()
    resp = runs_client.post("/api/v1/runs", json=config, headers=admin)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    run_id = uuid.UUID(body["run"]["id"])
    assert body["run"]["status"] == "pending"
    assert body["run"]["base_model"] == "smollm2-135m-instruct"
    assert body["run"]["config"] == RunConfig.model_validate(config).model_dump(mode="json")
    size = config["dataset"]["size"]
    assert body["run"]["stats"]["prompt_rows"] == {"queued": size}
    assert body["run"]["stats"]["admission_bound_groups"] == 16

    token = body["learner_token"]
    assert token.startswith("agr_lrn_")
    stored = db.execute(select(Token).where(Token.kind == "learner")).scalar_one()
    assert stored.scope_id == run_id
    assert stored.digest == hashlib.sha256(token.encode()).hexdigest()

    rows = (
        db.execute(
            select(DatasetRow).where(DatasetRow.run_id == run_id).order_by(DatasetRow.row_index)
        )
        .scalars()
        .all()
    )
    expected = datasets.generate("arithmetic", size, config["dataset"]["seed"])
    assert [(r.prompt, r.reference) for r in rows] == [
        (e["prompt"], {"answer": e["answer"]}) for e in expected
    ]
    db.rollback()  # end the read (SQLite has one writer; its BEGIN IMMEDIATE holds the lock)
    # the detail read answers the same run without the token
    got = runs_client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert got["id"] == str(run_id) and "learner_token" not in got


def test_every_epoch_is_queued_up_front_epoch_zero_first(runs_client, admin, db: Session) -> None:  # type: ignore[no-untyped-def]
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)] + [
        {"prompt": [{"role": "user", "content": "Say hi"}], "style": "greeting"}
    ]
    config = example_config(dataset={"kind": "jsonl", "rows": rows}, epochs=3)
    resp = runs_client.post("/api/v1/runs", json=config, headers=admin)
    assert resp.status_code == 201, resp.text
    run_id = uuid.UUID(resp.json()["run"]["id"])
    prompt_rows = db.execute(
        select(PromptRow, DatasetRow)
        .join(DatasetRow, DatasetRow.id == PromptRow.dataset_row_id)
        .where(PromptRow.run_id == run_id)
        .order_by(PromptRow.queue_pos)
    ).all()
    assert len(prompt_rows) == 3 * len(rows)
    for pos, (prow, drow) in enumerate(prompt_rows):
        assert prow.queue_pos == pos == prow.epoch * len(rows) + drow.row_index
        assert prow.state == "queued" and prow.attempts == 0
        assert drow.prompt == rows[drow.row_index]["prompt"]
        assert drow.reference == {k: v for k, v in rows[drow.row_index].items() if k != "prompt"}
    assert [p.epoch for p, _ in prompt_rows] == [0] * 5 + [1] * 5 + [2] * 5


def test_longest_name_is_accepted(runs_client, admin) -> None:  # type: ignore[no-untyped-def]
    resp = runs_client.post("/api/v1/runs", json=example_config(name="n" * 200), headers=admin)
    assert resp.status_code == 201, resp.text
    too_long = runs_client.post("/api/v1/runs", json=example_config(name="n" * 201), headers=admin)
    assert too_long.status_code == 422
    assert too_long.json()["errors"][0]["field"] == "name"


def test_get_config_parses_the_stored_config(runs_client, admin, db: Session) -> None:  # type: ignore[no-untyped-def]
    config = example_config(max_versions=5, budget_usd=12.5)
    run_id = runs_client.post("/api/v1/runs", json=config, headers=admin).json()["run"]["id"]
    run = db.get(Run, uuid.UUID(run_id))
    assert run is not None
    service.forget_configs()  # parse from the database, not from creation's copy
    parsed = service.get_config(run)
    assert parsed == RunConfig.model_validate(config)
    assert service.get_config(run) is parsed


@pytest.mark.parametrize(
    ("patch", "field", "message"),
    [
        ({"group_size": 1}, "group_size", "group_size must be at least 2"),
        ({"prompts_per_step": 3}, "prompts_per_step", "multiple of prompts_per_lease (2)"),
        ({"sampling": {"top_p": 0.9}}, "sampling.top_p", "top_p must be 1.0"),
        ({"lora": {"rank": 16, "extra": 1}}, "lora.extra", "Extra inputs are not permitted"),
        ({"surprise": True}, "surprise", "Extra inputs are not permitted"),
        (
            {"tracking": {"backend": "neptune"}},
            "tracking.backend",
            "tracking.backend must be one of wandb, trackio, mlflow (got 'neptune')",
        ),
        ({"tracking": {"backend": "mlflow", "uri": "file:///"}}, "tracking.uri", "Extra inputs"),
        ({"rewards": [{"name": "os:system"}]}, "rewards.0.name", "Python's standard library"),
        ({"rewards": [{"name": "answer_fromat"}]}, "rewards.0.name", "did you mean"),
        (
            {"grpo": {"loss_type": "cispo", "correction": "tis"}},
            "grpo.correction",
            "correction 'tis' cannot be combined with loss_type 'cispo'",
        ),
        (
            {"grpo": {"importance_level": "sequence", "epsilon_low": 1.0}},
            "grpo.epsilon_low",
            "epsilon_low must be in [0, 1) with loss_type 'dapo'",
        ),
        (
            {"dataset": {"kind": "jsonl", "rows": [{"prompt": "ok"}, {"answer": "1"}]}},
            "dataset.jsonl.rows.1",
            "row has no `prompt` column",
        ),
    ],
)
def test_invalid_config_is_422_with_field_and_reason(  # type: ignore[no-untyped-def]
    runs_client, admin, db: Session, patch, field, message
) -> None:
    resp = runs_client.post("/api/v1/runs", json=example_config(**patch), headers=admin)
    assert resp.status_code == 422
    errors = resp.json()["errors"]
    assert len(errors) == 1, errors
    assert errors[0]["field"] == field
    assert message in errors[0]["message"]
    assert db.execute(select(Run)).first() is None


def test_a_tracking_block_is_stored_and_returned(runs_client, admin) -> None:  # type: ignore[no-untyped-def]
    block = {"backend": "mlflow", "project": "arith", "run_name": "r1", "entity": None, "tags": []}
    resp = runs_client.post("/api/v1/runs", json=example_config(tracking=block), headers=admin)
    assert resp.status_code == 201, resp.text
    assert resp.json()["run"]["config"]["tracking"] == block


def test_create_needs_an_admin_token(runs_app, runs_client) -> None:  # type: ignore[no-untyped-def]
    assert runs_client.post("/api/v1/runs", json=example_config()).status_code == 401
    worker = mint_token(runs_app, "worker", scope_id=uuid.uuid4())
    resp = runs_client.post(
        "/api/v1/runs", json=example_config(), headers={"Authorization": f"Bearer {worker}"}
    )
    assert resp.status_code == 403
    learner = mint_token(runs_app, "learner", scope_id=uuid.uuid4())
    resp = runs_client.get("/api/v1/runs", headers={"Authorization": f"Bearer {learner}"})
    assert resp.status_code == 403


def test_the_largest_inline_dataset_is_inserted_in_bulk(runs_client, admin, db: Session) -> None:  # type: ignore[no-untyped-def]
    n = datasets.MAX_JSONL_ROWS  # larger datasets are uploaded (tests/server/datasets)
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
    config = example_config(dataset={"kind": "jsonl", "rows": rows})
    start = time.perf_counter()
    resp = runs_client.post("/api/v1/runs", json=config, headers=admin)
    elapsed = time.perf_counter() - start
    assert resp.status_code == 201, resp.text[:500]
    assert resp.json()["run"]["stats"]["prompt_rows"] == {"queued": n}
    print(f"created a run with {n} JSONL rows in {elapsed:.1f} s")
    assert elapsed < 10
