"""Figures the alarms and the Prometheus endpoint share: clip fraction, staleness, rejections by
reason (stale waste has its own home, server/runs/waste.py; the learner's figures per version
theirs, server/runs/figures.py). Windows are in database time."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.db_types import db_now_plus
from server.models import MetricPoint, RolloutBatch


def clip_fraction_of(values: dict[str, Any]) -> float | None:
    """Total clip fraction of one learner metrics point: `clip_low` + `clip_high`, the names
    learner/loss.py logs (docs/architecture/loss.md, "Sampling, log-probs and the GRPO loss")."""
    parts = [values.get("clip_low"), values.get("clip_high")]
    nums = [float(p) for p in parts if isinstance(p, int | float)]
    return sum(nums) if nums else None


def latest_learner_values(session: Session, run_id: uuid.UUID) -> dict[str, Any] | None:
    row = session.execute(
        select(MetricPoint.values)
        .where(MetricPoint.run_id == run_id, MetricPoint.source == "learner")
        .order_by(MetricPoint.step.desc(), MetricPoint.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    return dict(row) if row is not None else None


def latest_clip_fraction(session: Session, run_id: uuid.UUID) -> float | None:
    values = latest_learner_values(session, run_id)
    return clip_fraction_of(values) if values is not None else None


def rejections_by_reason(session: Session) -> list[tuple[uuid.UUID, str, int, int]]:
    """(run_id, reason, batches, samples) for every rejected batch reason, all time."""
    rows = session.execute(
        select(
            RolloutBatch.run_id,
            RolloutBatch.reject_reason,
            func.count(),
            func.coalesce(func.sum(RolloutBatch.n_samples), 0),
        )
        .where(RolloutBatch.state == "rejected")
        .group_by(RolloutBatch.run_id, RolloutBatch.reject_reason)
    ).all()
    return [(r[0], r[1] or "unknown", int(r[2]), int(r[3])) for r in rows]


def staleness(session: Session, window_s: float) -> dict[uuid.UUID, tuple[float, int]]:
    """Per run: (mean, max) staleness of the batches claimed in the window."""
    rows = session.execute(
        select(
            RolloutBatch.run_id, func.avg(RolloutBatch.staleness), func.max(RolloutBatch.staleness)
        )
        .where(
            RolloutBatch.staleness.is_not(None),
            RolloutBatch.created_at >= db_now_plus(-float(window_s)),
        )
        .group_by(RolloutBatch.run_id)
    ).all()
    return {r[0]: (float(r[1]), int(r[2])) for r in rows}
