"""The Projects page in Chromium: a project created through its form is listed with no runs,
and the page reports no CSP violation (the `chromium` fixture fails the test on one)."""

from __future__ import annotations

import pytest

from tests.browser.test_dashboard import _shot, chromium, server  # noqa: F401
from tests.conftest import mint_token

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


@pytest.mark.timeout(120)
def test_create_a_project_in_chromium(server, chromium) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    base, app = server
    page, _violations = chromium
    admin = mint_token(app, "admin", name="browser")
    page.goto(f"{base}/runs")
    page.fill("#token", admin)
    page.press("#token", "Enter")
    page.wait_for_url(f"{base}/runs")
    page.click('nav a[href="/projects"]')
    page.wait_for_url(f"{base}/projects")
    page.fill("#project-name", "team-a")
    page.click("text=Create project")
    row = page.locator('#projects-table tr[data-project="team-a"]')
    row.wait_for(timeout=15_000)
    assert row.locator("td.num").inner_text() == "0"
    _shot(page, "12-projects")
