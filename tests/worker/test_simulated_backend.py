"""The simulated backend (benchmarks only): the Backend contract, honest log-probs of its
fixed distribution, continuous batching shared by concurrent calls, per-call cancel."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from worker.adapters import AdapterHandle
from worker.backends.base import GenerationCancelled, SamplingSpec
from worker.backends.simulated import SimulatedBackend, lease_seconds
from worker.config import SimulatedSettings

MODEL = "smollm2-135m-instruct"
PROMPTS = [[1, 2, 3], [4, 5], [6]]
NEVER_EOS = 1e9  # mean completion length: every completion runs to max_new_tokens


def make(**profile: float) -> SimulatedBackend:
    settings = {"step_s": 0.001, "prefill_s_per_token": 0.0, **profile}
    return SimulatedBackend(MODEL, SimulatedSettings.model_validate(settings))


@pytest.fixture
def backend() -> Iterator[SimulatedBackend]:
    b = make(mean_completion_tokens=8)
    yield b
    b.close()


def test_shapes_and_order(backend: SimulatedBackend) -> None:
    out = backend.generate(PROMPTS, 4, SamplingSpec(1.0, 16, seed=3), None)
    assert [(c.prompt_index, c.group_index) for c in out] == [
        (p, g) for p in range(3) for g in range(4)
    ]
    for c in out:
        assert 1 <= len(c.token_ids) <= 16
        assert len(c.logprobs) == len(c.token_ids)
    assert backend.tokens_generated == sum(len(c.token_ids) for c in out)
    assert backend.default_inflight_sequences == 256


def test_logprobs_are_the_fixed_distribution_at_the_temperature(backend: SimulatedBackend) -> None:
    dist = backend.distribution
    for temperature in (0.5, 1.0, 1.7):
        out = backend.generate(PROMPTS, 2, SamplingSpec(temperature, 16, seed=1), None)
        scaled = dist.logits / temperature
        expected = scaled - np.log(np.exp(scaled).sum())
        by_id = dict(zip(dist.token_ids.tolist(), expected.tolist(), strict=True))
        for c in out:
            assert c.logprobs == pytest.approx([by_id[t] for t in c.token_ids], abs=1e-9)
    special = set(backend.tokenizer.all_special_ids) - {backend.tokenizer.eos_token_id}
    assert not special & set(dist.token_ids.tolist())


def test_eos_ends_a_completion_and_is_kept(backend: SimulatedBackend) -> None:
    eos = backend.tokenizer.eos_token_id
    out = backend.generate([[1]], 64, SamplingSpec(1.0, 12, seed=0), None)
    reasons = {c.finish_reason for c in out}
    assert reasons == {"stop", "length"}  # mean 8 tokens, cut at 12: both happen in 64
    for c in out:
        assert eos not in c.token_ids[:-1]
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == eos
        else:
            assert len(c.token_ids) == 12 and c.token_ids[-1] != eos


def test_mean_length_follows_the_profile() -> None:
    b = make(mean_completion_tokens=20, step_s=0.0)
    try:
        out = b.generate([[1]] * 8, 64, SamplingSpec(1.0, 1000, seed=0), None)
    finally:
        b.close()
    assert np.mean([len(c.token_ids) for c in out]) == pytest.approx(20, rel=0.15)


def test_deterministic_by_seed(backend: SimulatedBackend) -> None:
    def tokens(seed: int) -> list[list[int]]:
        out = backend.generate(PROMPTS, 3, SamplingSpec(1.0, 16, seed=seed), None)
        return [c.token_ids for c in out]

    assert tokens(5) == tokens(5)
    assert tokens(5) != tokens(6)
    # one completion depends on (seed, prompt index, group index) only, not on the batch
    alone = backend.generate([PROMPTS[0]], 1, SamplingSpec(1.0, 16, seed=5), None)
    assert alone[0].token_ids == tokens(5)[0]


def test_two_concurrent_calls_share_steps() -> None:
    b = make(step_s=0.01, mean_completion_tokens=NEVER_EOS, max_batch=64)
    spec = SamplingSpec(1.0, 20, seed=0)  # 20 steps of 10 ms for one call alone
    try:
        started = time.monotonic()
        b.generate([[1]], 8, spec, None)
        alone = time.monotonic() - started
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(b.generate, [[1]], 8, spec, None) for _ in range(2)]
            assert all(len(f.result()) == 8 for f in futures)
        together = time.monotonic() - started
    finally:
        b.close()
    assert alone >= 0.2
    assert together < 1.5 * alone  # not 2x: the second call's sequences joined the same steps
    assert 0 < b.mean_occupancy <= 16 / 64


def test_sequences_beyond_the_batch_wait() -> None:
    b = make(step_s=0.01, mean_completion_tokens=NEVER_EOS, max_batch=4)
    try:
        started = time.monotonic()
        b.generate([[1]], 8, SamplingSpec(1.0, 10, seed=0), None)  # two rounds of 10 steps
        elapsed = time.monotonic() - started
    finally:
        b.close()
    assert elapsed >= 0.2
    assert b.steps == 20 and b.mean_occupancy == pytest.approx(1.0)
    assert b.busy_seconds == pytest.approx(elapsed, abs=0.1)


def test_cancel_stops_one_call_only() -> None:
    b = make(step_s=0.005, mean_completion_tokens=NEVER_EOS)
    cancel = threading.Event()
    spec_long = SamplingSpec(1.0, 10_000, seed=0)  # 50 s if not cancelled
    try:
        with ThreadPoolExecutor(2) as pool:
            doomed = pool.submit(b.generate, [[1]], 4, spec_long, None, cancel)
            kept = pool.submit(b.generate, [[2]], 4, SamplingSpec(1.0, 40, seed=0), None)
            time.sleep(0.05)
            cancel.set()
            with pytest.raises(GenerationCancelled):
                doomed.result(timeout=5)
            assert [len(c.token_ids) for c in kept.result(timeout=5)] == [40] * 4
    finally:
        b.close()


def test_adapter_load_takes_bytes_over_rate(tmp_path: Path) -> None:
    b = make(adapter_load_gbps=0.01)  # 10 MB/s: 1 MB takes 0.1 s
    (tmp_path / "adapter_model.safetensors").write_bytes(b"\0" * 1_000_000)
    handle = AdapterHandle(str(uuid.UUID(int=1)), 1, "0" * 64, tmp_path)
    try:
        started = time.monotonic()
        b.load_adapter(handle)
        assert time.monotonic() - started >= 0.1
        started = time.monotonic()
        b.generate([[1]], 2, SamplingSpec(1.0, 4, seed=0), handle)  # already loaded
        assert time.monotonic() - started < 0.1
        b.drop_adapter(handle.key)
        b.generate([[1]], 2, SamplingSpec(1.0, 4, seed=0), handle)  # loads again
    finally:
        b.close()
    assert b.adapter_loads == 2


def test_lease_seconds_counts_rounds_and_prefill() -> None:
    profile = SimulatedSettings(step_s=0.025, max_batch=256, prefill_s_per_token=1e-5)
    assert lease_seconds(profile, 128, 0, 64) == pytest.approx(64 * 0.025)
    assert lease_seconds(profile, 512, 100, 64) == pytest.approx(2 * 64 * 0.025 + 0.512)


def test_the_worker_builds_it_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.config import WorkerSettings
    from worker.main import make_backend

    monkeypatch.setenv("ASYNCGRPO_WORKER_SIMULATED_STEP_S", "0.002")
    settings = WorkerSettings(server_url="http://127.0.0.1:1", backend="simulated")
    assert WorkerSettings(server_url="http://127.0.0.1:1").backend != "simulated"
    b = make_backend(settings)
    try:
        assert isinstance(b, SimulatedBackend) and b.profile.step_s == 0.002
    finally:
        b.close()
