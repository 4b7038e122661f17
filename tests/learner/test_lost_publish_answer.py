"""The learner process whose publishes of version 2 and of the final version land but whose
answers are lost (past the client's own retries): the learner's retry of each publish, under
the same Idempotency-Key, gets the stored answer (learner/publisher.py), even the final one's,
after which the run is completed and the lease gone; the final publish's retry comes after the
heartbeat has seen that (learner/transfers.py, Retrier.call_keyed). It goes on under the same
fencing token with the work it had not published yet and exits 0: one attachment, no lease
loss, every version contiguous and every batch consumed into exactly one of them."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from server.db import transaction
from server.models import AdapterVersion, RolloutBatch, Run
from tests.harness.batches import real_batch
from tests.harness.live_app import LiveApp, live_app, wait_log, wait_version
from tests.harness.runs import plus_rows
from tests.server.learner.support import make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]
ROWS = plus_rows(6)


@pytest.fixture
def served(pg_url: str, tmp_path: Path) -> Iterator[LiveApp]:
    """A 30 s learner lease: a loaded machine never loses it, so one attachment is the rule."""
    with live_app(pg_url, tmp_path, learner_lease_ttl_s=30.0, long_poll_s=1.0) as app:
        yield app


def test_a_lost_publish_answer_keeps_the_session_and_its_work(
    served: LiveApp, tmp_path: Path, small_tokenizer: Any
) -> None:
    app = served.app
    run = make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 0.0, "learning_rate": 1e-3},
        sampling={"max_new_tokens": 8},
    )
    worker_id, _ = make_worker(app)
    tok, log = small_tokenizer, served.learner_log
    batches = [real_batch(app, run.id, worker_id, 0, tok, tmp_path)]
    command = [sys.executable, "-m", "tests.learner.lose_publish_answer", "2,4"]
    proc = served.learner(run, {"TRANSFER_RETRY_CAP_S": "1"}, command=command)
    try:
        wait_version(app, run.id, 1, proc, log)
        batches.append(real_batch(app, run.id, worker_id, 1, tok, tmp_path))
        wait_log(log, "test: the answer to the publish of version 2 was lost", proc)
        wait_version(app, run.id, 2, proc, log)
        batches.append(real_batch(app, run.id, worker_id, 2, tok, tmp_path))
        wait_log(log, "test: the heartbeat saw the lease end before the final answer", proc)
        wait_log(log, "test: the answer to the publish of version 4 was lost", proc)
        assert proc.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    for version in (2, 4):  # each answered by its retry, from the key: not reconciled
        assert f"published version {version}" in text, text[-3000:]
        assert f"version {version} had landed" not in text, text[-3000:]
    attached = re.findall(r"attached to run \S+: fencing (\d+)", text)
    assert len(attached) == 1, text[-3000:]  # no re-attach
    assert "dropping unpublished work" not in text, text[-3000:]
    with transaction(app.state.sessionmaker) as session:
        run_row = session.get(Run, run.id)
        assert run_row is not None and run_row.status == "completed"
        assert run_row.learner_fencing == int(attached[0])  # the same token throughout
        versions = list(
            session.execute(
                select(AdapterVersion.version)
                .where(AdapterVersion.run_id == run.id)
                .order_by(AdapterVersion.version)
            ).scalars()
        )
        consumed = dict(
            session.execute(
                select(RolloutBatch.id, RolloutBatch.consumed_version).where(
                    RolloutBatch.run_id == run.id
                )
            ).all()
        )
    assert versions == [1, 2, 3, 4]  # contiguous, 4 = final
    assert sorted(consumed[b] for b in batches) == [1, 2, 3]
