"""What a sweep costs with one learner per run, and the runs one learner GPU could hold by
memory and keep up with by tokens/s (server/dashboard/fleet_plan.py `sweep_plan`), against
figures worked out by hand for Qwen2.5-1.5B (test_fleet_plan.py's shape) on an H100 (80 GB)."""

from __future__ import annotations

import pytest

from server.dashboard.fleet_plan import FleetInputs, Gpu, full_plan
from server.dashboard.planner import PRESETS

SHAPE = PRESETS["qwen2.5-1.5b"]
LEARNER = Gpu("H100", 2.5, 4800)
L4 = Gpu("L4", 0.35, 1500)


def _fleet(worker_sequences: int = 32) -> FleetInputs:
    return FleetInputs(
        completion_tokens=512,
        group_size=8,
        bound_groups=16,
        worker_sequences=worker_sequences,
        accept_fraction=0.8,
        learner_gpus=1,
    )


def _plan(  # type: ignore[no-untyped-def]
    runs: int,
    samples: float | None = None,
    worker_sequences: int = 32,
    learner=LEARNER,
    checkpointing: bool = False,
    learner_gpus: int = 1,
):
    fleet = _fleet(worker_sequences)
    if learner_gpus != 1:
        fleet = FleetInputs(**{**fleet.__dict__, "learner_gpus": learner_gpus})
    return full_plan(
        SHAPE,
        16,
        "all-linear",
        micro_batch_tokens=4096,
        learner=learner,
        workers=[L4] if learner is not None else [],
        fleet=fleet,
        runs=runs,
        samples_per_run=samples,
        checkpointing=checkpointing,
    )


def test_one_learner_per_run_multiplies_one_runs_fleet() -> None:
    # one run (test_fleet_plan.py): 4 L4 workers, 4 · 0.35 + 2.5 = 3.9 $/h, 33,750 accepted/h
    sweep = _plan(4, samples=67_500).sweep
    (row,) = sweep.rows
    assert (row.runs, row.learner_gpus, row.workers) == (4, 4, 16)
    assert row.cost_per_hour == pytest.approx(4 * 3.9)
    assert row.accepted_per_hour == pytest.approx(4 * 33_750)
    # 67,500 accepted samples per run at 33,750/h: 2 hours; the sweep 4 · 3.9 · 2 = 31.2 $
    assert row.hours == pytest.approx(2.0) and row.cost == pytest.approx(31.2)
    no_samples = _plan(4).sweep.rows[0]
    assert no_samples.hours is None and no_samples.cost is None


def test_runs_one_learner_gpu_holds_by_memory() -> None:
    # single: total 16.324389888 GB, of which LoRA state 0.295436288 (16 · 18,464,768 B):
    # (80 − 16.028953600) / 0.295436288 = 216.5 → 216 runs
    sweep = _plan(1).sweep
    assert sweep.lora_state_gb == pytest.approx(0.295436288)
    assert sweep.runs_by_memory is not None and sweep.runs_by_memory["single"] == 216
    assert set(sweep.runs_by_memory) == {"single", "single+ckpt", "fsdp", "fsdp+ckpt"}
    assert sweep.runs_by_memory["single+ckpt"] > sweep.runs_by_memory["single"]
    # an unknown GPU's memory: unknown
    assert _plan(1, learner=Gpu("MI300X", 3.0, 4800)).sweep.runs_by_memory is None
    # no room for even one run: 0, never negative
    tiny = _plan(1, learner=Gpu("T4", 0.3, 4800)).sweep
    assert tiny.runs_by_memory is not None and tiny.runs_by_memory["single"] == 0


def test_runs_one_learner_keeps_up_with_by_tokens() -> None:
    # 32 sequences per worker: 16 · 8 // 32 = 4 usable workers, 4 · 0.8 · 1500 = 4,800 tokens/s
    # per run: the learner's 4,800 keeps up with one run
    row = _plan(8).sweep.rows[0]
    assert row.run_tokens_per_s == pytest.approx(4800) and row.runs_by_tokens == pytest.approx(1.0)
    # 16 sequences per worker: 8 usable, 9,600 tokens/s: half of one run
    assert _plan(8, worker_sequences=16).sweep.rows[0].runs_by_tokens == pytest.approx(0.5)
    # 64: 2 usable, 2,400 tokens/s: two runs
    assert _plan(8, worker_sequences=64).sweep.rows[0].runs_by_tokens == pytest.approx(2.0)


def test_the_sweep_fields_are_bounded() -> None:
    with pytest.raises(ValueError, match="runs must be between 1 and 10,000"):
        _plan(0)
    with pytest.raises(ValueError, match="samples_per_run must be between"):
        _plan(2, samples=0)
    assert _plan(3, learner=None).sweep.rows == []


def test_pool_learners_hold_what_they_keep_up_with_and_cost_fewer_learner_gpus() -> None:
    # 64 sequences per worker: 16 · 8 // 64 = 2 usable workers of the 4 needed (9.375 samples/s
    # ÷ 0.8 · 1500 / 512 = 2.34375 each), 2 · 2.34375 = 4.6875 accepted samples/s = 16,875/h;
    # one run's workers 2 · 0.8 · 1500 = 2,400 tokens/s, the learner's 4,800 keeps up with 2.
    # Runs per learner GPU: min(216 by memory, 2, 8 runs, 64) = 2: ceil(8 / 2) = 4 H100s.
    # 67,500 samples at 16,875/h: 4 h. One learner each: 8 · (2 · 0.35 + 2.5) = 25.60 $/h,
    # 102.40 $; pooled: 4 · 2.5 + 8 · 2 · 0.35 = 15.60 $/h, 62.40 $.
    sweep = _plan(8, samples=67_500, worker_sequences=64).sweep
    (row,) = sweep.rows
    assert sweep.pool_layout == "single"
    assert (row.runs_per_learner, row.pool_learner_gpus, row.workers) == (2, 4, 16)
    assert row.cost_per_hour == pytest.approx(25.6) and row.cost == pytest.approx(102.4)
    assert row.pool_cost_per_hour == pytest.approx(15.6) and row.pool_cost == pytest.approx(62.4)
    # keeping up with one run (32 sequences) or half of one (16): one run each, the same cost
    one = _plan(8, samples=67_500).sweep.rows[0]
    assert (one.runs_per_learner, one.pool_learner_gpus) == (1, 8)
    assert one.pool_cost == pytest.approx(one.cost)
    assert _plan(8, worker_sequences=16).sweep.rows[0].runs_per_learner == 1
    assert _plan(8).sweep.rows[0].pool_cost is None  # no sample count: no total


def test_runs_per_learner_gpu_is_capped_by_runs_memory_and_the_pool_bound() -> None:
    # 256 sequences per worker: 1 usable worker, 0.8 · 1500 = 1,200 tokens/s a run; a learner
    # of 480,000 tokens/s keeps up with 400 runs
    fast_h100 = Gpu("H100", 2.5, 480_000)
    assert _plan(3, worker_sequences=256, learner=fast_h100).sweep.rows[0].runs_per_learner == 3
    capped = _plan(100, worker_sequences=256, learner=fast_h100).sweep.rows[0]
    assert (capped.runs_per_learner, capped.pool_learner_gpus) == (64, 2)  # MAX_POOL_RUNS
    # an L4 learner (24 GB): (24 − 16.0289536) / 0.295436288 = 26.98 → 26 runs, ceil(100 / 26)
    # = 4; checkpointing: total 6.597798912 GB, (24 − 6.302362624) / 0.295436288 = 59.9 → 59,
    # ceil(100 / 59) = 2
    fast_l4 = Gpu("L4", 0.8, 480_000)
    by_memory = _plan(100, worker_sequences=256, learner=fast_l4).sweep.rows[0]
    assert (by_memory.runs_per_learner, by_memory.pool_learner_gpus) == (26, 4)
    ckpt = _plan(100, worker_sequences=256, learner=fast_l4, checkpointing=True).sweep
    assert ckpt.pool_layout == "single+ckpt"
    assert (ckpt.rows[0].runs_per_learner, ckpt.rows[0].pool_learner_gpus) == (59, 2)


def test_no_pool_figures_without_memory_or_on_several_gpus() -> None:
    # T4 (16 GB) holds not even one run of 16.32 GB: 0, and no pool cost
    t4 = _plan(4, samples=67_500, learner=Gpu("T4", 0.3, 4800)).sweep.rows[0]
    assert (t4.runs_per_learner, t4.pool_learner_gpus, t4.pool_cost) == (0, None, None)
    unknown = _plan(4, learner=Gpu("MI300X", 3.0, 4800)).sweep.rows[0]
    assert unknown.runs_per_learner is None and unknown.pool_cost_per_hour is None
    torchrun = _plan(4, worker_sequences=64, learner_gpus=2).sweep.rows[0]
    assert torchrun.runs_per_learner is None  # a pool learner runs on one GPU
