"""The compare view in Chromium: two runs ticked on the runs page (their boxes kept across the
table's 2-second refresh), compared: the charts' legends name each run as its overrides name it,
the table sorts by a column and back, and no CSP violation."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.test_dashboard import _shot, chromium, server  # noqa: F401
from tests.conftest import mint_token
from tests.server.dashboard.test_compare import _learner_points
from tests.server.learner.support import make_run

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
