"""One pool learner process against the real server (docs/guides/pool-learners.md): it
registers once with a registration token, takes two runs of the small model and trains each to
`completed`, one after the other; its credentials file is mode 0600, and a restart rejoins with
it (no second registration: the registration token allows one use)."""

from __future__ import annotations

import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.db import transaction
from server.models import PoolLearner, Run, Token
from tests.conftest import mint_token
from tests.harness.batches import real_batch
from tests.harness.live_app import LiveApp, wait_log
from tests.harness.runs import plus_rows
from tests.server.learner.support import make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]


def _statuses(app: Any, run_ids: list[uuid.UUID]) -> list[str]:
    with transaction(app.state.sessionmaker) as session:
        return [session.get(Run, run_id).status for run_id in run_ids]  # type: ignore[union-attr]


def _wait_completed(app: Any, run_ids: list[uuid.UUID], proc: Any, log: Path) -> None:
    deadline = time.monotonic() + 300
    while _statuses(app, run_ids) != ["completed"] * len(run_ids):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, (_statuses(app, run_ids), log.read_text()[-3000:])
        time.sleep(0.5)


def _stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except Exception:
            proc.kill()
            proc.wait(10)


def test_a_pool_learner_trains_two_runs_one_after_the_other(
    live: LiveApp, tmp_path: Path, small_tokenizer: Any
) -> None:
    app = live.app
    # one prompt step a run: its one batch, then the final version
    runs = [
        make_run(
            app,
            dataset={"kind": "jsonl", "rows": plus_rows(2)},
            lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            grpo={"spot_check_fraction": 0.0},
            sampling={"max_new_tokens": 8},
        )
        for _ in range(2)
    ]
    worker_id, _ = make_worker(app)
    for run in runs:
        real_batch(app, run.id, worker_id, 0, small_tokenizer, tmp_path)
    registration = mint_token(app, "registration", name="pool", max_uses=1)
    creds = tmp_path / "pool-creds.json"
    args = ["--registration-token", registration, "--credentials-file", str(creds),
            "--name", "pool-a", "--gpu-type", "cpu", "--take-retry-s", "0.5"]  # fmt: skip
    log = live.pool_learner_log
    proc = live.pool_learner(args)
    try:
        _wait_completed(app, [r.id for r in runs], proc, log)
        wait_log(log, r"run \S+: done(.|\n)*run \S+: done", proc, 60)
    finally:
        _stop(proc)
    text = log.read_text()
    took = re.findall(r"took run (\S+)", text)
    done = re.findall(r"run (\S+): done", text)
    assert sorted(took) == sorted(str(r.id) for r in runs) and done == took, text[-3000:]
    # one after the other: the second was taken after the first was done
    assert text.index(f"run {took[0]}: done") < text.index(f"took run {took[1]}"), text[-3000:]
    assert creds.stat().st_mode & 0o777 == 0o600
    with transaction(app.state.sessionmaker) as session:
        learner = session.query(PoolLearner).one()
        assert (learner.name, learner.gpu_type, learner.max_runs) == ("pool-a", "cpu", 1)
    # a restart rejoins with the stored token: a second registration would be refused (one use)
    again = live.pool_learner(args)
    try:
        wait_log(log, "rejoining as pool learner(.|\\n)*nothing to take", again, 120)
        admin = {"Authorization": f"Bearer {mint_token(app, 'admin', name='t')}"}
        listed = httpx.get(f"{live.base}/api/v1/learners", headers=admin).json()
        assert [p["id"] for p in listed] == [str(learner.id)], listed
        assert again.poll() is None, log.read_text()[-3000:]
    finally:
        _stop(again)
    with transaction(app.state.sessionmaker) as session:
        uses = [t.uses for t in session.query(Token).where(Token.kind == "registration")]
    assert uses == [1]
