"""bench/pipeline.py: its prebuilt completions and busy arithmetic, and one tiny real run
(server on Postgres, moto S3, the real learner, scripted workers, the preloaded comparison)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.pipeline import (
    LengthMix,
    StepPoint,
    busy_series,
    efficiency_after_first_step,
    prebuild,
)

ROOT = Path(__file__).resolve().parents[2]


def test_lengths_stay_within_one_and_the_cap_with_a_tail_at_the_cap() -> None:
    mix = LengthMix(cap=32)
    rng = random.Random(0)
    lengths = [mix.draw(rng) for _ in range(2000)]
    assert min(lengths) >= 1 and max(lengths) == 32
    assert sorted(lengths)[len(lengths) // 2] == pytest.approx(mix.median, abs=1)
    assert 0.01 < sum(n == 32 for n in lengths) / len(lengths) < 0.15


def test_prebuilt_completions_are_seeded_and_valid_rows() -> None:
    made = prebuild(200, LengthMix(cap=16), vocab=1000, eos=2, seed=7)
    assert made == prebuild(200, LengthMix(cap=16), vocab=1000, eos=2, seed=7)
    assert made != prebuild(200, LengthMix(cap=16), vocab=1000, eos=2, seed=8)
    for c in made:
        assert len(c.token_ids) == len(c.logprobs) and 1 <= len(c.token_ids) <= 16
        assert all(-12.0 <= lp <= -1.0 for lp in c.logprobs)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == 2 and len(c.token_ids) < 16
        else:
            assert len(c.token_ids) == 16 and 2 not in c.token_ids


def test_busy_is_the_learner_metric_when_posted_else_step_time_over_the_gap() -> None:
    computed = [
        StepPoint(1, 1, 100.0, {"step_seconds": 4.0}),
        StepPoint(2, 2, 105.0, {"step_seconds": 4.0}),
        StepPoint(3, 3, 113.0, {"step_seconds": 6.0}),
    ]
    series, source = busy_series(computed)
    assert series == [None, pytest.approx(0.8), pytest.approx(0.75)]
    assert source.startswith("computed")
    posted = [
        StepPoint(i, i, 100.0 + i, {"step_seconds": 1.0, "learner_busy": 0.5}) for i in (1, 2)
    ]
    assert busy_series(posted) == ([0.5, 0.5], "learner_busy (learner metric)")


def test_efficiency_after_the_first_step_compares_steps_two_on() -> None:
    points = [
        StepPoint(1, 1, 100.0, {"step_seconds": 9.0, "completion_tokens": 10}),
        StepPoint(2, 2, 110.0, {"step_seconds": 8.0, "completion_tokens": 20}),
        StepPoint(3, 3, 120.0, {"step_seconds": 8.0, "completion_tokens": 30}),
    ]
    pre = {"step_seconds": [5.0, 8.0, 8.0], "tokens": [10, 20, 30]}
    # loop: 50 tokens in 20 s; preloaded: 50 tokens in 16 s
    assert efficiency_after_first_step(points, pre) == pytest.approx(0.8)
    assert efficiency_after_first_step(points[:1], pre) is None


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(600)
def test_a_tiny_run_reports_positive_figures() -> None:
    argv = [sys.executable, str(ROOT / "bench" / "pipeline.py"), "--versions", "2",
            "--modes", "serial", "--prompts", "2", "--group", "2", "--tokens", "8",
            "--max-chars", "12", "--workers", "1", "--json"]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])["modes"]["serial"]
    assert figures["steps"] == 2
    assert figures["completion_tokens"] == figures["preloaded_completion_tokens"] > 0
    for name in ("pipeline_efficiency", "pipeline_efficiency_after_first_step",
                 "loop_tokens_per_s", "preloaded_tokens_per_s",
                 "learner_busy_median", "loop_wall_s"):  # fmt: skip
        assert figures[name] > 0, name
    assert figures["batches_rejected"] == 0
