"""SIGTERM while generating (a spot preemption notice): the real `asyncgrpo worker` process,
holding five leases at once, releases all five (prompts back in the queue, no attempt counted)
and exits within 5 s."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from lm.chat import tokenizer_fingerprint
from tests.harness.runs import run_config
from tests.harness.stack import LiveServer, ManagedProcess, worker_process
from tests.worker.harness import Stack, worker_run

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.postgres]


def generating(worker: ManagedProcess) -> int:
    """How many leases the worker has started generating for (its log's line for each)."""
    return worker.log_text().count(" generating with run=")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_sigterm_with_five_held_leases_releases_all_and_exits_fast(
    server: LiveServer, small_tokenizer: Any, tmp_path: Path, signum: int
) -> None:
    config = run_config(
        worker_run(5), prompts_per_lease=1, sampling={"temperature": 2.0, "max_new_tokens": 1000}
    )
    stack = Stack(server, tokenizer_fingerprint(small_tokenizer), config)
    env = {
        "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "0.5",
        "ASYNCGRPO_WORKER_MAX_INFLIGHT_SEQUENCES": "20",  # five leases of 1 prompt x G 4
    }
    worker = worker_process(
        "w",
        tmp_path / "w",
        (server.url, stack.registration_token),
        ["--backend", "transformers", "--threads", "1"],
        env,
    ).start()
    try:
        deadline = time.monotonic() + 200
        while sum(r.state == "active" for r in stack.lease_rows()) < 5 or generating(worker) < 5:
            assert worker.alive(), worker.log_text()[-3000:]
            assert time.monotonic() < deadline, "the worker never generated for five leases"
            time.sleep(0.3)
        sent = time.monotonic()
        worker.send_signal(signum)
        worker.wait(timeout_s=15)
        elapsed = time.monotonic() - sent
    finally:
        worker.stop()
        stack.close()
    assert elapsed < 5.0, (elapsed, worker.log_text()[-3000:])
    assert worker.returncode() == 0
    leases = stack.lease_rows()
    assert [lease.state for lease in leases] == ["released"] * 5
    assert [lease.end_reason for lease in leases] == ["shutdown"] * 5
    assert stack.prompt_states() == {"queued": 5}
    attempts = server.sql(
        "SELECT attempts FROM prompt_rows WHERE run_id = :r", r=uuid.UUID(stack.run_id)
    )
    assert [a.attempts for a in attempts] == [0] * 5  # a voluntary release counts no attempt
    assert stack.batch_rows() == []
