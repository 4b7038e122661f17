"""On CUDA the step's all-reduce (NCCL, which returns once queued) is waited for inside the
watchdog: when all_reduce_sum returns, the summed tensor is computed and the seconds cover it.
Needs a GPU (skipped without one); one rank, so one device suffices."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_all_reduce_sum_waits_for_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    from learner.distributed import DataParallel, RankEnv
    from tests.s3_fixtures import free_port

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dp = DataParallel(RankEnv(0, 1, 0), device="cuda", collective_timeout_s=20.0)
    try:
        flat = torch.ones(1 << 20, device=dp.device)
        dp.all_reduce_sum(flat)  # warm-up: NCCL's communicator
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time queued before the all-reduce
        seconds = dp.all_reduce_sum(flat)
        assert torch.cuda.current_stream(flat.device).query()  # nothing left in flight
        assert float(flat[0]) == 1.0
        assert seconds < 5.0
    finally:
        dp.close()
