"""The learner process against the real server (uvicorn, Postgres, local store): it attaches,
claims real Parquet batches written with protocol/batches.py, trains, publishes contiguous
versions, survives kill -9 (restart resumes from the last published checkpoint) and publishes
the final version when the run is exhausted."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from server.db import transaction
from server.models import AdapterVersion, Event, PromptRow, RolloutBatch, Run
from tests.harness.batches import real_batch
from tests.harness.live_app import LiveApp, wait_version
from tests.harness.runs import plus_rows
from tests.server.learner.support import RunHandle, make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]
ROWS = plus_rows(6)


def test_learner_publishes_resumes_after_kill_and_finishes(live: LiveApp, tmp_path: Path) -> None:
    from lm.models import load_tokenizer

    app, bucket = live.app, live.bucket
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={
            "spot_check_fraction": 0.0,
            "learning_rate": 1e-3,
            "lr_schedule": "linear",
            "lr_decay_steps": 4,
        },
        sampling={"max_new_tokens": 8},
    )
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    log = live.learner_log
    batches = [real_batch(app, run.id, worker_id, 0, tok, tmp_path)]
    first = live.learner(run)
    try:
        wait_version(app, run.id, 1, first, log)
        batches.append(real_batch(app, run.id, worker_id, 1, tok, tmp_path))
        wait_version(app, run.id, 2, first, log)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    batches.append(real_batch(app, run.id, worker_id, 2, tok, tmp_path))
    second = live.learner(run)
    try:
        assert second.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.send_signal(signal.SIGKILL)
    with transaction(app.state.sessionmaker) as session:
        run_row = session.get(Run, run.id)
        assert run_row is not None and run_row.status == "completed"
        versions = session.execute(
            select(
                AdapterVersion.version,
                AdapterVersion.final,
                AdapterVersion.learner_step,
                AdapterVersion.files,
                AdapterVersion.metrics,
            )
            .where(AdapterVersion.run_id == run.id)
            .order_by(AdapterVersion.version)
        ).all()
        consumed = dict(
            session.execute(
                select(RolloutBatch.id, RolloutBatch.consumed_version).where(
                    RolloutBatch.run_id == run.id
                )
            ).all()
        )
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert [v.final for v in versions] == [False, False, False, True]
    assert [v.learner_step for v in versions] == [1, 2, 3, 3]  # the final step had nothing left
    assert sorted(consumed[b] for b in batches) == [1, 2, 3]  # each batch in exactly one version
    # the linear decay over 4 steps went on after the kill: step 3 ran at half the peak, not at
    # the peak a restarted schedule would have given it
    rates = [v.metrics.get("learning_rate") for v in versions[:3]]
    assert rates == pytest.approx([1e-3, 0.75e-3, 0.5e-3]), [v.metrics for v in versions]
    # the published final adapter loads with PEFT
    from lm.adapter_io import load_adapter_version
    from lm.models import load_model

    final = versions[-1].files
    folder = tmp_path / "final"
    folder.mkdir()
    for name, meta in final.items():
        (folder / name).write_bytes((bucket / meta["key"]).read_bytes())
    model = load_adapter_version(load_model("smollm2-135m-instruct"), folder)
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) > 0
    # it names the run's base model by its Hub id, not this machine's conversion folder
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # each attachment said so: the first started fresh; after the kill, version 2 resumed with
    # the checkpoint of version 1. The 3 s lease may lapse under load: every extra attachment
    # follows a logged lease loss. A re-attached session checkpoints its first publish, so after
    # a loss version 2 may carry its own checkpoint and be resumed from it.
    lines = log.read_text().splitlines()
    attached = [line for line in lines if "attached to run" in line]
    lost = [line for line in lines if "learner lease lost" in line]
    assert len(attached) == 2 + len(lost), attached + lost
    assert "current version 0, resuming from checkpoint of version None" in attached[0]
    resumable = ["resuming from checkpoint of version 1"]
    if lost:
        resumable.append("resuming from checkpoint of version 2")
    resumed = [line for line in attached if "current version 2," in line]
    assert resumed and all(any(r in line for r in resumable) for line in resumed), attached + lost
    state = json.loads(
        (bucket / f"runs/{run.id}/checkpoints/v000003/trainer_state.json").read_text()
    )
    assert state["step"] == 3 and state["version"] == 3


def test_a_batch_missing_from_the_bucket_is_rejected_not_reclaimed(
    live: LiveApp, tmp_path: Path
) -> None:
    """A claimed batch whose object is gone (404) is rejected as invalid, its prompts re-queued
    with an attempt counted (invariant 12: they end consumed or dropped with a reason). A
    re-attach for fresh URLs would hand the same missing object out again, forever."""
    from lm.models import load_tokenizer

    app, bucket = live.app, live.bucket
    run = make_run(app, dataset={"kind": "jsonl", "rows": ROWS}, grpo={"spot_check_fraction": 0.0})
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    batch_id = real_batch(app, run.id, worker_id, 0, tok, tmp_path)
    with transaction(app.state.sessionmaker) as session:
        key = session.get(RolloutBatch, batch_id).bucket_key  # type: ignore[union-attr]
    (bucket / key).unlink()
    log = live.learner_log
    proc = live.learner(run)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            with transaction(app.state.sessionmaker) as session:
                batch = session.get(RolloutBatch, batch_id)
                assert batch is not None
                if batch.state == "rejected":
                    break
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        assert batch.state == "rejected", log.read_text()[-3000:]
        assert batch.reject_reason == "invalid"
        with transaction(app.state.sessionmaker) as session:
            rows = session.execute(
                select(PromptRow.state, PromptRow.attempts).where(
                    PromptRow.run_id == run.id, PromptRow.last_requeue_reason == "invalid"
                )
            ).all()
        assert rows and all(r.state == "queued" and r.attempts == 1 for r in rows)
        # no re-attach for fresh URLs; the 3 s lease may lapse under load, and a re-attach
        # after a logged lease loss is that, not a retry of the missing object
        reattached = [line for line in log.read_text().splitlines() if "re-attach" in line]
        assert all("learner lease lost" in line for line in reattached), log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


@pytest.mark.parametrize(
    "allowed",
    [None, '["asyncgrpo_tests_no_such_module"]'],
    ids=["not-allowed-at-attach", "allowed-but-not-importable"],
)
def test_a_reward_that_cannot_be_imported_fails_the_run(
    live: LiveApp, tmp_path: Path, allowed: str | None
) -> None:
    """A run whose reward function cannot be loaded would stop every learner the same way:
    the run is `failed` with the reason and an event, and the learner exits non-zero instead
    of leaving the run pending or running forever. A module its host does not allow is refused
    at attach (the learner reports what it can load; nothing is imported); an allowed module
    that does not import fails in the reward processes (`/learner/fail`)."""
    from lm.models import load_tokenizer

    app = live.app
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        rewards=[{"name": "asyncgrpo_tests_no_such_module:reward"}],
        grpo={"spot_check_fraction": 0.0},
    )
    worker_id, _ = make_worker(app)
    real_batch(app, run.id, worker_id, 0, load_tokenizer("smollm2-135m-instruct"), tmp_path)
    log = live.learner_log
    settings = {"REWARD_MODULES": allowed} if allowed else None
    proc = live.learner(run, settings)
    try:
        assert proc.wait(240) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    with transaction(app.state.sessionmaker) as session:
        row = session.get(Run, run.id)
        assert row is not None and row.status == "failed", log.read_text()[-3000:]
        assert row.status_reason is not None
        assert "asyncgrpo_tests_no_such_module" in row.status_reason
        expected = "cannot import" if allowed else "cannot load the run's reward"
        assert expected in row.status_reason, row.status_reason
        if not allowed:
            assert row.learner_attached_at is None  # refused before taking the lease
        kinds = session.execute(
            select(Event.kind).where(Event.run_id == run.id, Event.severity != "info")
        ).scalars()
        assert list(kinds) == ["run.failed"]


def _training(
    live: LiveApp, tmp_path: Path
) -> tuple[RunHandle, uuid.UUID, Any, subprocess.Popen[bytes]]:
    """A run with one batch, and its learner once it has published version 1: (run, the worker
    that wrote the batch, the tokenizer, the learner process)."""
    from lm.models import load_tokenizer

    run = make_run(
        live.app,
        dataset={"kind": "jsonl", "rows": ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 0.0},
        sampling={"max_new_tokens": 8},
    )
    worker_id, _ = make_worker(live.app)
    tok = load_tokenizer("smollm2-135m-instruct")
    real_batch(live.app, run.id, worker_id, 0, tok, tmp_path)
    proc = live.learner(run)
    try:
        wait_version(live.app, run.id, 1, proc, live.learner_log)
    except BaseException:
        proc.send_signal(signal.SIGKILL)
        raise
    return run, worker_id, tok, proc


def test_a_paused_run_keeps_its_learner(live: LiveApp, tmp_path: Path) -> None:
    """Pausing stops the workers, not the learner (docs/architecture/run-lifecycle.md, "Run
    lifecycle"): it publishes from batches it can still claim and waits for more; a cancel then ends
    it."""
    from server.runs import lifecycle

    app, log = live.app, live.learner_log
    run, worker_id, tok, proc = _training(live, tmp_path)
    try:
        with transaction(app.state.sessionmaker) as session:
            lifecycle.admin_action(session, run.id, "pause", "test")
        real_batch(app, run.id, worker_id, 1, tok, tmp_path)
        wait_version(app, run.id, 2, proc, log)
        time.sleep(3.0)  # several claim polls: a learner that stopped would have exited by now
        assert proc.poll() is None, log.read_text()[-3000:]
        with transaction(app.state.sessionmaker) as session:
            lifecycle.admin_action(session, run.id, "cancel", "test")
        assert proc.wait(60) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)


def test_a_run_stopped_early_ends_its_learner_with_exit_0(live: LiveApp, tmp_path: Path) -> None:
    """Early stopping completes a run while its learner trains (server/runs/best.py): the
    learner meets the ended lease, is refused at re-attach with run_ended naming `completed`,
    and exits 0 (a cancelled run still ends it with 1: test_a_paused_run_keeps_its_learner)."""
    from server.runs import lifecycle

    log = live.learner_log
    run, _, _, proc = _training(live, tmp_path)
    try:
        with transaction(live.app.state.sessionmaker) as session:
            assert lifecycle.stop_early(session, run.id, "early stop: test")
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    assert "stopping: run is completed" in log.read_text()
