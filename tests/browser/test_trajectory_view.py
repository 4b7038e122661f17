"""The run page's "One trajectory" view in Chromium: a multi-turn run with a real format 2 batch
in the bucket; clicking Show swaps in the transcript through HTMX, with no CSP violation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.test_dashboard import _shot, chromium, server  # noqa: F401
from tests.conftest import mint_token
from tests.server.learner.support import make_run
from tests.server.learner.test_trajectory_sample import ENVIRONMENT, _v2_batch

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


@pytest.mark.timeout(120)
def test_trajectory_view_in_chromium(server, chromium, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    base, app = server
    page, _violations = chromium
    run = make_run(app, environment=ENVIRONMENT)
    _batch_id, samples = _v2_batch(app, run.id, tmp_path)
    admin = mint_token(app, "admin", name="browser")
    page.goto(f"{base}/runs")
    page.fill("#token", admin)
    page.press("#token", "Enter")
    page.wait_for_url(f"{base}/runs")
    page.goto(f"{base}/runs/{run.id}")
    row = next(i for i, s in enumerate(samples) if s.trajectory.tool_calls)
    page.fill('input[name="row"]', str(row))
    page.click("text=Show")
    page.locator("#trajectory .transcript").wait_for(timeout=15_000)
    messages = page.locator("#trajectory .transcript > li")
    assert messages.count() == len(samples[row].trajectory.messages)
    assert "tool call calculator" in page.locator("#trajectory").inner_text()
    _shot(page, "09-run-trajectory")
