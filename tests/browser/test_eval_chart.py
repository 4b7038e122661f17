"""The eval chart on the run page in Chromium: a run with an eval block, its version 0
evaluated through the real API (a worker's eval leases, the learner's eval claim and results),
drawn beside the reward chart with integer version ticks and no CSP violation."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.browser.test_dashboard import _shot, _ticks, chromium, server  # noqa: F401
from tests.conftest import mint_token
from tests.server.evals.support import drain, eval_block, score_evals
from tests.server.learner.support import RunHandle

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


@pytest.mark.timeout(180)
def test_eval_chart_in_chromium(server, chromium) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    base, app = server
    page, _violations = chromium
    admin = mint_token(app, "admin", name="browser")
    auth = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=base, timeout=30.0) as client:
        config = {
            "name": "eval-chart",
            "base_model": "smollm2-135m-instruct",
            "dataset": {"kind": "generator", "generator": "arithmetic", "size": 2, "seed": 0},
            "rewards": [{"name": "numeric_match"}],
            "group_size": 2,
            "prompts_per_lease": 2,
            "prompts_per_step": 2,
            "eval": eval_block(max_leases_in_flight=4),
        }
        created = client.post("/api/v1/runs", json=config, headers=auth)
        assert created.status_code == 201, created.text
        run = RunHandle(created.json()["run"]["id"], created.json()["learner_token"])
        worker = mint_token(app, "registration", name="pool", max_uses=1)
        registered = client.post(
            "/api/v1/workers/register",
            json={"name": "w", "models": ["smollm2-135m-instruct"]},
            headers={"Authorization": f"Bearer {worker}"},
        )
        assert registered.status_code == 201, registered.text
        worker_auth = {"Authorization": f"Bearer {registered.json()['token']}"}
        attached = client.post(
            run.url("learner/attach"), json={"tokenizer_fingerprint": "fp"}, headers=run.headers
        )
        fencing = attached.json()["fencing"]
        drain(client, worker_auth)  # type: ignore[arg-type]
        score_evals(client, run, fencing)  # type: ignore[arg-type]
        evals = client.get(run.url("evals"), headers=auth).json()
    assert evals["versions"][0]["state"] == "done"

    page.goto(f"{base}/runs")
    page.fill("#token", admin)
    page.press("#token", "Enter")
    page.wait_for_url(f"{base}/runs")
    page.goto(f"{base}/runs/{run.id}")
    page.locator('[data-chart="eval"] canvas').first.wait_for(timeout=15_000)
    ticks = _ticks(page, "eval", "x")
    assert ticks and all(re.fullmatch(r"-?\d+", t) for t in ticks), ticks
    assert "pass@2" in page.locator('[data-chart="eval"]').locator("..").inner_text()
    _shot(page, "08-run-eval-chart")
