"""The data-parallel learner (two ranks under torchrun, gloo) against the real server: one
rank killed mid-step leaves nothing published for that step, the learner lease lapses, and a
learner restarted with one rank resumes the last version and finishes with the ledger
balanced; rank 0's heartbeat stops while a step's collective is past the watchdog's bound."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from learner.distributed import Watchdog
from learner.heartbeat import Heartbeat
from protocol.client import AsyncGrpoClient
from server.db import transaction
from server.learner.ledger import ledger_model
from server.models import AdapterVersion, RolloutBatch, Run
from tests.harness.batches import real_batch
from tests.harness.live_app import LiveApp, live_app, wait_log, wait_version
from tests.harness.runs import plus_rows
from tests.server.learner.support import make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]
TTL_S = 10.0
ROWS = plus_rows(6)
BIN = Path(sys.executable).parent
# torchrun runs two ranks of its command, each with the learner's arguments
TWO_RANKS = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
TWO_LEARNER_RANKS = [*TWO_RANKS, "--no-python", "--", str(BIN / "asyncgrpo"), "learner"]
COLLECTIVE_5_S = {"COLLECTIVE_TIMEOUT_S": "5"}


@pytest.fixture
def live10(pg_url: str, tmp_path: Path) -> Iterator[LiveApp]:
    """The server with a 10 s learner lease (the ranks' collective timeout is 5 s)."""
    with live_app(pg_url, tmp_path, learner_lease_ttl_s=TTL_S, long_poll_s=1.0) as served:
        yield served


def _run(app: Any) -> Any:
    return make_run(
        app,
        dataset={"kind": "jsonl", "rows": ROWS},
        max_staleness=5,
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        grpo={"spot_check_fraction": 0.0, "learning_rate": 1e-3},
        sampling={"max_new_tokens": 8},
    )


def _torchrun(live: LiveApp, run: Any, hold_step: int) -> Any:
    """Two learner ranks; rank 1 hangs in step `hold_step` (tests/learner/hold_step.py)."""
    # "--": torchrun would take --run for its own --run-path
    command = [*TWO_RANKS, "-m", "--", "tests.learner.hold_step", str(hold_step)]
    return live.learner(run, COLLECTIVE_5_S, command=command)


def _lease_lapsed(app: Any, run_id: uuid.UUID) -> bool:
    with transaction(app.state.sessionmaker) as session:
        row = session.get(Run, run_id)
        assert row is not None
        expires = row.learner_expires_at
    return expires is None or expires < datetime.now(UTC)


def _wait_lapsed(app: Any, run_id: uuid.UUID, within_s: float) -> float:
    started = time.monotonic()
    while not _lease_lapsed(app, run_id):
        assert time.monotonic() - started < within_s, "the learner lease is still held"
        time.sleep(0.5)
    return time.monotonic() - started


def _outcome(app: Any, run_id: uuid.UUID) -> tuple[list[Any], dict[Any, Any], Any, str]:
    """After a run: its versions (version, final) in order, each batch's consumed version, the
    prompt ledger and the run's status."""
    with transaction(app.state.sessionmaker) as session:
        versions = session.execute(
            select(AdapterVersion.version, AdapterVersion.final)
            .where(AdapterVersion.run_id == run_id)
            .order_by(AdapterVersion.version)
        ).all()
        consumed = dict(
            session.execute(
                select(RolloutBatch.id, RolloutBatch.consumed_version).where(
                    RolloutBatch.run_id == run_id
                )
            ).all()
        )
        ledger = ledger_model(session, run_id)
        status = session.get(Run, run_id).status  # type: ignore[union-attr]
    return list(versions), consumed, ledger, str(status)


def test_a_rank_killed_mid_step_publishes_nothing_and_one_rank_resumes(
    live10: LiveApp, tmp_path: Path
) -> None:
    from lm.models import load_tokenizer

    app = live10.app
    run = _run(app)
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    log = live10.learner_log
    batches = [real_batch(app, run.id, worker_id, 0, tok, tmp_path)]
    group = _torchrun(live10, run, hold_step=2)
    try:
        wait_version(app, run.id, 1, group, log)  # step 1 over two ranks, published
        text = log.read_text()
        assert "rank 0 of 2 on cpu" in text and "rank 1 of 2 on cpu" in text
        batches.append(real_batch(app, run.id, worker_id, 1, tok, tmp_path))
        wait_log(log, r"test hold: rank 1 \(pid \d+\) in step 2", group)
        pid = int(re.findall(r"test hold: rank 1 \(pid (\d+)\)", log.read_text())[-1])
        os.kill(pid, signal.SIGKILL)
        assert group.wait(120) != 0, log.read_text()[-3000:]  # the whole group exits
    finally:
        if group.poll() is None:
            group.send_signal(signal.SIGKILL)
            group.wait(10)
    with transaction(app.state.sessionmaker) as session:
        versions = session.execute(
            select(AdapterVersion.version).where(AdapterVersion.run_id == run.id)
        ).scalars()
        assert list(versions) == [1]  # step 2 was never published
    _wait_lapsed(app, run.id, TTL_S + 5)

    batches.append(real_batch(app, run.id, worker_id, 1, tok, tmp_path))
    single = live10.learner(run)  # one rank, no torchrun
    try:
        assert single.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if single.poll() is None:
            single.send_signal(signal.SIGKILL)
    assert "resuming version 1 (step 1) with the optimizer state of version 1" in log.read_text()
    finals, consumed, ledger, status = _outcome(app, run.id)
    assert [v.version for v in finals] == [1, 2, 3, 4] and finals[-1].final
    assert sorted(consumed[b] for b in batches) == [1, 2, 3]  # each in exactly one version
    assert ledger.balanced and ledger.by_state == {"consumed": len(ROWS)}, ledger
    assert status == "completed"


def test_the_step_watchdog_withholds_the_heartbeat_until_the_lease_lapses(
    live10: LiveApp,
) -> None:
    from lm.chat import tokenizer_fingerprint
    from lm.models import load_tokenizer

    app = live10.app
    run = _run(app)
    client = AsyncGrpoClient(live10.base, run.token)
    fingerprint = str(tokenizer_fingerprint(load_tokenizer("smollm2-135m-instruct")))
    attach = client.learner_attach(
        str(run.id), fingerprint, name="dp-test", reward_names=["numeric_match"]
    )
    watchdog = Watchdog(bound_s=1.0)
    beat = Heartbeat(client, str(run.id), attach.fencing, 0.5, gate=watchdog.overdue)
    beat.start()
    try:
        time.sleep(TTL_S + 2)  # beating: the lease holds past its TTL
        assert not _lease_lapsed(app, run.id)
        with watchdog.watch("the gradient all-reduce"):  # a collective that never returns
            time.sleep(1.5)
            assert watchdog.overdue() is not None
            waited = _wait_lapsed(app, run.id, TTL_S + 5)
        assert waited > 1.0  # it lapsed because the beats stopped, not at once
        assert watchdog.overdue() is None  # the collective returned
    finally:
        beat.stopped.set()
        client.close()


def test_a_collective_timeout_not_below_the_lease_ttl_is_refused(live10: LiveApp) -> None:
    app = live10.app
    run = _run(app)
    log = live10.learner_log
    timeout = ["--collective-timeout-s", str(TTL_S)]
    code = live10.learner(run, command=TWO_LEARNER_RANKS, args=timeout).wait(120)
    text = log.read_text()
    assert code == 1, text[-3000:]
    assert "collective_timeout_s 10 must be shorter than the run's learner lease TTL" in text
    assert "rank 0 stopped (exit code 1)" in text  # rank 1 was told, not left waiting


def test_a_one_rank_run_resumes_on_two_fsdp2_ranks_and_completes(
    live10: LiveApp, tmp_path: Path
) -> None:
    """Checkpoints are unsharded: version 1 from one process, the rest from two ranks with
    FSDP2-sharded base weights (the resumed adapter loaded, then sharded)."""
    from lm.models import load_tokenizer

    app = live10.app
    run = _run(app)
    worker_id, _ = make_worker(app)
    tok = load_tokenizer("smollm2-135m-instruct")
    log = live10.learner_log
    batches = [real_batch(app, run.id, worker_id, 0, tok, tmp_path) for _ in range(3)]
    single = live10.learner(run, {"MAX_VERSIONS": "1"})
    assert single.wait(300) == 0, log.read_text()[-3000:]
    _wait_lapsed(app, run.id, TTL_S + 5)
    fsdp = live10.learner(run, COLLECTIVE_5_S, command=TWO_LEARNER_RANKS, args=["--fsdp"])
    done = fsdp.wait(300)
    text = log.read_text()
    assert done == 0, text[-3000:]
    assert "rank 1 of 2 on cpu (FSDP2)" in text
    assert "resuming version 1 (step 1) with the optimizer state of version 1" in text
    assert "rank 1 joined the session at step 1" in text  # rank 0's state reached rank 1
    versions, consumed, ledger, _ = _outcome(app, run.id)
    assert [v.version for v in versions] == [1, 2, 3, 4] and versions[-1].final
    assert sorted(consumed[b] for b in batches) == [1, 2, 3]
    assert ledger.balanced and ledger.by_state == {"consumed": len(ROWS)}, ledger
