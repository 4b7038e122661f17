"""A run's figures per version (server/runs/figures.py), on Postgres and SQLite: the learner's
metric means over each version's steps, the last version's mean, the done eval results, and the
sweep's show and the compare table reading the same last reward."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from server.dashboard.compare import table
from server.models import EvalResult, MetricPoint, Run
from server.runs import figures
from tests.server.sweeps.conftest import sweep_body

pytestmark = pytest.mark.timeout(120)


def _points(db: Session, run_id: uuid.UUID, steps: list[tuple[int | None, dict[str, Any]]]) -> None:
    for step, (version, values) in enumerate(steps, start=1):
        db.add(
            MetricPoint(run_id=run_id, source="learner", step=step, version=version, values=values)
        )
    db.add(MetricPoint(run_id=run_id, source="worker", step=99, version=3, values={"x": 100.0}))
    db.commit()


def _sweep_runs(client: TestClient, admin: dict[str, str]) -> list[uuid.UUID]:
    resp = client.post("/api/v1/sweeps", json=sweep_body(), headers=admin)
    assert resp.status_code == 201, resp.text
    return [uuid.UUID(r["id"]) for r in resp.json()["sweep"]["runs"]]


def test_learner_means_per_version(
    runs_client: TestClient, admin: dict[str, str], db: Session
) -> None:
    run, other, empty = _sweep_runs(runs_client, admin)[:3]
    _points(
        db,
        run,
        [
            (1, {"entropy": 1.0, "clip_low": 0.1, "clip_high": 0.2}),
            (1, {"entropy": 3.0, "clip_low": 0.3, "clip_high": 0.0}),
            (2, {"clip_low": 0.5, "clip_high": 0.5}),  # no entropy: counts for nothing
            (3, {"entropy": 0.5, "clip_low": 0.0}),  # no clip_high: no clip sum
            (None, {"entropy": 9.0}),  # a point of no version
        ],
    )
    _points(db, other, [(1, {"entropy": 7.0})])
    assert figures.version_means(db, run, "entropy", limit=5) == [(3, 0.5), (1, 2.0)]
    assert figures.version_means(db, run, "entropy", limit=1, newest=False) == [(1, 2.0)]
    got = figures.means_by_version(
        db, [run, other, empty], {"e": ("entropy",), "clip": ("clip_low", "clip_high")}
    )
    assert got[run] == {"e": {1: 2.0, 3: 0.5}, "clip": pytest.approx({1: 0.3, 2: 1.0})}
    assert got[other] == {"e": {1: 7.0}, "clip": {}}
    assert got[empty] == {"e": {}, "clip": {}}
    assert figures.last_version_means(db, [run, other, empty], "entropy") == {run: 0.5, other: 7.0}
    assert figures.last_version_means(db, [], "entropy") == {}
    db.rollback()


def test_eval_results_by_version(
    runs_client: TestClient, admin: dict[str, str], db: Session
) -> None:
    run, unscored, empty = _sweep_runs(runs_client, admin)[:3]
    for version, accuracy in ((2, 0.25), (4, 0.5)):
        db.add(
            EvalResult(run_id=run, version=version, state="done", accuracy=accuracy, n_prompts=4)
        )
    db.add(EvalResult(run_id=run, version=6, state="pending", n_prompts=4))
    db.add(EvalResult(run_id=unscored, version=1, state="done", n_prompts=4))
    db.commit()
    got = figures.eval_accuracy_by_version(db, [run, unscored, empty])
    assert got == {run: {2: 0.25, 4: 0.5}, unscored: {1: None}, empty: {}}
    assert [figures.latest_eval(got[i]) for i in (run, unscored, empty)] == [
        (4, 0.5),
        (1, None),
        None,
    ]
    db.rollback()


def test_the_sweep_and_the_compare_table_show_one_last_reward(
    runs_client: TestClient, admin: dict[str, str], db: Session
) -> None:
    run = _sweep_runs(runs_client, admin)[0]
    # the last version's steps average 0.6; its latest step alone says 0.7
    steps = [(1, {"reward_mean": 0.1}), (2, {"reward_mean": 0.5}), (2, {"reward_mean": 0.7})]
    _points(db, run, steps)
    db.add(EvalResult(run_id=run, version=2, state="done", accuracy=0.75, n_prompts=4))
    db.commit()
    sweep_id = db.get_one(Run, run).sweep_id
    db.rollback()
    resp = runs_client.get(f"/api/v1/sweeps/{sweep_id}", headers=admin)
    assert resp.status_code == 200, resp.text
    shown = resp.json()["runs"][0]
    [compared] = table(db, [run])
    assert shown["last_reward"] == pytest.approx(0.6) == compared.last_reward
    assert (shown["eval_version"], shown["eval_accuracy"]) == (2, 0.75)
    assert compared.last_eval_accuracy == 0.75
    db.rollback()
