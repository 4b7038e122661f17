"""The worker against a real control plane (uvicorn subprocess, Postgres, local bucket) with the
real small model on CPU: register, lease, upload, accept; a new adapter version is picked up;
the server goes away for 10 s and the worker recovers; a lease that expired while generating is
never completed; SIGTERM mid-lease releases the lease (in test_signals.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lm.chat import encode_prompt, tokenizer_fingerprint
from protocol.batches import BatchExpectations, read_batch
from tests.harness.runs import run_config
from tests.harness.stack import LiveServer
from tests.worker.harness import (
    RUNNING,
    SYSTEM_PROMPT,
    LoopThread,
    Stack,
    worker_run,
    worker_settings,
)
from worker.loop import Outcome

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.postgres]


@pytest.mark.timeout(600)
def test_register_lease_upload_accept_and_pick_up_new_version(
    make_stack: Callable[..., Stack],
    tx_backend: Any,
    adapter_dirs: dict[int, Path],
    small_tokenizer: Any,
    tmp_path: Path,
) -> None:
    stack = make_stack(6)
    # One lease at a time (2 prompts x G 4): the publish lands between leases.
    settings = worker_settings(stack, tmp_path, max_leases=3, max_inflight_sequences=8)
    worker = LoopThread(settings, tx_backend).start()
    worker.wait_for(lambda: len(worker.loop.history) >= 1, 300, "the first lease")
    stack.publish(1, adapter_dirs[1])  # a new version mid-run
    worker.join(400)

    history = worker.loop.history
    assert [r.outcome for r in history] == [Outcome.accepted] * 3
    assert history[0].adapter_version == 0
    assert history[-1].adapter_version == 1  # picked up without a restart
    assert worker.loop.adapters.keys() == [(stack.run_id, 1)]

    batches = {row.lease_id: row for row in stack.batch_rows()}
    assert len(batches) == 3 and all(b.state == "accepted" for b in batches.values())
    assert stack.prompt_states() == {"accepted": 6}
    # The uploaded files pass the learner's validating reader for their leases, with the
    # learner's own tokenization of the prompts, stamped with the version they used.
    fingerprint = tokenizer_fingerprint(small_tokenizer)
    for record in history:
        row = batches[record.lease_id]
        prompts = stack.batch_prompts(row.id)
        expect = BatchExpectations(
            run_id=stack.run_id,
            lease_id=str(record.lease_id),
            fencing=row.fencing,
            worker_id=str(worker.loop.worker_id),
            adapter_version=record.adapter_version,
            adapter_sha256=stack.adapter_sha256(1) if record.adapter_version else None,
            tokenizer_fingerprint=fingerprint,
            prompt_row_ids=[p.id for p in prompts],
            group_size=4,
            vocab_size=len(small_tokenizer),
            max_new_tokens=16,
            sha256=row.sha256,
            prompt_token_ids={
                p.id: encode_prompt(small_tokenizer, p.prompt, SYSTEM_PROMPT) for p in prompts
            },
        )
        data = read_batch(tmp_path / "bucket" / row.bucket_key, expect)
        assert data.metadata.adapter_version == record.adapter_version == row.adapter_version
        assert data.n_samples == row.n_samples == 2 * 4

    # Restart: the token file is reused (no second registration, same worker id).
    again = LoopThread(
        worker_settings(stack, tmp_path, registration_token=None, max_leases=1), tx_backend
    )
    again.loop._register()
    assert again.loop.worker_id == worker.loop.worker_id


@pytest.mark.timeout(600)
def test_server_down_for_10s_then_worker_recovers(
    make_stack: Callable[..., Stack], tx_backend: Any, tmp_path: Path
) -> None:
    # A TTL well above the outage (and the restart time): leases in flight survive it.
    stack = make_stack(6, lease_ttl_s=120.0)
    worker = LoopThread(worker_settings(stack, tmp_path, max_leases=3), tx_backend).start()
    worker.wait_for(lambda: len(worker.loop.history) >= 1, 300, "the first lease")
    stack.server.stop()
    time.sleep(10)
    assert worker.thread.is_alive() and worker.error is None  # retrying, not crashed
    stack.server.start()
    worker.join(400)
    assert [r.outcome for r in worker.loop.history] == [Outcome.accepted] * 3
    assert stack.prompt_states() == {"accepted": 6}


@pytest.mark.timeout(600)
def test_lease_expired_while_generating_is_not_completed(
    make_stack: Callable[..., Stack], tx_backend: Any, tmp_path: Path
) -> None:
    # Long completions (T = 2 almost never samples EOS) so that the lease expires while the
    # worker is still generating.
    stack = make_stack(2, sampling={"temperature": 2.0, "max_new_tokens": 400})
    worker = LoopThread(worker_settings(stack, tmp_path, max_leases=1), tx_backend).start()
    worker.wait_for(lambda: any(r.state == "active" for r in stack.lease_rows()), 120, "a lease")
    # Database time decides: the lease's time is up now; the server's sweep expires it.
    stack.server.sql("UPDATE leases SET expires_at = now() - interval '1 second'")
    worker.join(300)

    (record,) = worker.loop.history
    assert record.outcome == Outcome.lost
    # The worker is gone at once; the server's sweep marks the lease within its interval.
    worker.wait_for(lambda: stack.lease_rows()[0].state != "active", 30, "the sweep")
    (lease,) = stack.lease_rows()
    assert lease.state == "expired"
    assert stack.batch_rows() == []  # never completed (nor uploaded)
    assert stack.prompt_states() == {"queued": 2}


@pytest.mark.timeout(300)
def test_lease_with_another_tokenizer_fingerprint_is_released(
    server: LiveServer, tx_backend: Any, tmp_path: Path
) -> None:
    # The learner attached with a tokenizer this worker does not have.
    stack = Stack(server, "f" * 64, run_config(worker_run(2)))
    try:
        worker = LoopThread(worker_settings(stack, tmp_path, max_leases=1), tx_backend).start()
        worker.join(120)
        (record,) = worker.loop.history
        assert record.outcome == Outcome.released
        assert record.reason == "tokenizer fingerprint mismatch"
        (lease,) = stack.lease_rows()
        assert lease.state == "released"
        assert stack.prompt_states() == {"queued": 2} and stack.batch_rows() == []
    finally:
        stack.close()


@pytest.mark.timeout(600)
def test_heartbeat_abort_stops_generation_and_drops_the_work(
    make_stack: Callable[..., Stack],
    tx_backend: Any,
    adapter_dirs: dict[int, Path],
    tmp_path: Path,
) -> None:
    # max_staleness 0: once v1 is published, a lease on v0 can no longer be admissible.
    stack = make_stack(2, max_staleness=0, sampling={"temperature": 2.0, "max_new_tokens": 400})
    worker = LoopThread(worker_settings(stack, tmp_path, max_leases=1), tx_backend).start()
    worker.wait_for(lambda: any(r.state == "active" for r in stack.lease_rows()), 120, "a lease")
    stack.publish(1, adapter_dirs[1])
    published = time.monotonic()
    worker.join(120)
    assert time.monotonic() - published < 30  # far less than 400 tokens of generation
    (record,) = worker.loop.history
    assert record.outcome == Outcome.lost and record.reason == "aborted (stale)"
    (lease,) = stack.lease_rows()
    assert lease.state == "aborted"
    assert stack.batch_rows() == []
    assert stack.prompt_states() == {"queued": 2}


POISON = "POISON: this prompt kills the engine"


def _poison_the_engine(backend: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The real backend, whose engine runs out of memory on any batch holding the poison prompt
    (the fault is injected where the engine raises it; what follows — EngineFault, the
    release, the restart — is the real code). Returns the list the restarts are recorded in."""
    import torch

    generate_chunk, restart = backend._generate_chunk, backend.restart
    restarts: list[str] = []

    def chunk(module: Any, jobs: Any, rows: Any, sampling: Any, cancel: Any) -> Any:
        if any(POISON in backend.tokenizer.decode(row) for row in rows):
            raise torch.OutOfMemoryError("injected: CUDA out of memory")
        return generate_chunk(module, jobs, rows, sampling, cancel)

    def restarted() -> None:
        restarts.append("restart")
        restart()

    monkeypatch.setattr(backend, "_generate_chunk", chunk)
    monkeypatch.setattr(backend, "restart", restarted)
    return restarts


def _poisoned_run(n_healthy: int, **overrides: Any) -> dict[str, Any]:
    rows = [{"prompt": POISON, "answer": "0"}] + [
        {"prompt": f"What is {i} + 1? Answer with just the number.", "answer": str(i + 1)}
        for i in range(n_healthy)
    ]
    return {
        "dataset": {"kind": "jsonl", "rows": rows},
        "prompts_per_lease": 1,
        "sampling": {"temperature": 1.0, "max_new_tokens": 4},
        **overrides,
    }


@pytest.mark.timeout(600)
def test_a_prompt_that_kills_the_engine_is_dropped_and_the_worker_goes_on(
    make_stack: Callable[..., Stack],
    tx_backend: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    restarts = _poison_the_engine(tx_backend, monkeypatch)
    stack = make_stack(0, **_poisoned_run(3, max_attempts=2))
    # One lease at a time (tests/worker/test_concurrency.py kills an engine under several).
    settings = worker_settings(stack, tmp_path, max_leases=5, max_inflight_sequences=4)
    worker = LoopThread(settings, tx_backend).start()
    worker.join(300)
    history = worker.loop.history
    faults = [r for r in history if r.engine_fault is not None]
    assert [r.outcome for r in faults] == [Outcome.released] * 2
    assert all(r.reason is not None and "out of memory" in r.reason for r in faults)
    assert [r.outcome for r in history if r.engine_fault is None] == [Outcome.accepted] * 3
    assert restarts == ["restart", "restart"]  # the engine came back after each death
    released = [lease for lease in stack.lease_rows() if lease.state == "released"]
    assert [lease.end_reason for lease in released] == ["engine_fault"] * 2
    # Each death counted an attempt: the poison prompt is dropped with the reason, its epoch
    # closes, and the healthy prompts were all generated and accepted.
    dropped = stack.server.sql(
        "SELECT drop_reason, attempts FROM prompt_rows WHERE run_id = :r AND state = 'dropped'",
        r=uuid.UUID(stack.run_id),
    )
    assert [tuple(row) for row in dropped] == [("engine_fault_exhausted", 2)]
    assert stack.prompt_states() == {"dropped": 1, "accepted": 3}


@pytest.mark.timeout(600)
def test_an_engine_that_keeps_dying_stops_the_worker(
    make_stack: Callable[..., Stack],
    tx_backend: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker.loop import EngineFailing

    _poison_the_engine(tx_backend, monkeypatch)
    stack = make_stack(0, **_poisoned_run(1, max_attempts=5))
    settings = worker_settings(
        stack, tmp_path, engine_fault_limit=2, engine_fault_window_s=600, max_inflight_sequences=4
    )
    worker = LoopThread(settings, tx_backend).start()
    worker.thread.join(300)
    assert not worker.thread.is_alive()
    assert isinstance(worker.error, EngineFailing)
    assert "died 2 times within 600 s" in str(worker.error)
    history = worker.loop.history
    faults = [r for r in history if r.engine_fault is not None]
    assert [r.outcome for r in faults] == [Outcome.released] * 2
    # While the engine restarted after the first death, the healthy prompt's lease may have
    # been served (a lease leaves the engine's room when its generation ends), or given back
    # when the worker stopped.
    others = [(r.outcome, r.reason) for r in history if r.engine_fault is None]
    assert all(o in {(Outcome.accepted, None), (Outcome.released, "shutdown")} for o in others)
    RUNNING.remove(worker)
    rows = stack.server.sql(
        "SELECT d.prompt, p.state, p.attempts FROM prompt_rows p "
        "JOIN dataset_rows d ON d.id = p.dataset_row_id WHERE p.run_id = :r",
        r=uuid.UUID(stack.run_id),
    )
    states = {POISON in str(row.prompt): (row.state, row.attempts) for row in rows}
    assert states[True] == ("queued", 2)  # two deaths, two attempts; the worker stopped
    assert states[False] in {("queued", 0), ("accepted", 0)}
