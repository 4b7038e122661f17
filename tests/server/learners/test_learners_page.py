"""The dashboard's Learners page (the pool learners, their runs, revoke) and the pool learners
beside the workers on the Cost page."""

from __future__ import annotations

import pytest

from server.db import transaction
from server.jobs.costs import accrue_costs
from tests.conftest import mint_token
from tests.server.dashboard.test_pages import login
from tests.server.learner.support import make_run, run_row
from tests.server.learners.conftest import attach, backdate, register, take, taken_ids

pytestmark = pytest.mark.timeout(120)


def test_the_learners_page_lists_and_revokes(runs_app, runs_client) -> None:
    run = make_run(runs_app)
    learner_id, pool = register(runs_client, runs_app, name="gpu-box-1")
    assert taken_ids(take(runs_client, pool, 1)) == [run.id]
    assert runs_client.get("/learners", follow_redirects=False).status_code == 303
    csrf = login(runs_client, mint_token(runs_app, "admin", name="page"))
    page = runs_client.get("/learners")
    assert page.status_code == 200
    assert 'href="/learners" aria-current="page"' in page.text
    assert 'data-pool-learner="gpu-box-1"' in page.text and 'data-runs-held="1"' in page.text
    assert f'href="/runs/{run.id}"' in page.text and "H100" in page.text
    table = runs_client.get("/learners/table", headers={"HX-Request": "true"})
    assert table.status_code == 200 and "gpu-box-1" in table.text
    no_csrf = runs_client.post(f"/learners/{learner_id}/revoke", follow_redirects=False)
    assert no_csrf.status_code == 403
    revoked = runs_client.post(
        f"/learners/{learner_id}/revoke", data={"csrf_token": csrf}, follow_redirects=False
    )
    assert revoked.status_code == 303 and revoked.headers["location"] == "/learners"
    assert 'data-pool-learner-state="revoked"' in runs_client.get("/learners").text
    assert run_row(runs_app, run.id).pool_learner_id is None
    refused = runs_client.post("/api/v1/learners/take", json={"max": 1}, headers=pool)
    assert refused.status_code == 401


def test_the_cost_page_shows_pool_learners_beside_workers(runs_app, runs_client) -> None:
    run = make_run(runs_app)
    learner_id, pool = register(runs_client, runs_app, name="gpu-box-2", price_per_hour=36.0)
    assert taken_ids(take(runs_client, pool, 1)) == [run.id]
    assert attach(runs_client, pool, run.id).status_code == 200
    backdate(runs_app, learner_id, [run.id], 100.0)
    with transaction(runs_app.state.sessionmaker) as session:
        assert accrue_costs(session, silent_s=60.0) > 0.9  # 100 s at 36 USD/h: 1 USD
    login(runs_client, mint_token(runs_app, "admin", name="page"))
    page = runs_client.get("/cost")
    assert page.status_code == 200
    assert "Per pool learner" in page.text and 'data-pool-learner="gpu-box-2"' in page.text
