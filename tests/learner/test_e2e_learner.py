"""The learner process against the real server (uvicorn, Postgres, local store): it attaches,
claims real Parquet batches written with protocol/batches.py, trains, publishes contiguous
versions, survives kill -9 (restart resumes from the last published checkpoint) and publishes
the final version when the run is exhausted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from protocol.batches import BatchMetadata, RolloutSample, write_batch
from protocol.layout import batch_key
from protocol.run_config import RunConfig
from server.db import transaction
from server.models import AdapterVersion, DatasetRow, Event, Lease, PromptRow, RolloutBatch, Run
from tests.conftest import make_settings
from tests.live_server import serve_in_thread
from tests.server.learner.support import make_run, make_worker, next_fencing, record_accepted

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]
ROWS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]


@pytest.fixture
def live(pg_url: str, tmp_path: Path) -> Iterator[tuple[str, Any, Path]]:
    from server.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    bucket = tmp_path / "bucket"
    settings = make_settings(pg_url, bucket, learner_lease_ttl_s=3.0)
    settings = settings.model_copy(update={"public_url": base, "lease_long_poll_s": 1.0})
    app = create_app(settings, migrate=True)
    with serve_in_thread(app, port):
        yield base, app, bucket


Scorer = Callable[[list[int], list[int]], list[float]]


def _samples(
    session: Any, rows: list[PromptRow], config: RunConfig, tok: Any, score: Scorer | None = None
) -> list[Any]:
    """Per prompt one correct and one wrong completion, tokenized as a worker would; behaviour
    log-probs from `score(prompt ids, completion ids)` (default: -1 each)."""
    from lm.chat import encode_prompt

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    samples = []
    for row in rows:
        data = session.get(DatasetRow, row.dataset_row_id)
        ids = encode_prompt(tok, data.prompt, config.grpo.system_prompt)
        for g, text in enumerate([str(data.reference["answer"]), "no"]):
            comp = tok.encode(text, add_special_tokens=False) + [eos]
            logprobs = score(ids, comp) if score is not None else [-1.0] * len(comp)
            samples.append(RolloutSample(row.id, g, ids, comp, logprobs, "stop"))
    return samples


def _real_batch(
    app: Any,
    run_id: uuid.UUID,
    worker_id: uuid.UUID,
    version: int,
    tok: Any,
    tmp: Path,
    put: Callable[[str, bytes], Any] | None = None,
    score: Scorer | None = None,
) -> uuid.UUID:
    """What acquire + upload + complete leave behind, with a real Parquet file: the next two
    queued rows leased and accepted into one completed lease's batch (committed at once, so
    the learner never sees it half-written). `put` stores the object (default: the app's
    store); `score` gives the behaviour log-probs (see `_samples`)."""
    from lm.chat import tokenizer_fingerprint

    with transaction(app.state.sessionmaker) as session:
        run = session.get(Run, run_id)
        assert run is not None
        config = RunConfig.model_validate(run.config)
        rows = list(
            session.execute(
                select(PromptRow)
                .where(PromptRow.run_id == run_id, PromptRow.state == "queued")
                .order_by(PromptRow.queue_pos)
                .limit(config.prompts_per_lease)
            ).scalars()
        )
        fencing = next_fencing(session, run_id)
        lease = Lease(
            run_id=run_id,
            worker_id=worker_id,
            adapter_version=version,
            fencing=fencing,
            state="completed",
            expires_at=run.created_at,
            seed=1,
            n_prompts=len(rows),
            group_size=config.group_size,
        )
        session.add(lease)
        session.flush()
        adapter_sha = session.execute(
            select(AdapterVersion.sha256).where(
                AdapterVersion.run_id == run_id, AdapterVersion.version == version
            )
        ).scalar_one_or_none()
        meta = BatchMetadata(
            run_id=str(run_id),
            lease_id=str(lease.id),
            fencing=fencing,
            worker_id=str(worker_id),
            adapter_version=version,
            adapter_sha256=adapter_sha,
            tokenizer_fingerprint=tokenizer_fingerprint(tok),
            sampling=config.sampling.model_dump(),
        )
        path = tmp / f"{lease.id}.parquet"
        info = write_batch(path, meta, _samples(session, rows, config, tok, score))
        key = batch_key(run_id, lease.id, fencing)
        (put or app.state.store.put_bytes)(key, path.read_bytes())
        batch = RolloutBatch(
            run_id=run_id,
            lease_id=lease.id,
            worker_id=worker_id,
            adapter_version=version,
            bucket_key=key,
            sha256=info.sha256,
            bytes=info.bytes,
            n_samples=info.n_samples,
            n_tokens=info.n_tokens,
            n_groups=info.n_groups,
            tokenizer_fingerprint=meta.tokenizer_fingerprint,
            state="accepted",
        )
        return record_accepted(session, run_id, lease.id, batch, rows)


def _learner(
    base: str,
    run: Any,
    work: Path,
    log: Path,
    settings: dict[str, str] | None = None,
    hold_publish_from: int | None = None,
) -> subprocess.Popen[bytes]:
    """`asyncgrpo learner` as a process; `settings` are extra ASYNCGRPO_LEARNER_* values;
    `hold_publish_from`: its first upload of that version or later hangs
    (tests/learner/hold_publish.py)."""
    exe = [str(Path(sys.executable).parent / "asyncgrpo")]
    if hold_publish_from is not None:
        exe = [sys.executable, "-m", "tests.learner.hold_publish", str(hold_publish_from)]
    env = {
        **os.environ,
        "ASYNCGRPO_LEARNER_STANDBY_RETRY_S": "0.5",
        "ASYNCGRPO_LEARNER_CLAIM_WAIT_S": "1",
        **{f"ASYNCGRPO_LEARNER_{k}": v for k, v in (settings or {}).items()},
    }
    cmd = [
        *exe,
        *(["learner"] if hold_publish_from is None else []),
        "--server",
        base,
        "--run",
        str(run.id),
        "--token",
        run.token,
        "--threads",
        "1",
        "--work-dir",
        str(work),
    ]
    return subprocess.Popen(cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _wait_version(app: Any, run_id: uuid.UUID, version: int, proc: Any, log: Path) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        with transaction(app.state.sessionmaker) as session:
            run = session.get(Run, run_id)
            assert run is not None
            if run.current_version >= version:
                return
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"no version {version}:\n{log.read_text()[-3000:]}")


def test_learner_publishes_resumes_after_kill_and_finishes(live, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from lm.models import load_tokenizer

    base, app, bucket = live
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 0.0, "learning_rate": 1e-3},
        sampling={"max_new_tokens": 8},
    )
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    log = tmp_path / "learner.log"
    work = tmp_path / "work"
    batches = [_real_batch(app, run.id, worker_id, 0, tok, tmp_path)]
    first = _learner(base, run, work, log)
    try:
        _wait_version(app, run.id, 1, first, log)
        batches.append(_real_batch(app, run.id, worker_id, 1, tok, tmp_path))
        _wait_version(app, run.id, 2, first, log)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    batches.append(_real_batch(app, run.id, worker_id, 2, tok, tmp_path))
    second = _learner(base, run, work, log)
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
    # each attachment said so: the second resumed version 2 with the checkpoint of version 1
    attached = [line for line in log.read_text().splitlines() if "attached to run" in line]
    assert len(attached) == 2, attached
    assert "current version 2, resuming from checkpoint of version 1" in attached[1]
    state = json.loads(
        (bucket / f"runs/{run.id}/checkpoints/v000003/trainer_state.json").read_text()
    )
    assert state["step"] == 3 and state["version"] == 3


def test_a_batch_missing_from_the_bucket_is_rejected_not_reclaimed(live, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A claimed batch whose object is gone (404) is rejected as invalid, its prompts re-queued
    with an attempt counted (invariant 12: they end consumed or dropped with a reason). A
    re-attach for fresh URLs would hand the same missing object out again, forever."""
    from lm.models import load_tokenizer

    base, app, bucket = live
    run = make_run(app, dataset={"kind": "jsonl", "rows": ROWS}, grpo={"spot_check_fraction": 0.0})
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    batch_id = _real_batch(app, run.id, worker_id, 0, tok, tmp_path)
    with transaction(app.state.sessionmaker) as session:
        key = session.get(RolloutBatch, batch_id).bucket_key  # type: ignore[union-attr]
    (bucket / key).unlink()
    log = tmp_path / "learner.log"
    proc = _learner(base, run, tmp_path / "work", log)
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
        assert "re-attach" not in log.read_text().lower(), log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


@pytest.mark.parametrize(
    "allowed",
    [None, '["asyncgrpo_tests_no_such_module"]'],
    ids=["not-allowed-at-attach", "allowed-but-not-importable"],
)
def test_a_reward_that_cannot_be_imported_fails_the_run(live, tmp_path: Path, allowed) -> None:  # type: ignore[no-untyped-def]
    """A run whose reward function cannot be loaded would stop every learner the same way:
    the run is `failed` with the reason and an event, and the learner exits non-zero instead
    of leaving the run pending or running forever. A module its host does not allow is refused
    at attach (the learner reports what it can load; nothing is imported); an allowed module
    that does not import fails in the reward processes (`/learner/fail`)."""
    from lm.models import load_tokenizer

    base, app, _bucket = live
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        rewards=[{"name": "asyncgrpo_tests_no_such_module:reward"}],
        grpo={"spot_check_fraction": 0.0},
    )
    worker_id, _ = make_worker(app)
    _real_batch(app, run.id, worker_id, 0, load_tokenizer("smollm2-135m-instruct"), tmp_path)
    log = tmp_path / "learner.log"
    settings = {"REWARD_MODULES": allowed} if allowed else None
    proc = _learner(base, run, tmp_path / "work", log, settings)
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


def test_a_paused_run_keeps_its_learner(live, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Pausing stops the workers, not the learner (docs/architecture/run-lifecycle.md, "Run
    lifecycle"): it publishes from batches it can still claim and waits for more; a cancel then ends
    it."""
    from lm.models import load_tokenizer
    from server.runs import lifecycle

    base, app, _bucket = live
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 0.0},
        sampling={"max_new_tokens": 8},
    )
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    _real_batch(app, run.id, worker_id, 0, tok, tmp_path)
    log = tmp_path / "learner.log"
    proc = _learner(base, run, tmp_path / "work", log)
    try:
        _wait_version(app, run.id, 1, proc, log)
        with transaction(app.state.sessionmaker) as session:
            lifecycle.admin_action(session, run.id, "pause", "test")
        _real_batch(app, run.id, worker_id, 1, tok, tmp_path)
        _wait_version(app, run.id, 2, proc, log)
        time.sleep(3.0)  # several claim polls: a learner that stopped would have exited by now
        assert proc.poll() is None, log.read_text()[-3000:]
        with transaction(app.state.sessionmaker) as session:
            lifecycle.admin_action(session, run.id, "cancel", "test")
        assert proc.wait(60) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
