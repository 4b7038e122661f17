"""bench/learner_pool.py: its ratios, and the smallest real comparison (two runs of one step on
one pool learner against two per-run learners, the real small model, SQLite)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import MB
from bench.learner_pool import Measured, figures, medians

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "pool_peak_rss_mb", "pool_peak_learner_rss_mb", "single_peak_rss_mb",
    "single_peak_learner_rss_mb", "memory_ratio", "pool_tokens_per_s", "per_run_tokens_per_s",
    "tokens_per_s_ratio", "pool_window_s", "per_run_window_s", "pool_tokens", "per_run_tokens",
    "completed",
}  # fmt: skip


def test_the_ratios_take_the_largest_single_learner_and_the_sum_of_its_windows() -> None:
    pool = Measured(window_s=10.0, peak_rss=300 * MB, peak_own_rss=250 * MB)
    own = [Measured(8.0, 200 * MB, 150 * MB), Measured(12.0, 250 * MB, 160 * MB)]
    got = figures(2, pool, own, pool_tokens=40.0, own_tokens=40.0, done=4)
    assert got.keys() == KEYS
    assert got["memory_ratio"] == pytest.approx(300 / (250 * 2))
    assert got["single_peak_learner_rss_mb"] == pytest.approx(160)
    assert got["per_run_window_s"] == pytest.approx(20.0)
    assert got["tokens_per_s_ratio"] == pytest.approx((40 / 10) / (40 / 20))


def test_the_rounds_give_medians_and_the_completed_runs_add_up() -> None:
    rounds = [{"memory_ratio": r, "completed": 4} for r in (0.7, 0.5, 0.6)]
    assert medians(rounds) == {"memory_ratio": 0.6, "completed": 12, "repeats": 3}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_runs_on_one_pool_learner_take_less_memory_than_two_learners() -> None:
    argv = [sys.executable, str(ROOT / "bench" / "learner_pool.py"),
            "--runs", "2", "--steps", "1", "--repeats", "1", "--json"]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["goal"] == {"memory_ratio_max": 0.5, "tokens_per_s_ratio_min": 0.9, "at_runs": 4}
    two = out["runs"]["2"]
    assert two.keys() == KEYS | {"repeats"} and two["repeats"] == 1
    assert two["completed"] == 4  # both runs of both phases
    for key in KEYS - {"completed"}:
        assert math.isfinite(two[key]) and two[key] > 0, key
    assert two["pool_tokens"] == two["per_run_tokens"]  # the same batches, trained once each
    assert two["memory_ratio"] < 1  # two runs on one base model: less than two learners
