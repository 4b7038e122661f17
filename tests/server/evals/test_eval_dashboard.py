"""The run page's eval chart: shown beside the reward chart for a run with an eval block, fed
by charts.json with each evaluated version's accuracy, pass@n and mean reward."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.server.dashboard.test_pages import login
from tests.server.evals.support import drain, make_eval_run, score_evals, worker_headers
from tests.server.learner.support import attach, make_run, make_worker


def test_eval_chart_on_the_run_page(client: TestClient, app, admin_token: str) -> None:  # type: ignore[no-untyped-def]
    run = make_eval_run(
        app, n_rows=2, prompts_per_step=2, eval_overrides={"max_leases_in_flight": 4}
    )
    _, token = make_worker(app)
    fencing = attach(client, run)["fencing"]
    drain(client, worker_headers(token))
    score_evals(client, run, fencing)
    evals = client.get(run.url("evals"), headers={"Authorization": f"Bearer {admin_token}"}).json()
    v0 = evals["versions"][0]
    assert v0["state"] == "done"
    proxy = client.get(
        run.url("metrics"), headers={"Authorization": f"Bearer {admin_token}"}
    ).json()["proxy"]
    assert proxy["samples_generated"] == 2 * 2  # training's 2 prompts × G; eval not counted

    login(client, admin_token)
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    assert 'data-chart="eval"' in page.text and "pass@2" in page.text
    assert page.text.index('data-chart="reward"') < page.text.index('data-chart="eval"')
    chart = client.get(f"/runs/{run.id}/charts.json").json()["eval"]
    assert chart["labels"] == ["version", "accuracy", "pass@2", "mean reward"]
    assert chart["data"] == [[0], [v0["accuracy"]], [v0["pass_at_n"]], [v0["mean_reward"]]]


def test_no_eval_chart_without_an_eval_block(client: TestClient, app, admin_token: str) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app)
    login(client, admin_token)
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200 and 'data-chart="eval"' not in page.text
    assert client.get(f"/runs/{run.id}/charts.json").json()["eval"]["data"] == [[], [], [], []]
