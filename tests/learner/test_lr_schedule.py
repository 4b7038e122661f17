"""The learning-rate schedule (learner/lr_schedule.py): each step's rate equals transformers'
schedules of the same name (an independent implementation), the warm-up and the floor hold,
and a schedule restored from a checkpoint goes on where it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from learner.checkpoint import load_state, save_state
from learner.lr_schedule import make_scheduler, resume_schedule_at
from protocol.run_config import RunConfig
from tests.harness.runs import run_config

PEAK = 1e-3


def _config(**grpo: Any) -> RunConfig:
    return RunConfig.model_validate(run_config(max_versions=5, weight_sync_steps=2, grpo=grpo))


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=PEAK)


def _rates(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    """The rate each of `steps` optimizer steps runs at."""
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return rates


def test_linear_equals_transformers_and_holds_zero_after_the_end() -> None:
    ours = make_scheduler(_optimizer(), _config(lr_schedule="linear", warmup_steps=3))
    theirs = get_linear_schedule_with_warmup(_optimizer(), 3, 10)  # 5 versions × 2 steps
    assert _rates(ours, 14) == pytest.approx(_rates(theirs, 14), abs=1e-12)


def test_cosine_with_a_floor_equals_transformers() -> None:
    config = _config(lr_schedule="cosine", warmup_steps=2, lr_decay_steps=8, min_lr_ratio=0.1)
    ours = make_scheduler(_optimizer(), config)
    theirs = get_cosine_with_min_lr_schedule_with_warmup(_optimizer(), 2, 8, min_lr_rate=0.1)
    assert _rates(ours, 9) == pytest.approx(_rates(theirs, 9), abs=1e-12)
    # after its end the floor holds (transformers' cosine would climb back up)
    assert _rates(ours, 3) == pytest.approx([0.1 * PEAK] * 3)


def test_warm_up_then_constant_and_the_default_is_constant() -> None:
    warm = make_scheduler(_optimizer(), _config(warmup_steps=4))
    assert _rates(warm, 7) == pytest.approx([0, PEAK / 4, PEAK / 2, 3 * PEAK / 4, PEAK, PEAK, PEAK])
    assert _rates(make_scheduler(_optimizer(), _config()), 3) == [PEAK] * 3


def test_linear_with_a_floor_by_the_formula() -> None:
    config = _config(lr_schedule="linear", lr_decay_steps=4, min_lr_ratio=0.5)
    rates = _rates(make_scheduler(_optimizer(), config), 6)
    assert rates == pytest.approx([PEAK * (0.5 + 0.5 * (1 - s / 4)) for s in range(5)] + [PEAK / 2])


def test_a_restored_schedule_goes_on_where_it_was(tmp_path: Path) -> None:
    config = _config(lr_schedule="cosine", warmup_steps=2)
    straight = _rates(make_scheduler(_optimizer(), config), 10)
    first = make_scheduler(_optimizer(), config)
    before = _rates(first, 4)
    names = ["p"]
    save_state(tmp_path, names=names, optimizer=first.optimizer, scheduler=first, step=4, version=2)
    resumed = make_scheduler(_optimizer(), config)  # a new process: the factor from the config
    load_state(tmp_path, names=names, optimizer=resumed.optimizer, scheduler=resumed)
    assert before + _rates(resumed, 6) == pytest.approx(straight, abs=1e-12)


def test_a_resume_from_an_older_checkpoint_follows_the_step(tmp_path: Path) -> None:
    """The checkpoint of step 2 restored at step 5 (checkpoints every few versions): the rate
    is the schedule's at step 5, not at step 2."""
    config = _config(lr_schedule="linear", lr_decay_steps=10)
    straight = _rates(make_scheduler(_optimizer(), config), 8)
    first = make_scheduler(_optimizer(), config)
    _rates(first, 2)
    save_state(tmp_path, names=["p"], optimizer=first.optimizer, scheduler=first, step=2, version=1)
    resumed = make_scheduler(_optimizer(), config)
    load_state(tmp_path, names=["p"], optimizer=resumed.optimizer, scheduler=resumed)
    resume_schedule_at(resumed, 5)
    assert _rates(resumed, 3) == pytest.approx(straight[5:8], abs=1e-12)
