"""Many leases in flight on one engine (transformers, the real small model, a real control plane):
a worker holds leases of two runs at once; one is aborted mid-generation and only its work stops;
one is fenced (its heartbeat answers 409, code fencing_lost) and its batch is dropped; the others
are accepted. A version published while the worker is busy is loaded before its first lease
arrives. An engine death under several leases releases them all (reason engine_fault), restarts
the engine once, and the worker completes them later."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.worker.harness import LoopThread, Stack, worker_settings
from worker.backends.base import EngineFault
from worker.loop import Outcome

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.postgres]

# T = 2 on the small model almost never samples EOS: every lease generates its full length.
LONG = {"temperature": 2.0, "max_new_tokens": 120}


def held_runs(worker: LoopThread) -> list[str]:
    return [str(h.lease.run_id) for h in worker.loop.held.snapshot()]


@pytest.mark.timeout(600)
def test_leases_of_two_runs_at_once_abort_and_fence_touch_only_their_own(
    make_stack: Callable[..., Stack], tx_backend: Any, tmp_path: Path
) -> None:
    alone = make_stack(1, prompts_per_lease=1, group_size=2, sampling=LONG)
    # a TTL far past the test: the fenced lease's row stays leased to the end (60 s ran out on
    # a loaded machine, and the row was requeued)
    shared = make_stack(3, prompts_per_lease=1, group_size=2, sampling=LONG, lease_ttl_s=900.0)
    settings = worker_settings(alone, tmp_path, max_leases=4, max_inflight_sequences=64)
    worker = LoopThread(settings, tx_backend).start()
    worker.wait_for(lambda: len(held_runs(worker)) == 4, 120, "four leases held at once")
    assert sorted(set(held_runs(worker))) == sorted({alone.run_id, shared.run_id})

    alone.admin.pause_run(alone.run_id)  # its one lease answers abort at the next heartbeat
    fenced = shared.lease_rows()[0].id
    shared.server.sql("UPDATE leases SET fencing = fencing + 1000 WHERE id = :l", l=fenced)
    worker.join(300)

    records = {r.lease_id: r for r in worker.loop.history}
    (aborted,) = [r for r in records.values() if str(r.run_id) == alone.run_id]
    assert aborted.outcome == Outcome.lost and aborted.reason == "aborted (run_paused)"
    assert records[fenced].outcome == Outcome.lost
    assert records[fenced].reason == "lost (fencing_lost)"
    others = [r for r in records.values() if r.lease_id != fenced and r is not aborted]
    assert [r.outcome for r in others] == [Outcome.accepted] * 2
    assert all(r.n_samples == 2 for r in others)
    # Neither was cut short by the abort or the fence: every completion ran to its length limit
    # or ended at the model's EOS (T = 2 makes EOS rare, not impossible).
    bucket = shared.server.bucket
    for row in shared.batch_rows():
        table = pq.read_table(
            bucket / row.bucket_key, columns=["completion_token_ids", "finish_reason"]
        )
        for ids, reason in zip(*table.to_pydict().values(), strict=True):
            full = len(ids) == LONG["max_new_tokens"]
            assert reason == "stop" or (reason == "length" and full), (reason, len(ids))
    # Only the two completed leases left batches; the aborted and fenced ones none.
    assert {b.lease_id for b in shared.batch_rows()} == {r.lease_id for r in others}
    assert alone.batch_rows() == []
    # The fenced lease is still the server's until its TTL ends: its row stays leased.
    assert shared.prompt_states() == {"accepted": 2, "leased": 1}
    assert alone.prompt_states() == {"queued": 1}


@pytest.mark.timeout(600)
def test_a_version_published_while_busy_is_loaded_before_its_first_lease(
    make_stack: Callable[..., Stack],
    tx_backend: Any,
    adapter_dirs: dict[int, Path],
    tmp_path: Path,
) -> None:
    stack = make_stack(2, prompts_per_lease=1, group_size=2, sampling=LONG)
    # One lease at a time: the second lease is granted only after the first is done.
    settings = worker_settings(stack, tmp_path, max_leases=2, max_inflight_sequences=2)
    worker = LoopThread(settings, tx_backend).start()
    worker.wait_for(lambda: len(held_runs(worker)) == 1, 120, "the first lease")
    stack.publish(1, adapter_dirs[1])
    worker.join(300)

    first, second = worker.loop.history
    assert (first.adapter_version, second.adapter_version) == (0, 1)
    assert [first.outcome, second.outcome] == [Outcome.accepted] * 2
    assert second.adapter_preloaded  # the push started the load, not the lease
    (load,) = worker.loop.loads.records
    assert load.key == (stack.run_id, 1) and load.source == "push"
    granted = stack.server.sql("SELECT created_at FROM leases WHERE id = :l", l=second.lease_id)[
        0
    ].created_at
    published = stack.server.sql(
        "SELECT created_at FROM adapter_versions WHERE run_id = :r AND version = 1",
        r=uuid.UUID(stack.run_id),
    )[0].created_at
    assert published < granted
    # The load began before the lease asked for the version: the lease waited less than the
    # load took (a lease that asked first would have waited for all of it).
    assert second.adapter_wait_s < load.seconds


class KillOnce:
    """The real backend, whose engine dies once while `n` generations are in it (the death is
    injected where the engine would raise it; the release and the restart are the real code)."""

    def __init__(self, backend: Any, n: int) -> None:
        self.backend, self.n = backend, n
        self.active = 0
        self.killed = threading.Event()
        self.lock = threading.Lock()
        self.restarts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.active += 1
            if self.active >= self.n and not self.killed.is_set():
                self.killed.set()
        try:
            deadline = time.monotonic() + 30
            while not self.killed.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
            with self.lock:
                first_round = self.restarts == 0
            if first_round:
                raise EngineFault("injected: engine died")
            return self.backend.generate(*args, **kwargs)
        finally:
            with self.lock:
                self.active -= 1

    def restart(self) -> None:
        with self.lock:
            self.restarts += 1
        self.backend.restart()


@pytest.mark.timeout(600)
def test_an_engine_death_under_three_leases_releases_them_all_and_restarts_once(
    make_stack: Callable[..., Stack], tx_backend: Any, tmp_path: Path
) -> None:
    stack = make_stack(3, prompts_per_lease=1, max_attempts=3)
    backend = KillOnce(tx_backend, 3)
    settings = worker_settings(stack, tmp_path, max_leases=6, max_inflight_sequences=64)
    worker = LoopThread(settings, backend).start()
    worker.join(300)

    history = worker.loop.history
    faults = [r for r in history if r.engine_fault is not None]
    assert [r.outcome for r in faults] == [Outcome.released] * 3
    assert backend.restarts == 1  # one death, one restart
    assert sorted(r.outcome for r in history if r.engine_fault is None) == [Outcome.accepted] * 3
    released = [lease for lease in stack.lease_rows() if lease.state == "released"]
    assert [lease.end_reason for lease in released] == ["engine_fault"] * 3
    attempts = stack.server.sql(
        "SELECT attempts FROM prompt_rows WHERE run_id = :r", r=uuid.UUID(stack.run_id)
    )
    assert sorted(a.attempts for a in attempts) == [1, 1, 1]  # the death counted once each
    assert stack.prompt_states() == {"accepted": 3}


class DiesLoading:
    """The real backend, whose engine dies once while a lease's thread loads an adapter version
    (a background preload, which may come first, fails instead, so that a lease loads it)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.restarts = 0
        self.died = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def load_adapter(self, adapter: Any) -> None:
        if not threading.current_thread().name.startswith("lease-"):
            # a background preload fails (logged, never used): the lease loads it itself
            raise EngineFault("injected: preload refused")
        if not self.died:
            self.died = True
            raise EngineFault("injected: engine died loading an adapter")
        self.backend.load_adapter(adapter)

    def restart(self) -> None:
        self.restarts += 1
        self.backend.restart()


@pytest.mark.timeout(600)
def test_an_engine_death_while_loading_a_version_releases_the_lease_and_restarts(
    make_stack: Callable[..., Stack],
    tx_backend: Any,
    adapter_dirs: dict[int, Path],
    tmp_path: Path,
) -> None:
    stack = make_stack(2, prompts_per_lease=1, max_staleness=2)
    stack.publish(1, adapter_dirs[1])  # every lease carries v1: its first load kills the engine
    backend = DiesLoading(tx_backend)
    settings = worker_settings(stack, tmp_path, max_leases=3, max_inflight_sequences=4)
    worker = LoopThread(settings, backend).start()
    worker.join(300)

    history = worker.loop.history
    (fault,) = [r for r in history if r.engine_fault is not None]
    assert fault.outcome == Outcome.released and "engine died loading" in (fault.reason or "")
    assert backend.restarts == 1
    assert [r.outcome for r in history if r.engine_fault is None] == [Outcome.accepted] * 2
    assert stack.prompt_states() == {"accepted": 2}
