"""Worker spot-checks: re-score a batch's completions with the policy it claims to have
sampled from and compare with the behaviour log-probs the worker reported. A trajectory is
re-scored in one forward pass over all its tokens, and only its model tokens are compared
(environment tokens were never sampled: they have no behaviour log-prob)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocol.batches import TrajectoryRecord


@dataclass(frozen=True)
class SpotCheckResult:
    mean_abs_diff: float  # mean over tokens of |Δ log-prob|
    max_abs_diff: float
    kl: float  # k3 estimate of KL(behaviour‖recomputed) over the tokens
    n_tokens: int


def compare_logprobs(
    reported: Sequence[Sequence[float]], recomputed: Sequence[Sequence[float]]
) -> SpotCheckResult:
    """Per-token comparison of the worker's log-probs with the learner's recomputation."""
    total = worst = kl = 0.0
    n = 0
    for rep, rec in zip(reported, recomputed, strict=True):
        if len(rep) != len(rec):
            raise ValueError("reported and recomputed log-probs differ in length")
        for a, b in zip(rep, rec, strict=True):
            d = b - a  # log(π_learner / π_behaviour)
            total += abs(d)
            worst = max(worst, abs(d))
            kl += math.exp(d) - 1.0 - d
            n += 1
    if n == 0:
        return SpotCheckResult(0.0, 0.0, 0.0, 0)
    return SpotCheckResult(total / n, worst, kl / n, n)


def far_outside(result: SpotCheckResult, threshold: float, factor: float) -> bool:
    """A batch this far from its claimed policy is rejected (`spot_check`)."""
    return result.n_tokens > 0 and result.mean_abs_diff > threshold * factor


def reported_logprobs(rows: Sequence[TrajectoryRecord]) -> list[list[float]]:
    """Each row's behaviour log-probs of its model tokens, in order."""
    return [
        [float(lp) for lp, m in zip(r.logprobs, r.loss_mask, strict=True) if m and lp is not None]
        for r in rows
    ]
