"""The run's best version and early stopping (server/runs/best.py), through the real API on
SQLite and Postgres: a fake worker and a fake learner whose eval results peak at a middle
version; retention keeps that version, `/adapters/best` serves it, the run page shows it, and
with `early_stop` the run completes at the rule's version."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from server.db import transaction
from server.models import Event
from tests.conftest import make_settings
from tests.server.dashboard.test_pages import login
from tests.server.evals.support import drain, make_eval_run, worker_headers
from tests.server.learner.support import (
    RunHandle,
    attach,
    claim,
    deleted_versions,
    make_run,
    make_worker,
    publish_body,
    retain,
    run_row,
    upload,
    upload_and_publish,
)
from tests.server.runs.conftest import example_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


# Items right out of the 3 eval prompts, by version: the peak is version 3.
RIGHT = {0: 0, 1: 1, 2: 1, 3: 3, 4: 2, 5: 1, 6: 1, 7: 0}


def _score(client: TestClient, run: RunHandle, fencing: int, right: dict[int, int]) -> None:
    """Claim the uploaded eval batches and score them: `right[version]` of the version's three
    items (consecutive ids) are right on every sample."""
    body = client.post(
        run.url("evals/claim"), json={"fencing": fencing, "max_batches": 64}, headers=run.headers
    )
    assert body.status_code == 200, body.text
    for batch in body.json()["batches"]:
        samples = []
        for prompt in batch["prompts"]:
            ok = prompt["item_id"] % 3 < right[batch["version"]]
            samples += [
                {"item_id": prompt["item_id"], "reward": float(ok), "accuracy_value": float(ok)}
            ] * batch["n"]
        posted = client.post(
            run.url("evals"),
            json={"fencing": fencing, "batch_id": batch["batch_id"], "samples": samples},
            headers=run.headers,
        )
        assert posted.status_code == 200, posted.text


def _train(
    client: TestClient,
    run: RunHandle,
    worker: dict[str, str],
    right: dict[int, int],
    until: Callable[[int, Any], bool],
) -> tuple[int, Any]:
    """Roll out, score the evals, publish the next version with the claimed batches, until
    `until(version, publish answer)`; the last version and its answer."""
    fencing = attach(client, run)["fencing"]
    version = 0
    while True:
        drain(client, worker)
        _score(client, run, fencing, right)
        claimed = claim(client, run, fencing, max_groups=2)
        version += 1
        if claimed.status_code != 200:  # the run has ended
            return version, claimed
        body = claimed.json()
        ids = [b["batch_id"] for b in body["batches"]]
        answer = upload_and_publish(client, run, fencing, version, ids, final=body["exhausted"])
        if until(version, answer):
            return version, answer
        assert answer.status_code == 200, answer.text
        assert version < 20


def _evals_of(client: TestClient, run: RunHandle, admin: dict[str, str]) -> dict[int, Any]:
    versions = client.get(run.url("evals"), headers=admin).json()["versions"]
    return {v["version"]: v for v in versions}


def test_the_best_version_is_kept_served_and_shown(
    app: Any, client: TestClient, admin_headers: dict[str, str], admin_token: str
) -> None:
    run = make_eval_run(
        app,
        n_rows=14,  # 7 versions of 2 prompts
        eval_overrides={"every_versions": 1, "n": 1, "temperature": 0.0, "max_leases_in_flight": 4},
        retention={"keep_every": 4},
    )
    _, token = make_worker(app)
    worker = worker_headers(token)

    last, answer = _train(
        client, run, worker, RIGHT, lambda _v, a: a.json()["run_status"] != "running"
    )
    assert answer.json()["run_status"] == "evaluating" and last == 7
    drain(client, worker)
    fencing = run_row(app, run.id).learner_fencing
    assert fencing is not None
    _score(client, run, fencing, RIGHT)

    evals = _evals_of(client, run, admin_headers)
    peak = max(evals, key=lambda v: (evals[v]["accuracy"], -v))
    assert peak == 3 and evals[3]["accuracy"] == pytest.approx(1.0)
    detail = client.get(f"/api/v1/runs/{run.id}", headers=admin_headers).json()
    assert detail["status"] == "completed"
    assert (detail["best_version"], detail["best_metric"]) == (peak, "eval_accuracy")
    assert detail["best_value"] == pytest.approx(evals[peak]["accuracy"])

    # current 7, max_staleness 1: the window keeps 5-7; the best (3) and keep_every (4) stay too
    retain(app, run.id)
    assert deleted_versions(app, run.id) == [1, 2]
    listed = {
        a["version"]: a for a in client.get(run.url("adapters"), headers=admin_headers).json()
    }
    assert [v for v, a in listed.items() if a["best"]] == [peak]

    best = client.get(run.url("adapters/best"), headers=admin_headers)
    assert best.status_code == 200, best.text
    assert best.json()["version"] == peak and best.json()["best"] is True
    published = {f["name"]: f["sha256"] for f in listed[peak]["files"]}
    assert {f["name"]: f["sha256"] for f in best.json()["files"]} == published
    for f in best.json()["files"]:
        data = client.get(f["url"]).content
        assert hashlib.sha256(data).hexdigest() == published[f["name"]]

    login(client, admin_token)
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    assert f'data-best-version="{peak}"' in page.text and f'data-best="{peak}"' in page.text


def test_early_stop_completes_the_run_at_the_rules_version(
    app: Any, client: TestClient, admin_headers: dict[str, str]
) -> None:
    run = make_eval_run(
        app,
        n_rows=14,
        eval_overrides={"every_versions": 1, "n": 1, "temperature": 0.0, "max_leases_in_flight": 4},
        early_stop={"patience": 2},
    )
    _, token = make_worker(app)
    # the peak is version 3; versions 4 and 5 do not beat it: the eval of 5 stops the run, so
    # the claim for version 6 (after 5's eval is scored) is refused
    last, answer = _train(
        client, run, worker_headers(token), RIGHT, lambda _v, a: a.status_code != 200
    )
    assert last == 6 and answer.status_code == 409, answer.text
    row = run_row(app, run.id)
    assert (row.status, row.best_version, row.current_version) == ("completed", 3, 5)
    assert row.status_reason is not None and "patience 2" in row.status_reason
    with transaction(app.state.sessionmaker) as session:
        stops = list(
            session.execute(
                select(Event.data).where(Event.run_id == run.id, Event.kind == "run.early_stop")
            ).scalars()
        )
    assert [(e["version"], e["best_version"]) for e in stops] == [(5, 3)]
    assert client.get(run.url("adapters/best"), headers=admin_headers).json()["version"] == 3


def _publish_rewards(
    client: TestClient, run: RunHandle, rewards: list[float]
) -> list[dict[str, Any]]:
    fencing = attach(client, run)["fencing"]
    answers = []
    for version, reward in enumerate(rewards, start=1):
        assert upload(client, run, fencing, version).status_code == 200
        body = publish_body(run, fencing, version)
        body["metrics"] = {"reward_mean": reward}
        answer = client.post(run.url("adapters"), json=body, headers=run.headers)
        answers.append(answer.json())
        if answer.status_code != 200 or answer.json()["run_status"] != "running":
            break
    return answers


def test_train_reward_ranks_over_its_window_and_max_drop_stops(
    app: Any, client: TestClient, admin_headers: dict[str, str]
) -> None:
    """Without an eval block the default metric is train_reward: the mean reward_mean over
    window_versions versions, ranked at each publish once the window is full."""
    run = make_run(app, best={"window_versions": 2}, early_stop={"max_drop": 0.25})
    answers = _publish_rewards(client, run, [0.1, 0.5, 0.7, 0.4, 0.1, 0.9])
    # windows: v2 0.3, v3 0.6 (best), v4 0.55, v5 0.25: 0.35 below the best -> stopped at 5
    assert [a["run_status"] for a in answers] == ["running"] * 4 + ["completed"]
    detail = client.get(f"/api/v1/runs/{run.id}", headers=admin_headers).json()
    assert (detail["best_version"], detail["best_metric"]) == (3, "train_reward")
    assert detail["best_value"] == pytest.approx(0.6)
    assert "max_drop 0.25" in detail["status_reason"]


def test_direction_min_and_min_version(app: Any, client: TestClient) -> None:
    run = make_run(
        app,
        best={"metric": "train_reward", "direction": "min", "window_versions": 1},
        early_stop={"patience": 1, "min_version": 4},
    )
    answers = _publish_rewards(client, run, [0.5, 0.2, 0.3, 0.4, 0.1])
    # best (lowest) 0.2 at v2; v3 does not beat it but min_version holds the rule until v4
    assert [a["run_status"] for a in answers] == ["running"] * 3 + ["completed"]
    row = run_row(app, run.id)
    assert (row.best_version, row.current_version) == (2, 4)


def test_no_best_yet_and_the_base_model_as_best(
    app: Any, client: TestClient, admin_headers: dict[str, str]
) -> None:
    run = make_eval_run(app, eval_overrides={"n": 1, "temperature": 0.0})
    missing = client.get(run.url("adapters/best"), headers=admin_headers)
    assert missing.status_code == 404 and missing.json()["code"] == "version_not_found"
    assert "no version has been ranked" in missing.json()["detail"]
    _, token = make_worker(app)
    fencing = attach(client, run)["fencing"]
    drain(client, worker_headers(token))
    _score(client, run, fencing, {0: 2})
    base = client.get(run.url("adapters/best"), headers=admin_headers)
    assert base.status_code == 404 and "version 0, the base model" in base.json()["detail"]
    assert run_row(app, run.id).best_version == 0


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"best": {"metric": "eval_accuracy"}}, "best.metric", "needs an eval block"),
        ({"best": {"window_versions": 0}}, "best.window_versions", "between 1 and"),
        ({"best": {"direction": "up"}}, "best.direction", "max"),
        ({"early_stop": {}}, "early_stop", "patience or max_drop"),
        ({"early_stop": {"patience": 0}}, "early_stop.patience", "between 1 and"),
        ({"early_stop": {"max_drop": -1}}, "early_stop.max_drop", "greater than 0"),
        ({"retention": {"keep_every": 0}}, "retention.keep_every", "between 1 and"),
        ({"retention": {"keep": 1}}, "retention.keep", ""),
    ],
)
def test_bad_best_early_stop_and_retention_fields_are_422(
    client: TestClient,
    admin_headers: dict[str, str],
    fields: dict[str, Any],
    field: str,
    words: str,
) -> None:
    config = example_config(**fields)
    config.pop("eval", None)
    response = client.post("/api/v1/runs", json=config, headers=admin_headers)
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert any(e["field"] == field and words in str(e) for e in errors), errors


def test_the_learner_is_not_sent_the_server_only_blocks(app: Any, client: TestClient) -> None:
    run = make_run(app, best={"window_versions": 2}, early_stop={"patience": 3})
    config = attach(client, run)["run_config"]
    assert not {"best", "early_stop", "retention"} & set(config)
