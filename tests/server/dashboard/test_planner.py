"""The planner's arithmetic against reference figures of 7B models in bf16 (LoRA payloads from
the models' published shapes; transfer times at a given link speed)."""

from __future__ import annotations

import pytest

from server.dashboard.planner import plan

# Reference LoRA payload MB for Llama-2-7B / Qwen2.5-7B at rank 8 / 16 / 64.
FACTS_MB = {
    ("llama-2-7b", "qv"): (8.4, 16.8, 67.1),
    ("qwen2.5-7b", "qv"): (5.0, 10.1, 40.4),
    ("llama-2-7b", "attention"): (16.8, 33.6, 134),
    ("qwen2.5-7b", "attention"): (10.1, 20.2, 80.7),
    ("llama-2-7b", "all-linear"): (40, 80, 320),
    ("qwen2.5-7b", "all-linear"): (40, 81, 323),
}


@pytest.mark.parametrize(("model", "targets"), sorted(FACTS_MB))
def test_adapter_mb_matches_facts(model: str, targets: str) -> None:
    for rank, expected in zip((8, 16, 64), FACTS_MB[(model, targets)], strict=True):
        got = plan(model, rank, targets, 1.0).adapter_mb
        # The reference gives one decimal or whole MB: half a unit of the last digit given.
        tolerance = 0.5 if isinstance(expected, int) else 0.05
        assert got == pytest.approx(expected, abs=tolerance), (model, targets, rank, got)


@pytest.mark.parametrize(
    ("model", "weights_gb", "adam_gb"), [("llama-2-7b", 13.5, 54), ("qwen2.5-7b", 15.2, 61)]
)
def test_full_fine_tune_matches_facts(model: str, weights_gb: float, adam_gb: float) -> None:
    p = plan(model, 16, "all-linear", 1.0)
    assert p.full_weights_gb == pytest.approx(weights_gb, abs=0.05)
    assert p.adam_state_gb == pytest.approx(adam_gb, abs=0.5)


def test_sync_times_at_one_gigabit_match_facts() -> None:
    # At 1 Gb/s, 80 MB take 80 × 8 / 1000 = 0.64 s and 13.5 GB take 108 s.
    p = plan("llama-2-7b", 16, "all-linear", 1.0)
    assert p.sync_seconds == pytest.approx(0.64, abs=0.01)
    assert p.full_sync_seconds == pytest.approx(108, abs=0.5)
    faster = plan("llama-2-7b", 16, "all-linear", 10.0)
    assert faster.sync_seconds == pytest.approx(p.sync_seconds / 10)


def test_small_model_is_smaller_and_scales_with_rank() -> None:
    small = plan("qwen2.5-1.5b", 8, "qv", 1.0)
    assert 1.4 < small.full_weights_gb / 2 < 1.7  # about 1.5 B parameters
    assert small.adapter_mb < plan("qwen2.5-7b", 8, "qv", 1.0).adapter_mb
    assert plan("qwen2.5-1.5b", 16, "qv", 1.0).lora_params == 2 * small.lora_params


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gpt-5", 8, "qv", 1.0), "preset"),
        (("qwen2.5-7b", 0, "qv", 1.0), "rank"),
        (("qwen2.5-7b", 8, "mlp", 1.0), "target"),
        (("qwen2.5-7b", 8, "qv", 0.0), "link"),
    ],
)
def test_bad_inputs_are_refused(args: tuple, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=message):
        plan(*args)
