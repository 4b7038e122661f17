"""Issue 17: the run page offers only the actions the run's status allows and lists publishes,
attaches and status changes as events; an empty base model takes the default; /docs and the
favicon are served from the package; every response carries the security headers and no page
has inline script (the browser tests check the CSP itself in Chromium)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select

from server.db import transaction
from server.models import Event, Run, WebhookDelivery
from server.security_headers import CONTENT_SECURITY_POLICY
from tests.server.dashboard.test_pages import _form, login
from tests.server.learner.support import attach, make_run, upload_and_publish

SECURITY_GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "security.md"
HOOK = "https://hooks.example.com/asyncgrpo"
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE)
EVENT_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.IGNORECASE)


def _actions(html: str, run_id: object) -> list[str]:
    return re.findall(rf'action="/runs/{run_id}/(pause|resume|cancel)"', html)


def test_the_run_page_offers_the_actions_the_status_allows(
    client: TestClient, admin_token: str
) -> None:
    csrf = login(client, admin_token)
    created = client.post("/runs/new", data={**_form(), "csrf_token": csrf})
    run_id = re.search(r"--run ([0-9a-f-]{36})", created.text).group(1)  # type: ignore[union-attr]
    assert _actions(client.get(f"/runs/{run_id}").text, run_id) == ["pause", "cancel"]
    hx = {"HX-Request": "true", "X-CSRF-Token": csrf}
    paused = client.post(f"/runs/{run_id}/pause", headers=hx).text
    assert _actions(paused, run_id) == ["resume", "cancel"]
    assert _actions(client.get(f"/runs/{run_id}/live").text, run_id) == ["resume", "cancel"]
    cancelled = client.post(f"/runs/{run_id}/cancel", headers=hx).text
    assert _actions(cancelled, run_id) == []


def test_publishes_attaches_and_status_changes_are_events(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    run = make_run(app, alarms={"webhook_url": HOOK})
    fencing = attach(client, run)["fencing"]
    published = upload_and_publish(client, run, fencing, 1)
    assert published.status_code == 200, published.text
    csrf = login(client, admin_token)
    hx = {"HX-Request": "true", "X-CSRF-Token": csrf}
    assert client.post(f"/runs/{run.id}/pause", headers=hx).status_code == 200
    page = client.get(f"/runs/{run.id}").text
    rows = re.findall(
        r"<tr><td>[^<]*</td><td>([a-z._]+)</td><td>([a-z]+)</td><td>([^<]*)</td>", page
    )
    assert sorted(kind for kind, _severity, _message in rows) == [
        "learner.attached",
        "run.status",
        "version.published",
    ]
    assert "no events" not in page
    messages = {kind: message for kind, _severity, message in rows}
    assert "version 1 published" in messages["version.published"]
    assert "paused" in messages["run.status"]
    with transaction(app.state.sessionmaker) as session:
        severities = set(
            session.execute(select(Event.severity).where(Event.run_id == run.id)).scalars()
        )
        deliveries = session.execute(select(WebhookDelivery)).all()
    # Shown on the page, not sent to the webhook (it is for alarms and failures).
    assert severities == {"info"} and deliveries == []


def test_an_empty_base_model_takes_the_default(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    csrf = login(client, admin_token)
    page = client.get("/runs/new").text
    assert "Empty fields take their defaults" in page
    r = client.post("/runs/new", data={**_form(base_model="  "), "csrf_token": csrf})
    assert r.status_code == 200, r.text
    with transaction(app.state.sessionmaker) as session:
        config = session.execute(select(Run.config)).scalar_one()
    assert config["base_model"] == "smollm2-135m-instruct"
    # The name has no default: empty is still a field error.
    r = client.post("/runs/new", data={**_form(name=""), "csrf_token": csrf})
    assert r.status_code == 422 and 'data-error-for="name"' in r.text


def test_api_docs_use_only_packaged_assets(client: TestClient) -> None:
    r = client.get("/docs")
    assert r.status_code == 200
    html = r.text
    assert "cdn" not in html.lower() and "http://" not in html and "https://" not in html
    assert not INLINE_SCRIPT.search(html) and not EVENT_HANDLER.search(html)
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert len(assets) == 4, assets  # icon, css, bundle, init script
    for url in assets:
        assert url.startswith("/static/"), url
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url
    assert 'data-openapi-url="/openapi.json"' in html
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/redoc").status_code == 404
    for name in ("swagger-ui-LICENSE.txt", "swagger-ui-NOTICE.txt"):
        assert client.get(f"/static/vendor/{name}").status_code == 200


def test_favicon_is_served(client: TestClient) -> None:
    r = client.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    assert r.content.startswith(b"<svg")
    assert '<link rel="icon" href="/static/favicon.svg"' in client.get("/login").text


def test_every_response_carries_the_security_headers(client: TestClient, admin_token: str) -> None:
    responses = [
        client.get("/login"),
        client.get("/docs"),
        client.get("/static/app.js"),
        client.get("/openapi.json"),
        client.get("/healthz"),
        client.get("/api/v1/runs"),  # 401
        client.get("/no-such-page"),  # 404
        client.post("/api/v1/runs", content=b"x" * (70 << 20)),  # 413 from the body limit
        client.get("/runs", follow_redirects=False),  # 303
    ]
    assert [r.status_code for r in responses][-4:] == [401, 404, 413, 303]
    for r in responses:
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, r.url
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "same-origin"
    policy = dict(d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";"))
    assert policy["script-src"] == "'self'" and "unsafe" not in policy["script-src"]
    assert policy["frame-ancestors"] == "'none'"
    assert CONTENT_SECURITY_POLICY in SECURITY_GUIDE.read_text()  # the guide quotes it exactly


def test_no_page_has_inline_script(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    run = make_run(app)
    pages = ["/login"]
    login(client, admin_token)
    pages += ["/runs", "/runs/new", "/workers", "/cost", "/planner", f"/runs/{run.id}"]
    pages += [f"/runs/{run.id}/live", "/runs/table", "/workers/table"]
    for url in pages:
        html = client.get(url).text
        assert not INLINE_SCRIPT.search(html), url
        assert not EVENT_HANDLER.search(html), url
        assert "javascript:" not in html, url
    base = client.get("/runs").text
    assert '"allowEval": false' in base and '"includeIndicatorStyles": false' in base


def test_chart_specs_name_their_axes(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    """Versions, steps and staleness are integers; counts and rates start at 0 (app.js)."""
    run = make_run(app)
    login(client, admin_token)
    charts = client.get(f"/runs/{run.id}/charts.json").json()
    for key in ("reward", "clip", "ratio", "tokens", "pipeline", "timing", "memory", "staleness"):
        assert charts[key]["x"] == "int", key
    for key in ("waste", "rejections", "spend"):
        assert charts[key]["time"] is True, key
    assert charts["staleness"]["y"] == charts["rejections"]["y"] == "count"
    assert charts["tokens"]["y"] == "compact" and charts["ratio"]["y"] == "ratio"
