"""Dashboard pages through the real app on Postgres: login, CSRF, forms, fragments, charts."""

from __future__ import annotations

import re
import uuid

from fastapi.testclient import TestClient
from sqlalchemy import select

from server.db import transaction
from server.models import MetricPoint, Run, Token
from tests.conftest import mint_token
from tests.server.learner.support import attach, make_run


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def login(client: TestClient, token: str) -> str:
    """Log in through the form; returns the session's CSRF token."""
    page = client.get("/login")
    r = client.post(
        "/login", data={"token": token, "csrf_token": _csrf(page.text)}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    return _csrf(client.get("/runs").text)


def test_pages_need_a_session(client: TestClient) -> None:
    r = client.get("/runs", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    r = client.get("/runs/table", headers={"HX-Request": "true"})
    assert r.headers["HX-Redirect"] == "/login"


def test_login_sets_a_signed_httponly_lax_cookie(client: TestClient, admin_token: str) -> None:
    page = client.get("/login")
    r = client.post(
        "/login",
        data={"token": admin_token, "csrf_token": _csrf(page.text)},
        follow_redirects=False,
    )
    cookie = r.headers["set-cookie"]
    assert "agr_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert admin_token not in cookie
    assert client.get("/runs").status_code == 200
    # A tampered cookie is no session.
    value = client.cookies["agr_session"]
    client.cookies.clear()
    client.cookies.set("agr_session", value[:-2] + ("xx" if not value.endswith("xx") else "yy"))
    assert client.get("/runs", follow_redirects=False).status_code == 303


def test_login_refuses_bad_tokens_and_missing_csrf(client: TestClient, app) -> None:  # type: ignore[no-untyped-def]
    page = client.get("/login")
    worker_token = mint_token(app, "worker", name="w", scope_id=uuid.uuid4())
    for token in ("agr_adm_nope", worker_token):
        r = client.post("/login", data={"token": token, "csrf_token": _csrf(page.text)})
        assert r.status_code == 401 and 'role="alert"' in r.text
        page = r
    admin = mint_token(app, "admin", name="a")
    r = client.post("/login", data={"token": admin, "csrf_token": "forged"})
    assert r.status_code == 403


def test_revoking_the_admin_token_ends_the_session(client: TestClient, app, admin_token) -> None:  # type: ignore[no-untyped-def]
    login(client, admin_token)
    with transaction(app.state.sessionmaker) as session:
        token = session.execute(select(Token).where(Token.kind == "admin")).scalar_one()
        token.revoked_at = token.created_at
    assert client.get("/runs", follow_redirects=False).status_code == 303


def test_every_post_checks_csrf_and_logout(client: TestClient, admin_token: str) -> None:
    csrf = login(client, admin_token)
    assert client.post("/runs/new", data={"name": "x"}).status_code == 403
    assert client.post("/workers/registration-tokens", data={}).status_code == 403
    r = client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get("/runs", follow_redirects=False).status_code == 303


def test_a_refused_form_carries_its_error_code(client: TestClient, admin_token: str) -> None:
    # the login form without its double-submit token: a page that shows the code
    r = client.post("/login", data={"token": admin_token, "csrf_token": "forged"})
    assert (r.status_code, r.headers["X-Error-Code"]) == (403, "csrf_failed")
    assert r.headers["content-type"].startswith("text/html")
    assert "Error code: <code>csrf_failed</code>" in r.text
    login(client, admin_token)
    # a logged-in POST without the session's token, as a page and as JSON
    page = client.post("/runs/new", data={"name": "x"}, headers={"Accept": "text/html"})
    assert page.status_code == 403 and "<code>csrf_failed</code>" in page.text
    wants_json = {"Accept": "application/json", "HX-Request": "true"}
    answer = client.post("/workers/registration-tokens", data={}, headers=wants_json)
    assert answer.status_code == 403 and answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert body["code"] == "csrf_failed" and "CSRF token" in body["detail"]
    assert client.get("/runs").status_code == 200  # the session is untouched


def _form(**fields: str) -> dict[str, str]:
    base = {"name": "form-run", "base_model": "smollm2-135m-instruct", "rewards": "numeric_match"}
    base.update(fields)
    return base


def test_new_run_errors_are_inline_and_nothing_is_created(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    csrf = login(client, admin_token)
    r = client.post(
        "/runs/new",
        data={
            **_form(group_size="1", **{"lora.rank": "abc", "alarms.stale_waste": "2"}),
            "csrf_token": csrf,
        },
    )
    assert r.status_code == 422
    for name in ("group_size", "lora.rank", "alarms.stale_waste"):
        assert re.search(rf'data-error-for="{re.escape(name)}">[^<]+', r.text), name
    assert "must be at least 2" in r.text
    assert 'value="form-run"' in r.text  # what was typed stays
    with transaction(app.state.sessionmaker) as session:
        assert session.execute(select(Run)).first() is None


def test_a_loopback_webhook_is_a_field_error_in_the_form(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    csrf = login(client, admin_token)
    form = {**_form(**{"alarms.webhook_url": "http://127.0.0.1:9/hook"}), "csrf_token": csrf}
    r = client.post("/runs/new", data=form)
    assert r.status_code == 422
    assert re.search(r'data-error-for="alarms\.webhook_url">[^<]*refused', r.text)
    with transaction(app.state.sessionmaker) as session:
        assert session.execute(select(Run)).first() is None


def test_a_refused_loss_combination_is_a_field_error_in_the_form(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    csrf = login(client, admin_token)
    fields = {"grpo.loss_type": "cispo", "grpo.importance_level": "sequence"}
    r = client.post("/runs/new", data={**_form(**fields), "csrf_token": csrf})
    assert r.status_code == 422
    assert re.search(r'data-error-for="grpo\.importance_level">[^<]*loss_type', r.text)
    assert 'value="cispo" selected' in r.text  # what was chosen stays
    with transaction(app.state.sessionmaker) as session:
        assert session.execute(select(Run)).first() is None


def test_new_run_from_jsonl_upload_shows_token_and_command_once(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    csrf = login(client, admin_token)
    jsonl = (
        b'{"prompt": "What is 1+1?", "answer": "2"}\n{"prompt": "What is 2+2?", "answer": "4"}\n'
    )
    r = client.post(
        "/runs/new",
        data={**_form(**{"dataset.kind": "jsonl", "max_staleness": "2"}), "csrf_token": csrf},
        files={"dataset.file": ("rows.jsonl", jsonl, "application/json")},
    )
    assert r.status_code == 200, r.text
    token = re.search(r'id="learner-token">(agr_lrn_[^<]+)<', r.text)
    assert token
    with transaction(app.state.sessionmaker) as session:
        run = session.execute(select(Run)).scalar_one()
        assert run.config["max_staleness"] == 2 and run.config["dataset"]["kind"] == "jsonl"
        run_id = run.id
    command = (
        f"asyncgrpo learner --server http://testserver --run {run_id} --token {token.group(1)}"
    )
    assert command in r.text
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and token.group(1) not in page.text
    listing = client.get("/runs").text
    assert "form-run" in listing
    assert "form-run" not in client.get("/runs?status=running").text


def test_bad_jsonl_is_reported_next_to_the_file(client: TestClient, admin_token: str) -> None:
    csrf = login(client, admin_token)
    r = client.post(
        "/runs/new",
        data={**_form(**{"dataset.kind": "jsonl"}), "csrf_token": csrf},
        files={"dataset.file": ("rows.jsonl", b'{"prompt": ""}\n', "application/json")},
    )
    assert r.status_code == 422
    assert re.search(r'data-error-for="dataset.file">line 1: ', r.text)


def test_pause_resume_cancel_buttons(client: TestClient, admin_token: str) -> None:
    csrf = login(client, admin_token)
    r = client.post("/runs/new", data={**_form(), "csrf_token": csrf})
    run_id = re.search(r"--run ([0-9a-f-]{36})", r.text).group(1)  # type: ignore[union-attr]
    hx = {"HX-Request": "true", "X-CSRF-Token": csrf}
    r = client.post(f"/runs/{run_id}/pause", headers=hx)
    assert r.status_code == 200 and 'id="run-status">paused' in r.text
    r = client.post(f"/runs/{run_id}/resume", headers=hx)
    assert 'id="run-status">pending' in r.text
    r = client.post(f"/runs/{run_id}/cancel", headers=hx)
    assert 'id="run-status">cancelled' in r.text
    r = client.post(f"/runs/{run_id}/resume", headers=hx)
    assert 'class="flash"' in r.text and "cannot resume" in r.text
    assert client.post(f"/runs/{run_id}/pause", headers={"HX-Request": "true"}).status_code == 403


def test_registration_token_shown_once_with_worker_command(
    client: TestClient, admin_token: str
) -> None:
    csrf = login(client, admin_token)
    r = client.post(
        "/workers/registration-tokens",
        data={"name": "pool", "ttl_hours": "2", "max_uses": "3", "csrf_token": csrf},
    )
    assert r.status_code == 200
    token = re.search(r'id="registration-token">(agr_reg_[^<]+)<', r.text).group(1)  # type: ignore[union-attr]
    assert f"asyncgrpo worker --server http://testserver --registration-token {token}" in r.text
    worker = client.post(
        "/api/v1/workers/register",
        json={"name": "gpu-1", "gpu_type": "H100"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert worker.status_code == 201
    page = client.get("/workers").text
    assert "gpu-1" in page and token not in page
    wid = worker.json()["id"]
    r = client.post(f"/workers/{wid}/revoke", headers={"HX-Request": "true", "X-CSRF-Token": csrf})
    assert r.status_code == 200 and 'class="badge revoked"' in r.text


def test_charts_json_carries_the_learner_series(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    csrf = login(client, admin_token)
    r = client.post("/runs/new", data={**_form(), "csrf_token": csrf})
    run_id = uuid.UUID(re.search(r"--run ([0-9a-f-]{36})", r.text).group(1))  # type: ignore[union-attr]
    with transaction(app.state.sessionmaker) as session:
        for step in range(4):
            values = {
                "reward_mean": step / 4,
                "clip_low": 0.01 * step,
                "clip_high": 0.02,
                "ratio_min": 0.9,
                "ratio_max": 1.1,
                "ratio_mean": 1.0,
                "tokens_per_s": 100,
            }
            session.add(
                MetricPoint(
                    run_id=run_id, source="learner", step=step, version=step // 2, values=values
                )
            )
    data = client.get(f"/runs/{run_id}/charts.json").json()
    assert data["reward"]["data"] == [[0, 1], [0.125, 0.625]]
    assert data["clip"]["data"][0] == [0, 1, 2, 3]
    assert data["clip"]["data"][1] == [0.0, 0.01, 0.02, 0.03]
    assert data["clip"]["data"][3] == [0.2] * 4
    assert data["tokens"]["data"][1] == [100.0] * 4
    listing = client.get("/runs").text
    assert "<polyline" in listing


def test_cost_and_planner_pages(client: TestClient, admin_token: str) -> None:
    login(client, admin_token)
    r = client.get("/cost")
    assert r.status_code == 200 and "H100" in r.text
    r = client.get("/planner?model=llama-2-7b&rank=16&targets=all-linear&link_gbps=1")
    assert 'id="plan-adapter-mb">80.0 MB' in r.text and 'id="plan-sync-s">0.64 s' in r.text
    r = client.get("/planner?rank=0", headers={"HX-Request": "true"})
    assert "rank must be between" in r.text and "<html" not in r.text
    assert client.get("/static/vendor/htmx-2.0.11.min.js").status_code == 200


PIPELINE = {
    "learner_busy": 0.8,
    "intake_wait_s": 0.25,
    "publish_s": 1.5,
    "padding_fraction": 0.125,
    "peak_memory_bytes": 3 << 29,  # 1.5 GiB
}


def test_learner_pipeline_telemetry_on_the_run_page(
    client: TestClient,
    app,
    admin_token: str,  # type: ignore[no-untyped-def]
) -> None:
    """Points posted through the learner API: the pipeline figures chart per step; a point of
    a learner that does not report them leaves gaps, and the page still renders."""
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    points = [
        {"step": 0, "version": 0, "values": {"loss": 1.0}},
        {"step": 1, "version": 0, "values": {**PIPELINE, "loss": 0.9}},
        {"step": 2, "version": 1, "values": {**PIPELINE, "learner_busy": 0.6, "publish_s": None}},
    ]
    stored = client.post(
        run.url("metrics"), json={"fencing": fencing, "points": points}, headers=run.headers
    )
    assert stored.status_code == 200, stored.text
    login(client, admin_token)
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    for chart in ("pipeline", "timing", "memory"):
        assert f'data-chart="{chart}"' in page.text
    assert re.search(r'id="kpi-learner-busy">60\.0%<', page.text)
    assert re.search(r'id="kpi-peak-memory">1\.50 GiB<', page.text)
    data = client.get(f"/runs/{run.id}/charts.json").json()
    assert data["pipeline"]["labels"] == ["step", "learner busy", "padding fraction"]
    assert data["pipeline"]["data"] == [[0, 1, 2], [None, 0.8, 0.6], [None, 0.125, 0.125]]
    assert data["timing"]["data"] == [[0, 1, 2], [None, 0.25, 0.25], [None, 1.5, None]]
    assert data["memory"]["data"] == [[0, 1, 2], [None, 1.5, 1.5]]


def test_run_page_without_pipeline_telemetry(client: TestClient, app, admin_token: str) -> None:  # type: ignore[no-untyped-def]
    run = make_run(app)
    fencing = attach(client, run)["fencing"]
    client.post(
        run.url("metrics"),
        json={"fencing": fencing, "points": [{"step": 0, "values": {"loss": 1.0}}]},
        headers=run.headers,
    )
    login(client, admin_token)
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    assert 'id="kpi-learner-busy">—<' in page.text and 'id="kpi-peak-memory">—<' in page.text
    data = client.get(f"/runs/{run.id}/charts.json").json()
    assert data["pipeline"]["data"] == [[0], [None], [None]]
