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
from tests.conftest import TEST_SECRET, mint_token
from tests.live_server import serve_in_thread
from tests.s3_fixtures import free_port

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
    from server.app import create_app
    from server.config import Settings

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    settings = Settings(
        database_url=pg_url,
        bucket_url=str(tmp_path / "bucket"),
        public_url=base,
        security={"secret_key": TEST_SECRET},
        print_admin_token=False,
        lease_long_poll_s=0.0,
        jobs={"mode": "celery"},  # no scheduler: the page reads the figures on request
    )
    app = create_app(settings, migrate=True)
    with serve_in_thread(app, port) as url:
        yield url, app


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


@pytest.mark.timeout(240)
def test_dashboard_in_chromium(server: tuple[str, Any]) -> None:
    from playwright.sync_api import sync_playwright

    base, app = server
    admin = mint_token(app, "admin", name="browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        page.goto(f"{base}/runs")
        assert page.url.endswith("/login")
        page.fill("#token", admin)
        _shot(page, "01-login")
        page.press("#token", "Enter")  # keyboard submit
        page.wait_for_url(f"{base}/runs")

        run_id, learner_token = _create_run_through_form(page, base)

        page.goto(f"{base}/runs")
        assert page.locator(f'tr[data-run="{run_id}"]').inner_text().startswith("browser-run")
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
                    "ratio_min": 0.9,
                    "ratio_max": 1.2,
                    "ratio_mean": 1.0,
                    "tokens_per_s": 250.0,
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
        _shot(page, "06-run-detail")

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
        browser.close()
        for c in (anon, learner, *workers):
            c.close()
