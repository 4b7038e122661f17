"""Dashboard-only read queries. Figures the jobs, the runs service or the learner telemetry
already compute are taken from them (see service.py); what is here exists nowhere else:
series over time (waste, spend), the latest points per run for sparklines, live leases with
their worker, events, and the cost breakdowns of the cost page."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.db_types import db_now, epoch_bucket, epoch_seconds
from server.models import (
    CostRecord,
    Event,
    Lease,
    MetricPoint,
    PoolLearner,
    RolloutBatch,
    Run,
    Worker,
)
from server.runs.repository import config_number
from server.runs.waste import spend_kind


def learner_points(
    session: Session, run_id: uuid.UUID, max_points: int
) -> list[tuple[int, int | None, Any]]:
    """(step, version, values) of the run's learner series, by step, thinned to at most about
    `max_points` evenly spaced steps (a chart is a few hundred pixels wide)."""
    where = (MetricPoint.run_id == run_id, MetricPoint.source == "learner")
    n = int(
        session.execute(select(func.count()).select_from(MetricPoint).where(*where)).scalar_one()
    )
    query = select(MetricPoint.step, MetricPoint.version, MetricPoint.values).where(*where)
    stride = -(-n // max_points) if n > max_points else 1
    if stride > 1:
        query = query.where(MetricPoint.step % stride == 0)
    rows = session.execute(query.order_by(MetricPoint.step, MetricPoint.id)).all()
    return [(r[0], r[1], r[2]) for r in rows]


def recent_rewards(
    session: Session, run_ids: list[uuid.UUID], n: int
) -> dict[uuid.UUID, list[float]]:
    """The last `n` learner reward_mean values per run, oldest first (for sparklines)."""
    if not run_ids:
        return {}
    ranked = (
        select(
            MetricPoint.run_id,
            MetricPoint.step,
            MetricPoint.values,
            func.row_number()
            .over(partition_by=MetricPoint.run_id, order_by=MetricPoint.step.desc())
            .label("rn"),
        )
        .where(MetricPoint.run_id.in_(run_ids), MetricPoint.source == "learner")
        .subquery()
    )
    rows = session.execute(
        select(ranked.c.run_id, ranked.c.step, ranked.c["values"])
        .where(ranked.c.rn <= n)
        .order_by(ranked.c.run_id, ranked.c.step)
    ).all()
    out: dict[uuid.UUID, list[float]] = {}
    for run_id, _step, values in rows:
        value = (values or {}).get("reward_mean")
        if isinstance(value, int | float):
            out.setdefault(run_id, []).append(float(value))
    return out


def live_leases(session: Session, run_id: uuid.UUID, limit: int) -> list[Any]:
    """Active, unexpired leases of the run with their worker's name, newest first (then the
    worker's status and last contact, for its state)."""
    return list(
        session.execute(
            select(
                Lease.id,
                Worker.name,
                Lease.adapter_version,
                Lease.n_prompts,
                Lease.created_at,
                Lease.expires_at,
                Lease.last_heartbeat_at,
                Worker.status,
                Worker.last_seen_at,
            )
            .join(Worker, Worker.id == Lease.worker_id)
            .where(Lease.run_id == run_id, Lease.state == "active", Lease.expires_at > db_now())
            .order_by(Lease.created_at.desc())
            .limit(limit)
        ).all()
    )


def current_leases(session: Session) -> dict[uuid.UUID, tuple[uuid.UUID, uuid.UUID, str]]:
    """Per worker: its newest active lease as (lease id, run id, run name)."""
    rows = session.execute(
        select(Lease.worker_id, Lease.id, Lease.run_id, Run.name)
        .join(Run, Run.id == Lease.run_id)
        .where(Lease.state == "active", Lease.expires_at > db_now())
        .order_by(Lease.created_at)
    ).all()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def events(session: Session, run_id: uuid.UUID, limit: int) -> list[Event]:
    return list(
        session.execute(
            select(Event)
            .where(Event.run_id == run_id)
            .order_by(Event.created_at.desc(), Event.id.desc())
            .limit(limit)
        ).scalars()
    )


def run_age_seconds(session: Session, run_id: uuid.UUID) -> float:
    value = session.execute(
        select(epoch_seconds(db_now()) - epoch_seconds(Run.created_at)).where(Run.id == run_id)
    ).scalar_one_or_none()
    return float(value or 0.0)


def spend_over_time(session: Session, run_id: uuid.UUID, bucket_s: int) -> list[Any]:
    """(bucket, usd) of the run's cost records by the end of their period."""
    bucket = epoch_bucket(CostRecord.period_end, bucket_s)
    return list(
        session.execute(
            select(bucket, func.sum(CostRecord.usd))
            .where(CostRecord.run_id == run_id)
            .group_by(bucket)
            .order_by(bucket)
        ).all()
    )


# -- cost page ------------------------------------------------------------------------------


def spend_by_worker(session: Session) -> list[Any]:
    """(worker id, name, gpu_type, gpu_count, seconds, usd, usd on runs) per worker."""
    on_runs = func.sum(CostRecord.usd).filter(CostRecord.run_id.is_not(None))
    return list(
        session.execute(
            select(
                Worker.id,
                Worker.name,
                Worker.gpu_type,
                Worker.gpu_count,
                func.sum(CostRecord.seconds),
                func.sum(CostRecord.usd),
                func.coalesce(on_runs, 0.0),
            )
            .join(Worker, Worker.id == CostRecord.worker_id)
            .where(CostRecord.kind == "worker")
            .group_by(Worker.id, Worker.name, Worker.gpu_type, Worker.gpu_count)
            .order_by(func.sum(CostRecord.usd).desc())
        ).all()
    )


def spend_by_pool_learner(session: Session) -> list[Any]:
    """(pool learner id, name, gpu_type, seconds, usd, usd on runs) per pool learner."""
    on_runs = func.sum(CostRecord.usd).filter(CostRecord.run_id.is_not(None))
    return list(
        session.execute(
            select(
                PoolLearner.id,
                PoolLearner.name,
                PoolLearner.gpu_type,
                func.sum(CostRecord.seconds),
                func.sum(CostRecord.usd),
                func.coalesce(on_runs, 0.0),
            )
            .join(PoolLearner, PoolLearner.id == CostRecord.pool_learner_id)
            .where(CostRecord.kind == "pool_learner")
            .group_by(PoolLearner.id, PoolLearner.name, PoolLearner.gpu_type)
            .order_by(func.sum(CostRecord.usd).desc())
        ).all()
    )


def learner_spend(session: Session) -> tuple[float, float]:
    """(seconds, usd) of every run's learner."""
    row = session.execute(
        select(
            func.coalesce(func.sum(CostRecord.seconds), 0.0),
            func.coalesce(func.sum(CostRecord.usd), 0.0),
        ).where(CostRecord.kind == "learner")
    ).one()
    return float(row[0]), float(row[1])


def spend_by_kind(session: Session) -> list[Any]:
    """(run id, category, usd): worker spend on leases by server/runs/waste.py `spend_kind` —
    wasted (rejected, expired, aborted_stale) or on leases of a stopped run (stopped_run)."""
    kind = spend_kind()
    return list(
        session.execute(
            select(CostRecord.run_id, kind, func.sum(CostRecord.usd))
            .join(Lease, Lease.id == CostRecord.lease_id)
            .outerjoin(RolloutBatch, RolloutBatch.lease_id == Lease.id)
            .where(kind.is_not(None))
            .group_by(CostRecord.run_id, kind)
        ).all()
    )


def batch_samples_by_run(session: Session) -> list[Any]:
    """(run id, state, reject_reason, samples) over all batches."""
    return list(
        session.execute(
            select(
                RolloutBatch.run_id,
                RolloutBatch.state,
                RolloutBatch.reject_reason,
                func.sum(RolloutBatch.n_samples),
            ).group_by(RolloutBatch.run_id, RolloutBatch.state, RolloutBatch.reject_reason)
        ).all()
    )


def run_spend(session: Session) -> list[Any]:
    """Every run's id, name, status, spend and budget (read inside the stored config)."""
    return list(
        session.execute(
            select(
                Run.id,
                Run.name,
                Run.status,
                Run.spent_usd,
                config_number("budget_usd").label("budget_usd"),
            )
        ).all()
    )
