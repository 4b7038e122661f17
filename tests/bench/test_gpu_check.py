"""bench/gpu_check.py: its arithmetic against independent counts, and its --smoke run on CPU
(the same code as on a GPU: the embedded server, a transformers worker and the learner, in
bf16, on a random model of Qwen2.5's vocabulary with the small model's tokenizer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import gpu_check

ROOT = Path(__file__).resolve().parents[2]


def test_weight_counts_match_qwen25_15b_model_card() -> None:
    """Qwen2.5-1.5B's card: 1.54 B parameters, 1.31 B of them non-embedding."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = gpu_check.SHAPES["qwen2.5-1.5b"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape))
    counts = gpu_check.count_weights(model, shape)
    assert counts.total == pytest.approx(1.54e9, rel=0.005)
    assert counts.body == pytest.approx(1.31e9, rel=0.005)
    assert counts.head == 151936 * 1536


def test_lora_weights_match_peft() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = gpu_check.SHAPES["tiny"]
    for rank, targets in ((4, ["q_proj", "v_proj"]), (16, gpu_check.LINEAR)):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(Qwen2Config(**shape))
        peft = get_peft_model(model, LoraConfig(r=rank, target_modules=targets))
        trainable = sum(p.numel() for p in peft.parameters() if p.requires_grad)
        assert gpu_check.lora_weights(shape, rank, targets) == trainable


def _point(step: int, **values: float) -> dict[str, Any]:
    return {"step": step, "version": step, "values": values, "created_at": None}


def test_learner_figures_leave_out_the_first_step_and_count_flops_by_the_formula() -> None:
    counts = gpu_check.ModelCounts(body=1000, head=100, total=1200)
    points = [
        _point(1, step_seconds=50.0, groups=2, zero_advantage_fraction=0.0, trained_tokens=40),
        # 2 groups of G = 4, one all-equal: 4 sequences × 10 prompt tokens + 30 completion tokens
        _point(
            2,
            step_seconds=2.0,
            groups=2,
            zero_advantage_fraction=0.5,
            trained_tokens=30,
            learner_busy=0.5,
            peak_memory_bytes=7e9,
        ),  # fmt: skip
        _point(
            3,
            step_seconds=2.0,
            groups=2,
            zero_advantage_fraction=0.0,
            trained_tokens=50,
            learner_busy=0.7,
            peak_memory_bytes=9e9,
        ),  # fmt: skip
    ]
    got = gpu_check.learner_figures(
        points, prompt_len=10.0, group_size=4, counts=counts, lora=10, peak_tflops=1e-9
    )
    positions = (4 * 10 + 30) + (8 * 10 + 50)  # 200 over 4 s
    flops = 4 * 1000 * positions + 4 * 100 * (30 + 50) + 6 * 10 * positions
    assert got["learner_steps_measured"] == 2
    assert got["learner_tokens_per_s"] == pytest.approx(positions / 4.0)
    assert got["mfu"] == pytest.approx(flops / 4.0 / 1e3)  # peak 1e-9 TFLOP/s = 1e3 FLOP/s
    assert got["learner_busy_p50"] == pytest.approx(0.6)
    assert got["learner_peak_memory_bytes"] == 9_000_000_000
    assert got["padding_fraction_p50"] is None  # not posted: null, not 0


def test_generation_rate_counts_time_with_a_lease_generating_once() -> None:
    # warm-up batch 0-10; then two overlapping leases 10-14 and 12-16, a gap, one 20-22
    batches = [(100, 0.0, 10.0), (60, 10.0, 14.0), (60, 12.0, 16.0), (30, 20.0, 22.0)]
    got = gpu_check.generation_figures(batches)
    assert got["batches_measured"] == 3
    assert got["generated_tokens"] == 250
    assert got["generation_tokens_per_s"] == pytest.approx(150 / 8.0)
    assert gpu_check.generation_figures([])["generation_tokens_per_s"] is None


def test_sync_latency_reads_the_publish_and_first_generation_lines() -> None:
    run = "5b0c"
    learner = (
        "2026-01-02 10:00:01,000 INFO learner learner.loop: published version 1 (running)\n"
        "2026-01-02 10:00:09,000 INFO learner learner.loop: published version 2 (running)\n"
        "2026-01-02 10:00:20,000 INFO learner learner.loop: published version 3 (completed)\n"
    )
    line = "2026-01-02 10:00:{} INFO worker worker.lease_work: lease x generating with run={} v{}\n"
    worker = "".join(
        line.format(stamp, run, version)
        for stamp, version in (("00,500", 0), ("03,250", 1), ("04,000", 1), ("09,500", 2))
    )
    assert gpu_check.sync_latencies(worker, learner, run) == pytest.approx([2.25, 0.5])


def test_peak_by_gpu_name() -> None:
    assert gpu_check.peak_for("NVIDIA H100 80GB HBM3", None) == 989.0
    assert gpu_check.peak_for("NVIDIA H100 PCIe", None) == 756.0
    assert gpu_check.peak_for("NVIDIA H200", None) == 989.0
    assert gpu_check.peak_for("NVIDIA A100-SXM4-80GB", None) == 312.0
    assert gpu_check.peak_for("NVIDIA RTX 9999", None) is None
    assert gpu_check.peak_for("NVIDIA RTX 9999", 100.0) == 100.0
    assert gpu_check.peak_for(None, None) is None


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_smoke_run_reaches_two_versions_with_sane_figures(
    small_model_dir: str, tmp_path: Path
) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--smoke", "--json",
         "--tokenizer", small_model_dir, "--work-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RANDOM WEIGHTS" in done.stdout
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["random_weights"] is True and figures["mode"] == "smoke"
    assert figures["run_status"] == "completed"
    assert figures["versions_reached"] == 2
    assert figures["learner_steps"] == 2
    assert figures["prompt_tokens_exact"] is True and figures["prompt_tokens"] > 0
    # every sampled id is one the tokenizer knows (suppress_tokens): no batch was invalid
    assert "invalid" not in figures["rejected_batches"]
    assert 0 < figures["generation_tokens_per_s"] < 1e6
    assert figures["generated_tokens"] >= 2 * 2 * 4  # 2 steps × 2 prompts × G, 1+ token each
    assert 0 < figures["learner_tokens_per_s"] < 1e7
    assert figures["model_tflop_per_s"] > 0
    assert figures["mfu"] is None  # no GPU: no peak to divide by
    latency = figures["sync_latency_s_p50"]
    assert latency is None or 0 < latency < 60
    for key in ("learner_busy_p50", "learner_peak_memory_bytes", "worker_gpu_memory_max_bytes"):
        assert key in figures
    # the folder a GPU box would get: Qwen2.5's vocabulary, the tokenizer's ids all below it
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["vocab_size"] == 151936 and config["tie_word_embeddings"] is True
