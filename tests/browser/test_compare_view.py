"""The compare view in Chromium: two runs ticked on the runs page (their boxes kept across the
table's 2-second refresh) and compared; then a sweep opened from the runs page: the charts'
legends name each run by its overrides, the table sorts by a column and back, and no CSP
violation."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.browser.test_dashboard import _shot, chromium, server  # noqa: F401
from tests.conftest import mint_token
from tests.server.dashboard.test_compare import _learner_points
from tests.server.learner.support import make_run
from tests.server.sweeps.conftest import sweep_body

pytestmark = [pytest.mark.browser, pytest.mark.postgres]
NAMES = ("sweep grpo.learning_rate=0.001", "sweep grpo.learning_rate=0.0003")


def _rows(page: Any) -> list[str]:
    return [
        page.locator("#compare-table tbody tr").nth(i).get_attribute("data-run") or ""
        for i in range(page.locator("#compare-table tbody tr").count())
    ]


@pytest.mark.timeout(180)
def test_compare_two_runs_in_chromium(server, chromium) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    base, app = server
    page, _violations = chromium
    high, low = (make_run(app, name=name) for name in NAMES)
    _learner_points(app, high.id, {1: [0.2], 2: [0.6], 3: [0.9]})
    _learner_points(app, low.id, {1: [0.1], 2: [0.2], 3: [0.3]})
    admin = mint_token(app, "admin", name="browser")

    page.goto(f"{base}/runs")
    page.fill("#token", admin)
    page.press("#token", "Enter")
    page.wait_for_url(f"{base}/runs")
    page.check(f"#compare-{high.id}")
    page.wait_for_timeout(2500)  # one refresh of the table: the tick must survive it
    assert page.is_checked(f"#compare-{high.id}")
    page.check(f"#compare-{low.id}")
    page.click("text=Compare selected runs")
    page.wait_for_url(f"{base}/runs/compare?*")

    page.locator('[data-chart="reward"] canvas').first.wait_for(timeout=15_000)
    legend = page.locator('[data-chart="reward"] .u-legend').inner_text()
    assert all(name in legend for name in NAMES), legend
    assert page.get_attribute('[data-chart="reward"]', "data-points") == "3"

    by_reward = page.locator('#compare-table th button:text("Last reward")')
    by_reward.click()
    assert _rows(page) == [str(low.id), str(high.id)]  # ascending: 0.3 before 0.9
    assert by_reward.get_attribute("aria-sort") == "ascending"
    by_reward.click()
    assert _rows(page) == [str(high.id), str(low.id)]
    _shot(page, "10-compare-view")
    href = page.get_attribute("#compare-link", "href")
    assert href is not None and str(high.id) in href and str(low.id) in href


@pytest.mark.timeout(180)
def test_compare_a_sweep_in_chromium(server, chromium) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    base, app = server
    page, _violations = chromium
    admin = mint_token(app, "admin", name="browser")
    body = sweep_body(grid={"grpo.learning_rate": [0.001, 0.0003]})
    with httpx.Client(base_url=base, timeout=30.0) as client:
        created = client.post(
            "/api/v1/sweeps", json=body, headers={"Authorization": f"Bearer {admin}"}
        )
    assert created.status_code == 201, created.text
    sweep = created.json()["sweep"]
    high, low = (r["id"] for r in sweep["runs"])
    _learner_points(app, uuid.UUID(high), {1: [0.2], 2: [0.9]})
    _learner_points(app, uuid.UUID(low), {1: [0.1], 2: [0.3]})

    page.goto(f"{base}/runs")
    page.fill("#token", admin)
    page.press("#token", "Enter")
    page.wait_for_url(f"{base}/runs")
    page.click(f'#sweeps a[data-sweep="{sweep["id"]}"]')
    page.wait_for_url(f"{base}/runs/compare?sweep={sweep['id']}")
    page.locator('[data-chart="reward"] canvas').first.wait_for(timeout=15_000)
    legend = page.locator('[data-chart="reward"] .u-legend').inner_text()
    for label in ("grpo.learning_rate=0.001", "grpo.learning_rate=0.0003"):
        assert label in legend, legend
    assert sweep["name"] not in legend and high not in legend  # overrides, not names nor ids
    by_reward = page.locator('#compare-table th button:text("Last reward")')
    by_reward.click()
    assert _rows(page) == [low, high]
    by_reward.click()
    assert _rows(page) == [high, low]
    _shot(page, "11-compare-sweep")
