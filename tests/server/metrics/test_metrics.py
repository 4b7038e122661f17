"""`GET /metrics` parses with prometheus_client's parser and carries the run's figures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from server.db import transaction
from server.models import MetricPoint, Run
from tests.conftest import make_settings
from tests.server.jobs.factories import acquire, add_batch, new_run, new_worker
from tests.server.learner.support import attach, make_run


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_carry_run_and_worker_figures(client: TestClient, app: Any) -> None:
    with transaction(app.state.sessionmaker) as session:
        run = new_run(session, n_rows=8)
        worker = new_worker(session, price=2.5)
        l1 = acquire(session, app.state.store, app.state.settings, worker)
        l2 = acquire(session, app.state.store, app.state.settings, worker)
        add_batch(session, run, worker, l1, state="rejected", reject_reason="stale", staleness=3)
        session.add(
            MetricPoint(
                run_id=run.id,
                source="learner",
                step=7,
                values={"clip_low": 0.1, "clip_high": 0.025},
            )
        )
        session.execute(
            update(Run).where(Run.id == run.id).values(current_version=5, spent_usd=1.75)
        )
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    rid = (("run_id", str(run.id)),)
    assert samples[("asyncgrpo_run_current_version", rid)] == 5
    assert samples[("asyncgrpo_run_spent_usd", rid)] == 1.75
    assert samples[("asyncgrpo_run_leases_in_flight", rid)] == 2
    assert samples[("asyncgrpo_run_groups_in_flight", rid)] == 4
    assert samples[("asyncgrpo_run_clip_fraction", rid)] == 0.125
    assert samples[("asyncgrpo_run_stale_waste_ratio", rid)] == 1.0
    assert samples[("asyncgrpo_run_staleness_max", rid)] == 3
    key = ("asyncgrpo_run_rejected_batches_total", (("reason", "stale"), ("run_id", str(run.id))))
    assert samples[key] == 1
    wid = (("worker_id", str(worker.id)),)
    assert samples[("asyncgrpo_worker_leases_in_flight", wid)] == 2
    assert samples[("asyncgrpo_worker_price_per_hour", wid)] == 2.5
    assert 0 <= samples[("asyncgrpo_worker_last_seen_age_seconds", wid)] < 60
    assert l2 is not None


def test_learner_pipeline_gauges_of_running_runs(client: TestClient, app: Any) -> None:
    """The latest learner step's pipeline figures, posted through the learner API, as gauges
    of each running run; a run whose learner does not report them has none."""
    running = make_run(app)
    fencing = attach(client, running)["fencing"]
    points = [
        {"step": 3, "values": {"learner_busy": 0.5, "peak_memory_bytes": 1}},
        {
            "step": 4,
            "values": {
                "learner_busy": 0.75,
                "intake_wait_s": 0.125,
                "publish_s": 2.0,
                "padding_fraction": 0.25,
                "peak_memory_bytes": 123456789,
            },
        },
    ]
    posted = client.post(
        running.url("metrics"), json={"fencing": fencing, "points": points}, headers=running.headers
    )
    assert posted.status_code == 200, posted.text
    silent = make_run(app)
    silent_fencing = attach(client, silent)["fencing"]
    client.post(
        silent.url("metrics"),
        json={"fencing": silent_fencing, "points": [{"step": 0, "values": {"loss": 1.0}}]},
        headers=silent.headers,
    )
    samples = _samples(client.get("/metrics").text)
    rid = (("run_id", str(running.id)),)
    assert samples[("asyncgrpo_run_learner_busy", rid)] == 0.75
    assert samples[("asyncgrpo_run_learner_intake_wait_seconds", rid)] == 0.125
    assert samples[("asyncgrpo_run_learner_publish_seconds", rid)] == 2.0
    assert samples[("asyncgrpo_run_learner_padding_fraction", rid)] == 0.25
    assert samples[("asyncgrpo_run_learner_peak_memory_bytes", rid)] == 123456789
    assert not [
        key for key in samples if key[1] == (("run_id", str(silent.id)),) and "learner" in key[0]
    ]
    with transaction(app.state.sessionmaker) as session:
        session.execute(update(Run).where(Run.id == running.id).values(status="paused"))
    samples = _samples(client.get("/metrics").text)
    assert ("asyncgrpo_run_learner_busy", rid) not in samples


def test_worker_call_counts_carry_the_answering_process(client: TestClient, app: Any) -> None:
    """Under `--workers N` a scrape reaches any one process: each process's counter is its own
    series (label `pid`), so Prometheus never sees one series jump between processes."""
    import os

    app.state.worker_calls["acquire"] += 3
    samples = _samples(client.get("/metrics").text)
    labels = (("call", "acquire"), ("pid", str(os.getpid())))
    assert samples[("asyncgrpo_worker_calls_total", tuple(sorted(labels)))] == 3
    # One series per call and process: no other label (the answering path is gone).
    assert [k for k in samples if k[0] == "asyncgrpo_worker_calls_total"] == [
        ("asyncgrpo_worker_calls_total", tuple(sorted(labels)))
    ]


def test_two_processes_counts_are_two_series() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from server.metrics.service import WorkerCallCollector

    keys = set()
    for pid, count in ((101, 5), (202, 2)):  # what two processes' scrapes answer
        registry = CollectorRegistry(auto_describe=False)
        registry.register(WorkerCallCollector({"heartbeat": count}, pid=pid))
        samples = _samples(generate_latest(registry).decode())
        keys |= {k for k in samples if k[0] == "asyncgrpo_worker_calls_total"}
    assert len(keys) == 2  # a series each, never one series alternating between 5 and 2


@pytest.fixture
def any_app(db_url: str, tmp_path: Path) -> Iterator[Any]:
    """The app on Postgres and on SQLite (the JSON config paths differ between the two)."""
    from server.app import create_app

    application = create_app(make_settings(db_url, tmp_path / "bucket"), migrate=True)
    yield application
    application.state.engine.dispose()


def test_admissible_groups_per_model(any_app: Any) -> None:
    """Σ over running runs of min(bound − groups in flight, queued rows), per model. The
    factory's runs have bound (max_staleness 4 + 1) × weight_sync_steps 1 × prompts_per_step 2
    = 10 groups and 2 prompts per lease."""
    app = any_app
    with transaction(app.state.sessionmaker) as session:
        busy = new_run(session, n_rows=20)  # 20 queued rows, the bound (10) limits
        short = new_run(session, n_rows=3)  # 3 queued rows limit
        paused = new_run(session, n_rows=8, status="paused")
        free = new_run(session, n_rows=6)  # admission control off: every queued row
        for run, model in ((short, "model-b"), (paused, "model-c"), (free, "model-d")):
            session.execute(update(Run).where(Run.id == run.id).values(base_model=model))
        config = dict(session.get(Run, free.id).config)  # type: ignore[union-attr]
        session.execute(
            update(Run)
            .where(Run.id == free.id)
            .values(config={**config, "admission_control": False})
        )
        model_a = busy.base_model
        worker = new_worker(session)
        for _ in range(2):  # two leases of 2 prompts: 4 groups in flight, 16 rows queued
            assert acquire(session, app.state.store, app.state.settings, worker) is not None

    def gauge(name: str) -> dict[str, float]:
        with TestClient(app) as client:
            samples = _samples(client.get("/metrics").text)
        return {dict(k[1])["model"]: v for k, v in samples.items() if k[0] == name}

    admissible = gauge("asyncgrpo_admissible_groups")
    assert admissible == {model_a: 10 - 4, "model-b": 3, "model-c": 0, "model-d": 6}
    assert gauge("asyncgrpo_model_groups_in_flight") == {
        model_a: 4,
        "model-b": 0,
        "model-c": 0,
        "model-d": 0,
    }
    with transaction(app.state.sessionmaker) as session:
        session.execute(update(Run).where(Run.id == short.id).values(base_model="org/Model 7B"))
    with TestClient(app) as client:
        samples = _samples(client.get("/metrics").text)
    key = (
        "asyncgrpo_admissible_groups",
        (("model", "org/Model 7B"), ("model_label", "org_Model_7B")),
    )
    assert samples[key] == 3


def test_model_label_is_a_kubernetes_label_value() -> None:
    from server.metrics.service import model_label

    assert model_label("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen_Qwen2.5-1.5B-Instruct"
    assert model_label("/models/llama/") == "models_llama"
    assert len(model_label("m" * 100)) == 63
