"""The learning rate of each optimizer step (docs/guides/run-config.md, "Learning-rate
schedule"): a linear warm-up from 0 over `warmup_steps`, then constant, or a linear or cosine
decay to `min_lr_ratio` × learning_rate at the decay's end, held after it. The conventions are
transformers' (`get_linear_schedule_with_warmup`, `get_cosine_with_min_lr_schedule_with_warmup`):
the factor of step s is applied to the (s + 1)-th optimizer step, so a warm-up's first step has
learning rate 0."""

from __future__ import annotations

import math
from functools import partial

import torch

from protocol.run_config import RunConfig


def lr_factor(
    step: int, *, schedule: str, warmup_steps: int, decay_end: int | None, floor: float
) -> float:
    """The share of the peak learning rate at `step` (optimizer steps taken so far)."""
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant" or decay_end is None:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, decay_end - warmup_steps))
    shape = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * shape


def make_scheduler(
    optimizer: torch.optim.Optimizer, config: RunConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """The run's schedule on `optimizer`. Its state (the step count) is saved and restored with
    the optimizer's on checkpoint versions (learner/checkpoint.py); the factor is rebuilt from
    the run's config, so a resumed learner goes on where the schedule was."""
    g = config.grpo
    factor = partial(
        lr_factor,
        schedule=g.lr_schedule,
        warmup_steps=g.warmup_steps,
        decay_end=config.lr_decay_end,
        floor=g.min_lr_ratio,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def resume_schedule_at(scheduler: torch.optim.lr_scheduler.LambdaLR, step: int) -> None:
    """Put the schedule at optimizer step `step`. A resumed learner takes the optimizer state of
    the latest checkpoint, which may be versions older than the step it resumes; the rate is a
    function of the step alone, so it follows the step, not the checkpoint."""
    scheduler.last_epoch = step
    groups = scheduler.optimizer.param_groups
    for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(step)
    scheduler._last_lr = [group["lr"] for group in groups]  # what get_last_lr() reads
