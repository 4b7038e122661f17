"""The compare view (server/dashboard/compare.py) on SQLite and Postgres: runs side by side in
the order asked, their per-version figures overlaid over the union of their versions, the
table's figures, and bad choices refused with a code."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from server.db import transaction
from server.models import EvalResult, MetricPoint, RolloutBatch, Run
from tests.conftest import make_settings
from tests.harness.batches import accepted_batch
from tests.server.dashboard.test_pages import login
from tests.server.learner.support import make_run, make_worker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def _learner_points(app: Any, run_id: uuid.UUID, rewards: dict[int, list[float]]) -> None:
    """Steps of the learner's series: each version's steps with the given reward_mean, clip
    low 0.01 and clip high 0.02 × the version."""
    step = 0
    with transaction(app.state.sessionmaker) as session:
        for version, values in rewards.items():
            for reward in values:
                step += 1
                metrics = {"reward_mean": reward, "clip_low": 0.01, "clip_high": 0.02 * version}
                session.add(
                    MetricPoint(
                        run_id=run_id, source="learner", step=step, version=version, values=metrics
                    )
                )


def _evals(app: Any, run_id: uuid.UUID, accuracy: dict[int, float]) -> None:
    with transaction(app.state.sessionmaker) as session:
        for version, value in accuracy.items():
            session.add(
                EvalResult(
                    run_id=run_id, version=version, state="done", accuracy=value, n_prompts=4
                )
            )
        session.add(EvalResult(run_id=run_id, version=99, state="pending", n_prompts=4))


def _ids(*runs: Any) -> str:
    return "&".join(f"ids={r.id}" for r in runs)


def test_runs_side_by_side(app: Any, client: TestClient, admin_token: str) -> None:
    a = make_run(app, name="sweep lr=1e-3")
    b = make_run(app, name="sweep lr=3e-4")
    _learner_points(app, a.id, {1: [0.2, 0.4], 2: [0.5], 3: [0.7]})
    _learner_points(app, b.id, {2: [0.1], 4: [0.3, 0.5]})
    _evals(app, a.id, {0: 0.05, 2: 0.5})
    worker_id, _ = make_worker(app)
    stale = accepted_batch(app, b.id, worker_id, version=2)
    accepted_batch(app, b.id, worker_id, version=2)
    with transaction(app.state.sessionmaker) as session:
        session.execute(
            update(RolloutBatch)
            .where(RolloutBatch.id == stale)
            .values(state="rejected", reject_reason="stale")
        )
        session.execute(update(Run).where(Run.id == a.id).values(best_version=2, best_value=0.5))

    login(client, admin_token)
    charts = client.get(f"/runs/compare/charts.json?{_ids(b, a)}").json()
    reward = charts["reward"]
    assert reward["labels"] == ["version", "sweep lr=3e-4", "sweep lr=1e-3"]  # the order asked
    assert reward["data"][0] == [1, 2, 3, 4]  # the union of both runs' versions
    assert reward["data"][1] == [None, 0.1, None, pytest.approx(0.4)]
    assert reward["data"][2] == [pytest.approx(0.3), 0.5, 0.7, None]  # means over the steps
    assert charts["clip"]["data"][2] == [
        pytest.approx(x) if x else x for x in (0.03, 0.05, 0.07, None)
    ]
    assert charts["eval"]["data"] == [[0, 2], [None, None], [0.05, 0.5]]  # pending left out
    assert charts["stale"]["data"] == [[2], [0.5], [None]]  # half of b's v2 samples were stale

    page = client.get(f"/runs/compare?{_ids(a, b)}")
    assert page.status_code == 200
    text = page.text
    assert text.index("sweep lr=1e-3") < text.index("sweep lr=3e-4")
    assert f'href="/runs/compare?ids={a.id}&amp;ids={b.id}"' in text  # the link reproduces it
    row_a = text[text.index(f'data-run="{a.id}"') :].split("</tr>")[0]
    assert 'data-sort="2">v2' in row_a and "50.0%" in row_a  # best v2; last eval accuracy
    assert 'data-sort="0.7"' in row_a  # the last version's reward mean


def test_a_run_given_twice_is_compared_once(app: Any, client: TestClient, admin_token: str) -> None:
    a = make_run(app, name="only")
    login(client, admin_token)
    charts = client.get(f"/runs/compare/charts.json?ids={a.id},{a.id}&ids={a.id}").json()
    assert charts["reward"]["labels"] == ["version", "only"]


@pytest.mark.parametrize(
    ("query", "status", "code"),
    [
        ("", 422, "invalid_value"),
        ("ids=not-a-uuid", 422, "invalid_value"),
        ("ids=" + ",".join(str(uuid.UUID(int=i + 1)) for i in range(33)), 422, "invalid_value"),
        (f"ids={uuid.UUID(int=7)}", 404, "run_not_found"),  # fixed ids: xdist collects alike
    ],
)
def test_bad_choices_are_refused_with_a_code(
    client: TestClient, admin_token: str, query: str, status: int, code: str
) -> None:
    login(client, admin_token)
    for path in ("/runs/compare", "/runs/compare/charts.json"):
        response = client.get(f"{path}?{query}")
        assert response.status_code == status, response.text
        assert response.json()["code"] == code


def test_the_compare_view_needs_a_session(app: Any, client: TestClient) -> None:
    a = make_run(app)
    response = client.get(f"/runs/compare?ids={a.id}", follow_redirects=False)
    assert response.status_code in (302, 303, 401)


def test_the_runs_page_offers_a_comparison(app: Any, client: TestClient, admin_token: str) -> None:
    a = make_run(app, name="tick me")
    login(client, admin_token)
    page = client.get("/runs").text
    assert 'id="compare-form" method="get" action="/runs/compare"' in page
    assert f'name="ids" value="{a.id}" form="compare-form"' in page
    assert f'id="compare-{a.id}" hx-preserve' in page  # kept across the table's refresh


def _sweep(client: TestClient, admin_token: str) -> dict[str, Any]:
    from tests.server.sweeps.conftest import sweep_body

    headers = {"Authorization": f"Bearer {admin_token}"}
    created = client.post("/api/v1/sweeps", json=sweep_body(), headers=headers)
    assert created.status_code == 201, created.text
    return dict(created.json()["sweep"])


def test_a_sweep_is_compared_by_its_overrides(
    app: Any, client: TestClient, admin_token: str
) -> None:
    sweep = _sweep(client, admin_token)
    runs = sweep["runs"]
    _learner_points(app, uuid.UUID(runs[3]["id"]), {1: [0.5]})
    login(client, admin_token)
    assert f'href="/runs/compare?sweep={sweep["id"]}"' in client.get("/runs").text
    charts = client.get(f"/runs/compare/charts.json?sweep={sweep['id']}").json()
    assert charts["reward"]["labels"] == [
        "version",
        "grpo.learning_rate=1e-05 lora.rank=8",
        "grpo.learning_rate=1e-05 lora.rank=32",
        "grpo.learning_rate=3e-05 lora.rank=8",
        "grpo.learning_rate=3e-05 lora.rank=32",
    ]  # the combination order; the overrides, not the ids nor the sweep's name
    assert charts["reward"]["data"] == [[1], [None], [None], [None], [0.5]]
    page = client.get(f"/runs/compare?sweep={sweep['id']}")
    assert page.status_code == 200
    assert f'href="/runs/compare?sweep={sweep["id"]}"' in page.text  # the link reproduces it
    assert all(f'data-run="{r["id"]}"' in page.text for r in runs)


def test_a_sweep_and_ids_together_or_an_unknown_sweep_are_refused(
    app: Any, client: TestClient, admin_token: str
) -> None:
    sweep = _sweep(client, admin_token)
    login(client, admin_token)
    both = client.get(f"/runs/compare?sweep={sweep['id']}&ids={sweep['runs'][0]['id']}")
    assert both.status_code == 422 and both.json()["code"] == "invalid_value"
    unknown = client.get(f"/runs/compare?sweep={uuid.UUID(int=9)}")
    assert unknown.status_code == 404 and unknown.json()["code"] == "sweep_not_found"
    bad = client.get("/runs/compare?sweep=nope")
    assert bad.status_code == 422


def test_parse_ids_stops_past_its_bound() -> None:
    from server.dashboard.compare import MAX_COMPARED, parse_ids
    from server.errors import Unprocessable

    many = ",".join(str(uuid.UUID(int=i + 1)) for i in range(20_000))
    with pytest.raises(Unprocessable, match=f"more than {MAX_COMPARED}"):
        parse_ids([many + ",not-a-uuid"])  # refused for the count, before the bad id is read
    with pytest.raises(Unprocessable, match="got none"):
        parse_ids([" , ,"])
    twice = [str(uuid.UUID(int=2)), f"{uuid.UUID(int=1)},{uuid.UUID(int=2)}"]
    assert parse_ids(twice) == [uuid.UUID(int=2), uuid.UUID(int=1)]
