"""The real learner process (the served app of tests/harness/fixtures.py, Postgres, real
Parquet batches, the small model) with an MLflow tracker named in the run config: its first
step's metrics and the redacted run config reach the MLflow file store; from the second point
on the tracker raises (tests/learner/tracking/failing_learner.py), and the learner logs one
warning and goes on training and publishing to its max_versions."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.batches import real_batch
from tests.harness.live_app import LiveApp, wait_version
from tests.harness.runs import plus_rows
from tests.learner.tracking.support import WEBHOOK, assert_no_secret
from tests.server.learner.support import make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(400)]
ROWS = plus_rows(4, plus=3)


def _learner(live: LiveApp, run: Any, store: Path) -> Any:
    """The learner whose tracker fails from its second point on, to max_versions 2."""
    return live.learner(
        run,
        {"MAX_VERSIONS": "2"},
        command=[sys.executable, "-m", "tests.learner.tracking.failing_learner", "2"],
        args=["--tracking-uri", f"file://{store}"],
        env={"MLFLOW_ALLOW_FILE_STORE": "true"},
    )


def test_steps_reach_mlflow_and_a_failing_tracker_does_not_stop_training(  # type: ignore[no-untyped-def]
    live: LiveApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from lm.models import load_tokenizer

    app = live.app
    run = make_run(
        app,
        name="tracked",
        dataset={"kind": "jsonl", "rows": ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 0.0, "learning_rate": 1e-3},
        sampling={"max_new_tokens": 8},
        alarms={"webhook_url": WEBHOOK},
        tracking={"backend": "mlflow", "project": "e2e", "tags": ["ci"]},
    )
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    store, log = tmp_path / "mlruns", live.learner_log
    real_batch(app, run.id, worker_id, 0, tok, tmp_path)
    proc = _learner(live, run, store)
    try:
        wait_version(app, run.id, 1, proc, log)
        real_batch(app, run.id, worker_id, 1, tok, tmp_path)
        assert proc.wait(240) == 0, log.read_text()[-3000:]  # version 2 published: its limit
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    failures = [line for line in text.splitlines() if "tracker mlflow failed" in line]
    assert len(failures) == 1 and "training goes on without it" in failures[0], failures
    assert "the tracking server is gone (point 2)" in failures[0]
    assert "trained step 2" in text

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file://{store}")
    experiment = client.get_experiment_by_name("e2e")
    assert experiment is not None
    (mirrored,) = client.search_runs([experiment.experiment_id])
    assert mirrored.data.tags["asyncgrpo.run_id"] == str(run.id)
    assert mirrored.info.run_name == f"tracked-{str(run.id)[:8]}"
    assert "ci" in mirrored.data.tags
    loss = client.get_metric_history(mirrored.info.run_id, "train/loss")
    assert [m.step for m in loss] == [1]  # step 2's point was the failing one
    version = client.get_metric_history(mirrored.info.run_id, "train/version")
    assert [(m.step, m.value) for m in version] == [(1, 1.0)]
    assert mirrored.data.metrics["train/learner_busy"] > 0
    assert mirrored.data.params["alarms.webhook_url"] == "[redacted]"
    assert mirrored.data.params["lora.rank"] == "4"
    for f in store.rglob("*"):  # the learner token was on the command line (--token)
        if f.is_file():
            assert run.token.encode() not in f.read_bytes(), f
    assert assert_no_secret(store) >= 1
