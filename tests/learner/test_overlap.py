"""The overlapped learner (intake and publish on their own threads, docs/architecture/learner.md,
"The learner") killed at its new moments: kill -9 while a background publish is uploading, while the
next step's intake is downloading, and between two checkpoints (checkpoint_every_versions); and a
lost lease that stops the background work. Each restart resumes, the versions stay contiguous, every
batch is consumed into exactly one version and the ledger balances."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text, update

from server.db import transaction
from server.learner.ledger import ledger_model
from server.models import AdapterVersion, RolloutBatch, Run
from tests.e2e.tcp_proxy import TcpProxy
from tests.harness.batches import real_batch
from tests.harness.live_app import LiveApp, wait_log, wait_version
from tests.harness.runs import plus_rows
from tests.s3_fixtures import S3Endpoint
from tests.server.learner.support import make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]
ROWS = plus_rows(8, plus=2)
SIX_ROWS = plus_rows(6)
SETTINGS = {"TRANSFER_RETRY_CAP_S": "1", "CHECKPOINT_EVERY_VERSIONS": "100"}


def _run(app: Any) -> Any:
    return make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 0.0, "learning_rate": 1e-3},
        sampling={"max_new_tokens": 8},
    )


def _kill(proc: Any) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def _behind_the_cut(moto: Any, bucket: str) -> Any:
    def put(key: str, data: bytes) -> None:
        moto.put_object(Bucket=bucket, Key=key, Body=data)

    return put


def _versions(app: Any, run_id: uuid.UUID) -> list[Any]:
    with transaction(app.state.sessionmaker) as session:
        return list(
            session.execute(
                select(
                    AdapterVersion.version, AdapterVersion.final, AdapterVersion.checkpoint_files
                )
                .where(AdapterVersion.run_id == run_id)
                .order_by(AdapterVersion.version)
            ).all()
        )


def _consumed(app: Any, run_id: uuid.UUID) -> dict[uuid.UUID, int | None]:
    with transaction(app.state.sessionmaker) as session:
        rows = session.execute(
            select(RolloutBatch.id, RolloutBatch.consumed_version).where(
                RolloutBatch.run_id == run_id
            )
        ).all()
    return {r.id: r.consumed_version for r in rows}


def test_kill_during_background_publish_intake_and_between_checkpoints(
    live_s3: LiveApp,
    proxy: TcpProxy,
    moto_endpoint: S3Endpoint,
    s3_bucket: str,
    tmp_path: Path,
    small_tokenizer: Any,
) -> None:
    app = live_s3.app
    run = _run(app)
    worker_id, _ = make_worker(app)
    tok = small_tokenizer
    log = live_s3.learner_log
    batches = [real_batch(app, run.id, worker_id, 0, tok, tmp_path)]

    # 1. v1 (the first version carries a checkpoint), v2 (none: every 100th); kill -9 while
    #    the background publish of v3 is uploading
    first = live_s3.learner(run, SETTINGS, hold_publish_from=3)
    try:
        wait_version(app, run.id, 1, first, log)
        batches.append(real_batch(app, run.id, worker_id, 1, tok, tmp_path))
        wait_version(app, run.id, 2, first, log)
        batches.append(real_batch(app, run.id, worker_id, 2, tok, tmp_path))
        wait_log(log, "test hold: publish of version 3 uploading", first)
    finally:
        _kill(first)
    assert [v.version for v in _versions(app, run.id)] == [1, 2]

    # 2. the restart resumes v2's weights with v1's optimizer state (the latest checkpoint at
    #    or below v2), publishes v3; kill -9 while its intake downloads the next batch
    second = live_s3.learner(run, SETTINGS)
    try:
        wait_log(
            log, r"resuming version 2 \(step 2\) with the optimizer state of version 1", second
        )
        wait_version(app, run.id, 3, second, log)
        proxy.cut()
        put = _behind_the_cut(moto_endpoint.client(), s3_bucket)
        batches.append(real_batch(app, run.id, worker_id, 3, tok, tmp_path, put))
        wait_log(log, r"download of \S+\.parquet failed", second)
    finally:
        _kill(second)
        proxy.restore()
    assert [v.version for v in _versions(app, run.id)] == [1, 2, 3]

    # 3. the last restart trains the batch its predecessor was downloading and finishes
    third = live_s3.learner(run, SETTINGS)
    try:
        assert third.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if third.poll() is None:
            _kill(third)
    assert "resuming version 3 (step 3) with the optimizer state of version 3" in log.read_text()
    versions = _versions(app, run.id)
    assert [v.version for v in versions] == [1, 2, 3, 4, 5]  # contiguous, 5 = final
    assert [v.final for v in versions] == [False, False, False, False, True]
    # v1: the first; v3, v4: the first of their attachments; v5: the final
    assert [bool(v.checkpoint_files) for v in versions] == [True, False, True, True, True]
    consumed = _consumed(app, run.id)
    assert sorted(consumed[b] for b in batches) == [1, 2, 3, 4]  # each in exactly one version
    with transaction(app.state.sessionmaker) as session:
        ledger = ledger_model(session, run.id)
    assert ledger.balanced and ledger.by_state == {"consumed": len(ROWS)}, ledger


def _steal_lease(app: Any, run_id: uuid.UUID, hold_s: float) -> None:
    """What another learner's attach does to the run row: a new fencing token, live for
    `hold_s` (then it lapses and the first learner can attach again)."""
    with transaction(app.state.sessionmaker) as session:
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(
                fencing_seq=Run.fencing_seq + 1,
                learner_fencing=Run.fencing_seq + 1,
                learner_expires_at=text(f"now() + interval '{hold_s} seconds'"),
            )
        )


def test_a_lost_lease_stops_the_background_publish(
    live_s3: LiveApp, tmp_path: Path, small_tokenizer: Any
) -> None:
    app = live_s3.app
    run = _run(app)
    worker_id, _ = make_worker(app)
    tok = small_tokenizer
    log = live_s3.learner_log
    batches = [real_batch(app, run.id, worker_id, 0, tok, tmp_path)]
    proc = live_s3.learner(run, SETTINGS, hold_publish_from=2)
    try:
        wait_version(app, run.id, 1, proc, log)
        batches.append(real_batch(app, run.id, worker_id, 1, tok, tmp_path))
        wait_log(log, "test hold: publish of version 2 uploading", proc)
        _steal_lease(app, run.id, hold_s=8.0)
        # the heartbeat sees the 409 within a third of the TTL; the held upload's next lease
        # check raises, so the publish thread ends without publishing, and the session closes
        wait_log(log, r"test hold: publish of version 2 stopped \(LeaseLost", proc, 30)
        wait_log(log, "learner lease lost", proc, 30)
        assert [v.version for v in _versions(app, run.id)] == [1]
        batches += [real_batch(app, run.id, worker_id, 1, tok, tmp_path) for _ in range(2)]
        assert proc.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            _kill(proc)
    versions = [v.version for v in _versions(app, run.id)]
    assert versions == list(range(1, len(versions) + 1))
    consumed = _consumed(app, run.id)
    assert sorted(consumed[b] or 0 for b in batches) == [1, 2, 3, 4]
    with transaction(app.state.sessionmaker) as session:
        ledger = ledger_model(session, run.id)
    assert ledger.balanced, ledger


def _scorer(model: Any, pad_id: int) -> Any:
    from lm.logprobs import completion_logprobs

    def score(prompt: list[int], completion: list[int]) -> list[float]:
        return completion_logprobs(model, [prompt], [completion], 1.0, pad_id=pad_id)[0]

    return score


def _version_model(app: Any, bucket: Path, run_id: uuid.UUID, version: int, tmp: Path) -> Any:
    """The base model with a published version's adapter, read from the bucket folder."""
    from lm.adapter_io import load_adapter_version
    from lm.models import load_model

    with transaction(app.state.sessionmaker) as session:
        files = session.execute(
            select(AdapterVersion.files).where(
                AdapterVersion.run_id == run_id, AdapterVersion.version == version
            )
        ).scalar_one()
    folder = tmp / f"adapter-v{version}"
    folder.mkdir()
    for name, meta in files.items():
        (folder / name).write_bytes((bucket / meta["key"]).read_bytes())
    return load_adapter_version(load_model("smollm2-135m-instruct"), folder)


def test_spot_checks_score_against_the_batchs_own_version(
    live: LiveApp, tmp_path: Path, small_model: Any, small_tokenizer: Any
) -> None:
    """Every batch spot-checked (fraction 1), each generated with the real log-probs of its
    version: the one trained into v3 was generated with v1 and is checked after the learner has
    trained past v1, so only v1's frozen weights give it a mismatch of ~0."""
    import pyarrow.parquet as pq
    import torch

    from learner.spotcheck import compare_logprobs

    torch.set_num_threads(1)
    app, bucket = live.app, live.bucket
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": SIX_ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 1.0, "learning_rate": 5e-2},
        sampling={"max_new_tokens": 8, "temperature": 1.0},
    )
    worker_id, _ = make_worker(app)
    tok = small_tokenizer
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    log = live.learner_log
    v0 = _scorer(small_model, pad)  # read only
    batches = [real_batch(app, run.id, worker_id, 0, tok, tmp_path, score=v0)]
    proc = live.learner(run)
    try:
        wait_version(app, run.id, 1, proc, log)
        v1 = _scorer(_version_model(app, bucket, run.id, 1, tmp_path), pad)
        batches += [real_batch(app, run.id, worker_id, 1, tok, tmp_path, score=v1) for _ in (0, 1)]
        assert proc.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            _kill(proc)
    consumed = _consumed(app, run.id)
    assert sorted(consumed[b] or 0 for b in batches) == [1, 2, 3]  # none rejected
    with transaction(app.state.sessionmaker) as session:
        checks, mismatch = session.execute(
            text("SELECT spot_checks, spot_check_mismatch FROM workers WHERE id = :id"),
            {"id": worker_id},
        ).one()
        last_key = session.execute(
            select(RolloutBatch.bucket_key).where(RolloutBatch.id == batches[-1])
        ).scalar_one()
    assert checks == 3 and mismatch < 1e-3, (checks, mismatch)
    # the control: the weights the learner held when it checked that batch (v2's, trained
    # past v1) are far from the ones that generated it, so the check above used v1's
    last = pq.read_table(bucket / last_key).to_pydict()
    v2 = _scorer(_version_model(app, bucket, run.id, 2, tmp_path), pad)
    pairs = zip(last["prompt_token_ids"], last["completion_token_ids"], strict=True)
    recomputed = [v2(p, c) for p, c in pairs]
    assert compare_logprobs(last["behaviour_logprobs"], recomputed).mean_abs_diff > 1e-2
