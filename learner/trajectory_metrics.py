"""Per-step figures of the trajectories a step consumed (multi-turn runs): turns, tool calls,
tool errors and stop reasons. They travel with the step's learner metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from protocol.batch_reader import TrajectoryRecord
from protocol.rewards import WORKER_SCORE
from protocol.trajectories import StopReason

STOP_REASONS: tuple[str, ...] = get_args(StopReason)


def trajectory_metrics(rows: Sequence[TrajectoryRecord]) -> dict[str, float]:
    """`trajectories`, `turns_mean` (model turns per trajectory), `tool_calls` and
    `tool_errors` (totals), their means per trajectory, `model_tokens_mean`, `worker_scored`
    (trajectories carrying a score computed on the worker, `info["worker_score"]`: a trusted
    worker's rubric, recorded so that a run's figures say where a score came from) and one
    `stop_<reason>` count per stop reason (zeros included, so a chart has every series).
    Counts every consumed trajectory, whether or not its group was trained."""
    n = len(rows)
    if n == 0:
        return {}
    calls = sum(r.tool_calls for r in rows)
    errors = sum(r.tool_errors for r in rows)
    out: dict[str, float] = {
        "trajectories": float(n),
        "turns_mean": sum(r.model_turns for r in rows) / n,
        "tool_calls": float(calls),
        "tool_errors": float(errors),
        "tool_calls_per_trajectory": calls / n,
        "tool_errors_per_trajectory": errors / n,
        "model_tokens_mean": sum(r.trained_tokens for r in rows) / n,
        "worker_scored": float(sum(1 for r in rows if WORKER_SCORE in (r.info or {}))),
    }
    for reason in STOP_REASONS:
        out[f"stop_{reason}"] = float(sum(1 for r in rows if r.stop_reason == reason))
    return out
