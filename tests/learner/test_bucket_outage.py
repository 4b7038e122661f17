"""The learner process through bucket outages (moto S3 behind a TCP proxy that is cut for 10 s,
contents kept): once while it publishes a version (the server's own bucket calls fail too) and
once while it downloads a claimed batch. It keeps running, and the versions stay contiguous with
every batch consumed into exactly one of them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from server.db import transaction
from server.models import AdapterVersion, RolloutBatch, Run
from tests.e2e.tcp_proxy import TcpProxy
from tests.harness.batches import real_batch
from tests.harness.live_app import LiveApp, wait_log, wait_version
from tests.harness.runs import plus_rows
from tests.s3_fixtures import S3Endpoint
from tests.server.learner.support import make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]
OUTAGE_S = 10.0
ROWS = plus_rows(6)


def _outage(
    proxy: TcpProxy, proc: Any, log: Path, during: Callable[[], Any] | None = None
) -> datetime:
    """Cut the bucket for OUTAGE_S (running `during` once it is cut); returns when it came
    back (UTC)."""
    proxy.cut()
    if during is not None:
        during()
    time.sleep(OUTAGE_S)
    assert proc.poll() is None, log.read_text()[-3000:]
    proxy.restore()
    return datetime.now(UTC)


def _published_at(app: Any, run_id: Any, version: int) -> datetime:
    with transaction(app.state.sessionmaker) as session:
        return session.execute(
            select(AdapterVersion.created_at).where(
                AdapterVersion.run_id == run_id, AdapterVersion.version == version
            )
        ).scalar_one()


def test_learner_keeps_publishing_through_bucket_outages(
    live_s3: LiveApp,
    proxy: TcpProxy,
    moto_endpoint: S3Endpoint,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    from lm.models import load_tokenizer

    app = live_s3.app
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
    log = live_s3.learner_log
    batches = [real_batch(app, run.id, worker_id, 0, tok, tmp_path)]
    proc = live_s3.learner(run, {"TRANSFER_RETRY_CAP_S": "2"})
    try:
        wait_version(app, run.id, 1, proc, log)
        # 1. mid-publish: cut as soon as step 2 is trained, before its files are uploaded
        batches.append(real_batch(app, run.id, worker_id, 1, tok, tmp_path))
        wait_log(log, "trained step 2 ", proc)
        restored_at = _outage(proxy, proc, log)
        wait_version(app, run.id, 2, proc, log)
        # The publish waited out the cut: the learner logged a failed transfer or publish, or the
        # client retried the server's 503 (bucket unavailable) itself until version 2 landed
        # after the bucket came back.
        text = log.read_text()
        failed = re.search(r"(upload URLs for|publish of) version 2 failed", text)
        assert failed or _published_at(app, run.id, 2) >= restored_at, text[-3000:]
        # 2. mid-download: the batch becomes claimable only once the bucket is away (its object
        # written to moto directly, behind the cut), so the learner's download must fail first
        moto = moto_endpoint.client()

        def batch_behind_the_cut() -> None:
            def put(key: str, data: bytes) -> None:
                moto.put_object(Bucket=s3_bucket, Key=key, Body=data)

            batches.append(real_batch(app, run.id, worker_id, 2, tok, tmp_path, put))

        _outage(proxy, proc, log, during=batch_behind_the_cut)
        assert proc.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert re.search(r"download of \S+ failed", text), text[-3000:]
    with transaction(app.state.sessionmaker) as session:
        run_row = session.get(Run, run.id)
        assert run_row is not None and run_row.status == "completed"
        versions = session.execute(
            select(AdapterVersion.version)
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
    assert [v.version for v in versions] == [1, 2, 3, 4]  # contiguous, 4 = final
    assert sorted(consumed[b] for b in batches) == [1, 2, 3]
