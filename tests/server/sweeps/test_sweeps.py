"""POST/GET /api/v1/sweeps and a sweep's pause / resume / cancel, on Postgres and SQLite
(docs/guides/sweeps.md): every combination is validated before any run is made, the runs are
made in one transaction with their overrides, and an action moves each run by the lifecycle."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from server.models import PromptRow, Run, Sweep, Token
from tests.conftest import make_settings, mint_token
from tests.server.runs.conftest import example_config
from tests.server.sweeps.conftest import sweep_body

pytestmark = pytest.mark.timeout(120)

URL = "/api/v1/sweeps"


def _counts(db: Session) -> tuple[int, int, int, int]:
    """(runs, sweeps, learner tokens, prompt rows); the read ended (SQLite's one writer)."""
    counts = tuple(
        int(db.execute(select(func.count()).select_from(table)).scalar_one())
        for table in (Run, Sweep, Token, PromptRow)
    )
    db.rollback()
    return counts  # type: ignore[return-value]


def test_a_2x2_grid_makes_four_runs_with_their_configs(
    runs_client: TestClient, admin: dict[str, str], db: Session
) -> None:
    resp = runs_client.post(URL, json=sweep_body(), headers=admin)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    sweep = body["sweep"]
    assert sweep["n_runs"] == 4 and sweep["statuses"] == {"pending": 4}
    expected = [
        {"grpo.learning_rate": 1e-5, "lora.rank": 8},
        {"grpo.learning_rate": 1e-5, "lora.rank": 32},
        {"grpo.learning_rate": 3e-5, "lora.rank": 8},
        {"grpo.learning_rate": 3e-5, "lora.rank": 32},
    ]
    assert [r["overrides"] for r in sweep["runs"]] == expected
    assert [r["index"] for r in sweep["runs"]] == [0, 1, 2, 3]
    assert [r["name"] for r in sweep["runs"]] == [
        "lr-rank grpo.learning_rate=1e-05 lora.rank=8",
        "lr-rank grpo.learning_rate=1e-05 lora.rank=32",
        "lr-rank grpo.learning_rate=3e-05 lora.rank=8",
        "lr-rank grpo.learning_rate=3e-05 lora.rank=32",
    ]
    # one learner token per run, shown once, stored as a digest scoped to its run
    learners = body["learners"]
    assert [t["run_id"] for t in learners] == [r["id"] for r in sweep["runs"]]
    assert len({t["learner_token"] for t in learners}) == 4
    for t in learners:
        stored = db.execute(
            select(Token).where(Token.scope_id == uuid.UUID(t["run_id"]))
        ).scalar_one()
        assert stored.kind == "learner"
        assert stored.digest == hashlib.sha256(t["learner_token"].encode()).hexdigest()
    db.rollback()
    # each run's config read back: the base with its overrides, nothing else changed
    for row, overrides in zip(sweep["runs"], expected, strict=True):
        got = runs_client.get(f"/api/v1/runs/{row['id']}", headers=admin).json()
        assert got["sweep_id"] == sweep["id"] and got["overrides"] == overrides
        config = RunConfig.model_validate(got["config"])
        assert config.grpo.learning_rate == overrides["grpo.learning_rate"]
        assert config.lora.rank == overrides["lora.rank"]
        base = example_config()
        base["name"] = row["name"]
        base["grpo"]["learning_rate"] = overrides["grpo.learning_rate"]
        base["lora"]["rank"] = overrides["lora.rank"]
        assert got["config"] == RunConfig.model_validate(base).model_dump(mode="json")
        assert got["stats"]["prompt_rows"] == {"queued": 64}
        assert "learner_token" not in got
    # the sweep read back, and the list
    again = runs_client.get(f"{URL}/{sweep['id']}", headers=admin)
    assert again.status_code == 200 and again.json()["runs"] == sweep["runs"]
    first = sweep["runs"][0]
    assert first["current_version"] == 0 and first["last_reward"] is None
    assert first["eval_accuracy"] is None and first["stale_waste"] == 0.0
    assert first["spent_usd"] == 0.0 and "learner_token" not in again.text
    listed = runs_client.get(URL, headers=admin).json()
    assert [(s["id"], s["n_runs"], s["statuses"]) for s in listed] == [
        (sweep["id"], 4, {"pending": 4})
    ]
    assert listed[0]["grid"] == sweep_body()["grid"]


def test_listed_overrides_make_one_run_each(runs_client: TestClient, admin: dict[str, str]) -> None:
    body = sweep_body(
        "loss",
        grid=None,
        overrides=[{}, {"grpo.loss_type": "cispo", "grpo.epsilon_high": 4.0}],
    )
    resp = runs_client.post(URL, json=body, headers=admin)
    assert resp.status_code == 201, resp.text
    runs = resp.json()["sweep"]["runs"]
    assert [r["name"] for r in runs] == [
        "loss (base)",
        "loss grpo.loss_type=cispo grpo.epsilon_high=4.0",
    ]
    config = runs_client.get(f"/api/v1/runs/{runs[1]['id']}", headers=admin).json()["config"]
    assert config["grpo"]["loss_type"] == "cispo" and config["grpo"]["epsilon_high"] == 4.0


def test_one_invalid_combination_refuses_the_whole_sweep(
    runs_client: TestClient, admin: dict[str, str], db: Session
) -> None:
    before = _counts(db)
    # cispo clips each token's weight: it cannot be combined with sequence-level importance,
    # so only the last combination of the 2 x 2 is invalid
    body = sweep_body(
        "loss",
        grid={"grpo.loss_type": ["dapo", "cispo"], "grpo.importance_level": ["token", "sequence"]},
    )
    resp = runs_client.post(URL, json=body, headers=admin)
    assert resp.status_code == 422, resp.text
    error = resp.json()
    assert error["code"] == "sweep_combination_invalid"
    assert error["combination"] == 3
    assert error["overrides"] == {"grpo.loss_type": "cispo", "grpo.importance_level": "sequence"}
    assert error["field"] == "grpo.importance_level"
    assert "combination 3 (grpo.loss_type=cispo grpo.importance_level=sequence)" in error["detail"]
    assert "cispo" in error["errors"][0]["message"]
    assert _counts(db) == before

    # a field's own rule: the field is named
    bad_rank = sweep_body(grid={"lora.rank": [8, 4096]})
    resp = runs_client.post(URL, json=bad_rank, headers=admin)
    assert resp.status_code == 422, resp.text
    error = resp.json()
    assert (error["code"], error["combination"], error["field"]) == (
        "sweep_combination_invalid",
        1,
        "lora.rank",
    )
    assert error["overrides"] == {"lora.rank": 4096}
    assert _counts(db) == before
    assert runs_client.get(URL, headers=admin).json() == []


def test_a_refusal_after_validation_rolls_back_every_run(
    runs_client: TestClient, admin: dict[str, str], db: Session
) -> None:
    """The second run names a stored dataset that does not exist: the first run, made in the
    same transaction, is rolled back with it."""
    before = _counts(db)
    missing = {"kind": "uploaded", "id": str(uuid.uuid4())}
    body = sweep_body(grid=None, overrides=[{"lora.rank": 8}, {"dataset": missing}])
    resp = runs_client.post(URL, json=body, headers=admin)
    assert resp.status_code == 422, resp.text
    error = resp.json()
    assert error["combination"] == 1 and error["code"] == "unknown_dataset", error
    assert "combination 1 (dataset=" in error["detail"]
    assert _counts(db) == before


@pytest.mark.parametrize(
    ("fields", "code", "field", "words"),
    [
        (
            {"grid": {"grpo.learnin_rate": [1e-5]}},
            "sweep_path_unknown",
            "grid.grpo.learnin_rate",
            "did you mean 'learning_rate'",
        ),
        (
            {"grid": {"optimizer.lr": [1e-5]}},
            "sweep_path_unknown",
            "grid.optimizer.lr",
            "the run config has no 'optimizer'",
        ),
        ({"grid": {"lora.rank.x": [1]}}, "sweep_path_unknown", "grid.lora.rank.x", "no 'x'"),
        ({"grid": {"name": ["a", "b"]}}, "sweep_path_unknown", "grid.name", "cannot be swept"),
        ({"grid": {}}, "sweep_invalid", "grid", "empty"),
        ({"grid": {"lora.rank": 8}}, "sweep_invalid", "grid.lora.rank", "list"),
        ({"grid": {"lora.rank": []}}, "sweep_invalid", "grid.lora.rank", "empty"),
        ({"grid": {"lora.rank": [8, 8]}}, "sweep_invalid", "grid.lora.rank", "twice"),
        ({"grid": {"lora": [{}], "lora.rank": [8]}}, "sweep_invalid", "grid.lora.rank", "inside"),
        ({"grid": None}, "sweep_invalid", "body", "exactly one"),
        ({"overrides": [{"lora.rank": 8}]}, "sweep_invalid", "grid", "exactly one"),
        ({"grid": None, "overrides": []}, "sweep_invalid", "overrides", "empty"),
        ({"grid": None, "overrides": [5]}, "sweep_invalid", "overrides.0", "object"),
        (
            {"grid": None, "overrides": [{"lora.rank": 8}, {"lora.rank": 8}]},
            "sweep_invalid",
            "overrides.1",
            "same as overrides.0",
        ),
        # 16 and the default rank (16) make the same config
        (
            {"grid": None, "overrides": [{"lora.rank": 16}, {}]},
            "sweep_invalid",
            "overrides.1",
            "same run config",
        ),
    ],
)
def test_bad_input_is_a_422_naming_the_field(
    runs_client: TestClient,
    admin: dict[str, str],
    db: Session,
    fields: dict[str, Any],
    code: str,
    field: str,
    words: str,
) -> None:
    before = _counts(db)
    resp = runs_client.post(URL, json=sweep_body(**fields), headers=admin)
    assert resp.status_code == 422, resp.text
    error = resp.json()
    assert (error["code"], error["field"]) == (code, field), error
    assert words in error["detail"], error["detail"]
    assert _counts(db) == before


def test_the_body_is_validated_as_any_request(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    resp = runs_client.post(URL, json={**sweep_body(), "extra": 1}, headers=admin)
    assert resp.status_code == 422 and resp.json()["code"] == "validation_failed"
    resp = runs_client.post(URL, json=sweep_body(name=" "), headers=admin)
    assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "name"
    assert runs_client.post(URL, json=sweep_body()).status_code == 401
    worker = mint_token(runs_client.app, "registration", name="r")  # type: ignore[attr-defined]
    refused = runs_client.post(
        URL, json=sweep_body(), headers={"Authorization": f"Bearer {worker}"}
    )
    assert refused.status_code == 403
    unknown = runs_client.get(f"{URL}/{uuid.uuid4()}", headers=admin)
    assert unknown.status_code == 404 and unknown.json()["code"] == "sweep_not_found"
    unknown = runs_client.post(f"{URL}/{uuid.uuid4()}/pause", headers=admin)
    assert unknown.status_code == 404 and unknown.json()["code"] == "sweep_not_found"


def test_the_bound_holds(db_url: str, tmp_path: Path) -> None:
    from server.app import create_app

    settings = make_settings(db_url, tmp_path / "bucket", sweeps={"max_runs": 3})
    application = create_app(settings, migrate=True)
    headers = {"Authorization": f"Bearer {mint_token(application, 'admin', name='t')}"}
    try:
        with TestClient(application) as client:
            resp = client.post(URL, json=sweep_body(), headers=headers)  # 2 x 2 = 4 > 3
            assert resp.status_code == 422, resp.text
            error = resp.json()
            assert (error["code"], error["field"], error["max_runs"]) == (
                "sweep_too_large",
                "grid",
                3,
            )
            assert "4 runs; at most 3" in error["detail"]
            # a grid far too large to expand is refused by its count
            huge = {f"grpo.{k}": [0.1, 0.2] for k in ("epsilon_low", "epsilon_high", "beta")}
            huge |= {"seed": list(range(1000)), "priority": list(range(1000))}
            resp = client.post(URL, json=sweep_body(grid=huge), headers=headers)
            assert resp.status_code == 422 and "8000000 runs" in resp.json()["detail"]
            listed = [{"seed": i} for i in range(4)]
            resp = client.post(URL, json=sweep_body(grid=None, overrides=listed), headers=headers)
            assert resp.status_code == 422 and resp.json()["field"] == "overrides"
            three = client.post(
                URL, json=sweep_body(grid=None, overrides=listed[:3]), headers=headers
            )
            assert three.status_code == 201, three.text
            assert len(client.get("/api/v1/runs", headers=headers).json()) == 3
    finally:
        application.state.engine.dispose()


def _statuses(client: TestClient, headers: dict[str, str], sweep_id: str) -> list[str]:
    return [r["status"] for r in client.get(f"{URL}/{sweep_id}", headers=headers).json()["runs"]]


def test_pause_resume_cancel_act_on_every_run(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    created = runs_client.post(URL, json=sweep_body(), headers=admin).json()
    sweep_id = created["sweep"]["id"]
    ids = [r["id"] for r in created["sweep"]["runs"]]
    # one run is cancelled on its own first
    assert runs_client.post(f"/api/v1/runs/{ids[1]}/cancel", headers=admin).status_code == 200

    paused = runs_client.post(f"{URL}/{sweep_id}/pause", json={"reason": "night"}, headers=admin)
    assert paused.status_code == 200, paused.text
    result = paused.json()
    assert (result["action"], result["moved"], result["refused"]) == ("pause", 3, 1)
    assert [(r["run_id"], r["moved"], r["status"]) for r in result["runs"]] == [
        (ids[0], True, "paused"),
        (ids[1], False, "cancelled"),
        (ids[2], True, "paused"),
        (ids[3], True, "paused"),
    ]
    refused = result["runs"][1]
    assert refused["code"] == "invalid_transition" and "it has ended" in refused["detail"]
    assert _statuses(runs_client, admin, sweep_id) == ["paused", "cancelled", "paused", "paused"]
    reason = runs_client.get(f"/api/v1/runs/{ids[0]}", headers=admin).json()["status_reason"]
    assert reason == "night"

    # resume: never attached, so pending again (the lifecycle's RESUME rule)
    resumed = runs_client.post(f"{URL}/{sweep_id}/resume", headers=admin).json()
    assert (resumed["moved"], resumed["refused"]) == (3, 1)
    assert _statuses(runs_client, admin, sweep_id) == ["pending", "cancelled", "pending", "pending"]

    cancelled = runs_client.post(f"{URL}/{sweep_id}/cancel", headers=admin).json()
    assert (cancelled["moved"], cancelled["refused"]) == (3, 1)
    assert _statuses(runs_client, admin, sweep_id) == ["cancelled"] * 4
    again = runs_client.post(f"{URL}/{sweep_id}/cancel", headers=admin).json()
    assert (again["moved"], again["refused"]) == (0, 4)
    assert {r["code"] for r in again["runs"]} == {"invalid_transition"}
    listed = runs_client.get(URL, headers=admin).json()
    assert listed[0]["statuses"] == {"cancelled": 4}


def test_the_guides_example_makes_its_four_runs(
    runs_client: TestClient, admin: dict[str, str]
) -> None:
    """docs/guides/sweeps.md, "A 2 × 2 grid on the small model"."""
    example = Path(__file__).resolve().parents[3] / "examples" / "sweeps" / "lr-rank-smollm2.json"
    resp = runs_client.post(URL, json=json.loads(example.read_text()), headers=admin)
    assert resp.status_code == 201, resp.text
    runs = resp.json()["sweep"]["runs"]
    assert [r["name"] for r in runs] == [
        "lr-rank grpo.learning_rate=0.0002 lora.rank=8",
        "lr-rank grpo.learning_rate=0.0002 lora.rank=32",
        "lr-rank grpo.learning_rate=0.0005 lora.rank=8",
        "lr-rank grpo.learning_rate=0.0005 lora.rank=32",
    ]
    listed = runs_client.get("/api/v1/runs", headers=admin).json()
    assert {r["sweep_id"] for r in listed} == {resp.json()["sweep"]["id"]}
    assert sorted(r["overrides"]["lora.rank"] for r in listed) == [8, 8, 32, 32]


def test_unstorable_json_is_refused_at_the_edge(
    runs_client: TestClient, admin: dict[str, str], db: Session
) -> None:
    """NaN and Infinity parse as JSON numbers but no database stores them (nor can an error
    answer echo them): refused as any free JSON field is, before any combination is made."""
    before = _counts(db)
    headers = {**admin, "Content-Type": "application/json"}
    base = json.dumps(example_config())
    for grid, where in (
        ('{"grpo.beta": [NaN]}', "grpo.beta[0]"),
        ('{"rewards.0.kwargs.x": [Infinity]}', "rewards.0.kwargs.x[0]"),
    ):
        body = '{"name": "n", "base": ' + base + ', "grid": ' + grid + "}"
        resp = runs_client.post(URL, content=body, headers=headers)
        assert resp.status_code == 422, resp.text
        error = resp.json()["errors"][0]
        assert error["field"] == "grid" and f"(at {where})" in error["message"]
    nan_seed = base.replace('"seed": 0', '"seed": NaN')
    body = '{"name": "n", "base": ' + nan_seed + ', "grid": {"seed": [1]}}'
    resp = runs_client.post(URL, content=body, headers=headers)
    assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "base"
    assert _counts(db) == before
