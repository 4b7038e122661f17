"""The dashboard in Debian's Chromium (Playwright), against a real uvicorn server on Postgres.

One browser launch: log in, create a run through the form (a bad value is refused inline), see
it listed, create a registration token, then drive the real API as two workers and a learner
(typed client + presigned uploads) and watch the run page update without a reload until the
stale-waste alarm banner shows. Screenshots of every page go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import layout
from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient
from protocol.schemas import BatchManifest
from protocol.storage import PresignedPut
from protocol.transfer import upload_presigned
from tests.conftest import mint_token
from tests.harness.live_app import live_app

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

CHROMIUM = "/usr/bin/chromium"
MODEL = "smollm2-135m-instruct"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


@pytest.fixture
def server(pg_url: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """The app served (no scheduler: the page reads the figures on request)."""
    with live_app(pg_url, tmp_path) as served:
        yield served.base, served.app


# Every CSP violation reaches the console: Chromium logs the refusals itself, and the page's
# securitypolicyviolation events are logged too (an init script runs outside the page's CSP).
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => {
  console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI || "inline"}`);
});
"""


def watch_csp(page: Any) -> list[str]:
    """The CSP violations this page reports, collected as they happen."""
    violations: list[str] = []

    def on_console(message: Any) -> None:
        text = message.text
        if "Content Security Policy" in text or text.startswith("CSP violation"):
            violations.append(text)

    page.add_init_script(REPORT_VIOLATIONS)
    page.on("console", on_console)
    return violations


@pytest.fixture
def chromium() -> Iterator[tuple[Any, list[str]]]:
    """A page in Chromium and the CSP violations it reports: none allowed at teardown."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        violations = watch_csp(page)
        yield page, violations
        page.wait_for_timeout(300)  # late console messages
        browser.close()
    assert violations == [], violations


def _shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _wait_text(page: Any, selector: str, pattern: str, timeout_s: float = 15.0) -> None:
    """Wait (no reload) until the element's text matches; the page polls by itself."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        loc = page.locator(selector)
        if loc.count():
            text = loc.first.inner_text()
            if re.search(pattern, text):
                return
        page.wait_for_timeout(200)
    raise AssertionError(f"{selector} never matched {pattern!r} (last: {text!r})")


def _worker_batch(client: AsyncGrpoClient, group_size: int) -> Any:
    """acquire → presigned upload → complete, as a worker does (bytes stand in for Parquet;
    the proxy checks the object's size and the sample count)."""
    lease = client.acquire_lease(timeout_s=10.0)
    assert lease is not None
    data = f"rollouts of {lease.lease_id}".encode() * 10
    digest = hashlib.sha256(data).hexdigest()
    up = client.upload_url(lease, size=len(data), sha256=digest)
    upload_presigned(PresignedPut(url=up.url, headers=up.headers), data)
    manifest = BatchManifest(
        key=layout.batch_key(lease.run_id, lease.lease_id, lease.fencing),
        sha256=digest,
        size=len(data),
        n_samples=len(lease.prompts) * group_size,
        n_tokens=40,
        generation_seconds=1.5,
    )
    done = client.complete_lease(lease, manifest)
    assert done.state == "accepted", done
    return done


def _publish(learner: AsyncGrpoClient, run_id: str, fencing: int, batch_ids: list[str]) -> None:
    files = {"adapter_model.safetensors": b"w" * 4096, "adapter_config.json": b'{"r": 8}'}
    entries = [
        sl.UploadFile(
            name=n,
            size=len(d),
            sha256=hashlib.sha256(d).hexdigest(),
            kind="checkpoint" if n == "trainer_state.json" else "adapter",
        )
        for n, d in {**files, "trainer_state.json": b'{"step": 1}'}.items()
    ]
    blobs = {**files, "trainer_state.json": b'{"step": 1}'}
    ups = learner.request_uploads(
        run_id, sl.UploadsRequest(fencing=fencing, version=1, files=entries)
    )
    published: dict[str, list[sl.PublishedFile]] = {"adapter": [], "checkpoint": []}
    for u in ups.uploads:
        upload_presigned(PresignedPut(url=u.url, headers=u.headers), blobs[u.name])
        published[u.kind].append(
            sl.PublishedFile(
                name=u.name,
                key=u.key,
                sha256=hashlib.sha256(blobs[u.name]).hexdigest(),
                size=len(blobs[u.name]),
            )
        )
    learner.publish_adapter(
        run_id,
        sl.PublishRequest(
            fencing=fencing,
            version=1,
            files=published["adapter"],
            checkpoint_files=published["checkpoint"],
            learner_step=1,
            consumed_batch_ids=batch_ids,  # type: ignore[arg-type]
        ),
    )


def _create_run_through_form(page: Any, base: str) -> tuple[str, str]:
    page.goto(f"{base}/runs/new")
    page.fill("#f-name", "browser-run")
    page.fill("#f-base_model", "smollm2-135m-instruct")
    page.fill("#f-dataset-size", "8")
    page.fill("#f-group_size", "1")  # refused: a group needs at least 2 completions
    page.fill("#f-prompts_per_lease", "1")
    page.fill("#f-prompts_per_step", "2")
    page.fill("#f-max_staleness", "0")
    page.fill("#f-alarms-stale_waste", "0.2")
    page.fill("#f-budget_usd", "5")
    page.click("button[type=submit]:has-text('Create run')")
    error = page.locator('[data-error-for="group_size"]')
    error.wait_for()
    assert "at least 2" in error.inner_text()
    assert page.locator("#f-group_size").get_attribute("aria-invalid") == "true"
    assert page.input_value("#f-name") == "browser-run"
    _shot(page, "02-new-run-error")
    page.fill("#f-group_size", "2")
    page.click("button[type=submit]:has-text('Create run')")
    command = page.locator("#learner-command").inner_text()
    _shot(page, "03-run-created")
    match = re.search(r"--run ([0-9a-f-]{36}) --token (agr_lrn_\S+)", command)
    assert match and command.startswith(f"asyncgrpo learner --server {base} ")
    return match.group(1), match.group(2)


def _ticks(page: Any, chart: str, axis: str) -> list[str]:
    """The tick labels uPlot drew on a chart's axis (app.js records them)."""
    el = page.locator(f'[data-chart="{chart}"]')
    deadline = time.monotonic() + 10
    while not el.get_attribute(f"data-{axis}-ticks") and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    return str(el.get_attribute(f"data-{axis}-ticks") or "").split("|")


def _check_axes(page: Any) -> None:
    """Integer ticks on version/step/staleness axes, counts and rates from 0, compact labels
    for tokens/s, distinct labels on a narrow ratio axis."""
    for chart in ("reward", "tokens", "ratio", "staleness"):
        ticks = _ticks(page, chart, "x")
        assert ticks and all(re.fullmatch(r"-?\d+", t) for t in ticks), (chart, ticks)
    tokens = _ticks(page, "tokens", "y")
    assert tokens[0] == "0" and all(re.fullmatch(r"\d+(\.\d)?k", t) for t in tokens[1:]), tokens
    ratio = _ticks(page, "ratio", "y")
    assert len(ratio) >= 3 and len(set(ratio)) == len(ratio), ratio
    staleness = _ticks(page, "staleness", "y")
    assert staleness[0] == "0" and all(re.fullmatch(r"\d+", t) for t in staleness), staleness


def _file_names_unbroken(page: Any) -> None:
    """In a narrow window an adapter file name wraps as a whole, never mid-word."""
    page.set_viewport_size({"width": 420, "height": 900})
    links = page.locator("a.file-name")
    assert links.count() >= 2
    for i in range(links.count()):
        lines = links.nth(i).evaluate("a => a.getClientRects().length")
        assert lines == 1, links.nth(i).inner_text()
    page.set_viewport_size({"width": 1360, "height": 900})


@pytest.mark.timeout(240)
def test_dashboard_in_chromium(server: tuple[str, Any], chromium: tuple[Any, list[str]]) -> None:
    base, app = server
    page, _violations = chromium
    admin = mint_token(app, "admin", name="browser")
    page.goto(f"{base}/runs")
    assert page.url.endswith("/login")
    page.fill("#token", admin)
    _shot(page, "01-login")
    page.press("#token", "Enter")  # keyboard submit
    page.wait_for_url(f"{base}/runs")

    run_id, learner_token = _create_run_through_form(page, base)

    page.goto(f"{base}/runs")
    assert page.locator(f'tr[data-run="{run_id}"]').inner_text().strip().startswith("browser-run")
    _shot(page, "04-runs")

    page.goto(f"{base}/workers")
    page.fill("#rt-name", "browser pool")
    page.fill("#rt-uses", "2")
    page.click("button:has-text('Create registration token')")
    worker_cmd = page.locator("#worker-command").inner_text()
    reg = re.search(r"--registration-token (agr_reg_\S+)", worker_cmd)
    assert reg and worker_cmd.startswith(f"asyncgrpo worker --server {base} ")
    _shot(page, "05-workers-token")

    page.goto(f"{base}/runs/{run_id}")
    _wait_text(page, "#run-status", "pending")
    _wait_text(page, '[data-chart="reward"]', "nothing yet")
    assert page.locator(".actions button").all_inner_texts() == ["Pause", "Cancel"]

    # -- the real API: a learner and two workers -----------------------------------
    anon = AsyncGrpoClient(base)
    workers = []
    for name, gpu in (("spot-a", "H100"), ("spot-b", "A10G")):
        out = anon.register_worker(
            reg.group(1), name=name, gpu_type=gpu, price_per_hour=2, models=[MODEL]
        )
        workers.append(AsyncGrpoClient(base, out["token"]))
    learner = AsyncGrpoClient(base, learner_token)
    fencing = learner.learner_attach(run_id, "fp-browser").fencing
    _wait_text(page, "#run-status", "running")
    _wait_text(page, '[aria-label="Events"]', "learner.attached")
    assert page.locator(".actions button").all_inner_texts() == ["Pause", "Cancel"]
    for w in workers:
        _worker_batch(w, group_size=2)
    _wait_text(page, '[data-batches="accepted"]', r"^2$")
    points = [
        sl.MetricPointIn(
            step=s,
            version=0,
            values={
                "reward_mean": 0.1 * s,
                "clip_low": 0.01,
                "clip_high": 0.02,
                "ratio_min": 0.9996,  # a narrow band: labels need decimals
                "ratio_max": 1.0004,
                "ratio_mean": 1.0,
                "tokens_per_s": 12_000.0 + 1500 * s,  # labels need compact units
                "learner_busy": 0.9,
                "padding_fraction": 0.2,
                "intake_wait_s": 0.05,
                "publish_s": 0.5,
                "peak_memory_bytes": 2 << 30,
            },
        )
        for s in range(3)
    ]
    learner.post_learner_metrics(run_id, fencing, points)
    first = learner.claim_batches(run_id, fencing, max_groups=1)
    assert len(first.batches) == 1
    _publish(learner, run_id, fencing, [str(first.batches[0].batch_id)])
    _wait_text(page, "#kpi-version", r"^1$")
    second = learner.claim_batches(run_id, fencing, max_groups=1)
    assert second.stale_rejected == 1  # v0 batch at version 1 with max_staleness 0
    # 2 of 4 generated samples rejected stale: 50 % over the 20 % threshold.
    page.locator('[data-alarm="stale_waste"]').wait_for(timeout=15_000)
    _wait_text(page, "#kpi-stale-waste", r"50\.0%")
    _wait_text(page, '[data-rejected="stale"]', r"^1$")
    assert page.locator('a[href$="/adapters/1/adapter_model.safetensors"]').count() == 1
    page.locator('[data-chart="reward"] canvas').first.wait_for(timeout=10_000)
    page.locator('[data-chart="pipeline"] canvas').first.wait_for(timeout=10_000)
    _wait_text(page, "#kpi-peak-memory", r"^2\.00 GiB$")
    page.wait_for_timeout(2500)  # one more chart poll
    _wait_text(page, '[aria-label="Events"]', "version.published")
    _check_axes(page)
    _shot(page, "06-run-detail")
    _file_names_unbroken(page)

    page.goto(f"{base}/runs")
    page.locator('[data-alarm="stale_waste"]').wait_for()
    _shot(page, "07-runs-alarm")
    page.goto(f"{base}/workers")
    assert page.locator('tr[data-worker="spot-a"]').count() == 1
    _shot(page, "08-workers")
    page.goto(f"{base}/cost")
    _shot(page, "09-cost")
    page.goto(f"{base}/planner?model=llama-2-7b&rank=8&targets=qv&link_gbps=1")
    assert page.locator("#plan-adapter-mb").inner_text() == "8.4 MB"
    page.select_option("#p-targets", "all-linear")
    page.fill("#p-rank", "16")
    page.press("#p-rank", "Tab")
    _wait_text(page, "#plan-adapter-mb", r"^80\.0 MB$")
    _shot(page, "10-planner")
    # the Audit page: the workers' registrations are there; its filter form swaps the table
    page.goto(f"{base}/audit")
    assert page.locator('tr[data-action="worker.register"]').count() >= 1
    page.fill('#audit-filters input[name="action"]', "dashboard.login")
    page.click('#audit-filters button[type="submit"]')
    _wait_text(page, "#audit-table", r"^(?![\s\S]*worker\.register)[\s\S]*dashboard\.login")
    _shot(page, "11-audit")
    for c in (anon, learner, *workers):
        c.close()


@pytest.mark.timeout(120)
def test_api_docs_offline_under_the_csp(
    server: tuple[str, Any], chromium: tuple[Any, list[str]]
) -> None:
    """/docs renders Swagger UI from the package: every request stays on the server, and the
    favicon is found."""
    base, _app = server
    page, violations = chromium
    elsewhere: list[str] = []
    missing: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(base) else elsewhere.append(r.url))
    page.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
    page.goto(f"{base}/docs")
    page.locator(".swagger-ui .info .title").wait_for(timeout=20_000)
    assert "asyncgrpo" in page.locator(".swagger-ui .info .title").inner_text()
    page.locator(".opblock").first.wait_for()
    _shot(page, "11-api-docs")
    page.goto(f"{base}/login")
    assert elsewhere == [] and missing == [], (elsewhere, missing)
    assert violations == []


def test_the_csp_watch_sees_a_violation(
    server: tuple[str, Any], chromium: tuple[Any, list[str]]
) -> None:
    """The watcher is live: an inline script the page tries to run is refused and reported."""
    base, _app = server
    page, violations = chromium
    page.goto(f"{base}/login")
    page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.ran = 1'; document.body.appendChild(s); }"
    )
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.ran") is None
    assert violations and any("script-src" in v for v in violations), violations
    violations.clear()


def test_a_dataset_file_uploaded_through_the_form(
    server: tuple[str, Any], chromium: tuple[Any, list[str]], tmp_path: Path
) -> None:
    """Source `uploaded` with a file: the form uploads it through the datasets upload, the run
    is `preparing` on it, and the new-run form then lists it among the stored datasets."""
    base, app = server
    page, _violations = chromium
    data = tmp_path / "questions.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "5"}\n' * 3)
    page.goto(f"{base}/login")
    page.fill("#token", mint_token(app, "admin", name="browser"))
    page.press("#token", "Enter")
    page.wait_for_url(f"{base}/runs")
    page.goto(f"{base}/runs/new")
    page.fill("#f-name", "browser-dataset-run")
    page.select_option("#f-dataset-kind", "uploaded")
    page.set_input_files("#f-dataset-file", str(data))
    page.fill("#f-dataset-prompt_column", "question")
    page.click("button[type=submit]:has-text('Create run')")
    command = page.locator("#learner-command").inner_text()
    run_id = re.search(r"--run ([0-9a-f-]{36})", command)
    assert run_id is not None
    with app.state.sessionmaker() as session:
        from server.models import Run

        run = session.get(Run, uuid.UUID(run_id.group(1)))
        assert run is not None and run.status == "preparing" and run.dataset_id is not None
        dataset_id = str(run.dataset_id)
    page.goto(f"{base}/runs/new")
    page.click("summary:has-text('Stored datasets')")
    table = page.locator("#stored-datasets").inner_text()
    assert "questions.jsonl" in table and dataset_id in table and "question, answer" in table
    _shot(page, "12-new-run-stored-datasets")
