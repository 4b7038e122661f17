"""What a run measured, for the planner (`asyncgrpo plan --from-run`, the planner page's "fill
from a run"): the learner's trained tokens/s, each worker GPU type's generated tokens/s, the mean
completion length, the accepted fraction, and the run's group size and admission bound.

Over the batches uploaded in the last `window_s` seconds (database time):
- worker tokens/s, per worker: Σ completion tokens of its batches ÷ (its last upload − the
  start of its earliest lease among them): the rate it delivered, its concurrent leases
  included; per GPU type the mean over its workers.
- completion tokens per sample: Σ tokens ÷ Σ samples; accepted fraction: samples of batches not
  rejected ÷ all samples.
- learner tokens/s: the mean `tokens_per_s` of the learner's last 20 step points (completion
  tokens trained ÷ step time, learner/trainer.py).
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from protocol.run_config import RunConfig
from server.db import db_time
from server.models import Lease, MetricPoint, RolloutBatch, Run, Worker

LEARNER_POINTS = 20


@dataclass(frozen=True)
class Measured:
    run_name: str
    group_size: int
    bound_groups: int
    learner_tokens_per_s: float | None
    completion_tokens: float | None
    accept_fraction: float | None
    worker_tokens_per_s: dict[str, float] = field(default_factory=dict)


def _learner_rate(session: Session, run_id: uuid.UUID) -> float | None:
    rows = session.execute(
        select(MetricPoint.values)
        .where(MetricPoint.run_id == run_id, MetricPoint.source == "learner")
        .order_by(MetricPoint.step.desc(), MetricPoint.id.desc())
        .limit(LEARNER_POINTS)
    ).scalars()
    rates = [
        float(v["tokens_per_s"])
        for v in rows
        if isinstance(v.get("tokens_per_s"), int | float) and math.isfinite(v["tokens_per_s"])
    ]
    return sum(rates) / len(rates) if rates else None


def measure(session: Session, run_id: uuid.UUID, window_s: float = 600.0) -> Measured:
    """The run's figures (module docstring); LookupError for an unknown run."""
    run = session.get(Run, run_id)
    if run is None:
        raise LookupError(f"no run {run_id}")
    config = RunConfig.model_validate(run.config)
    since = db_time(session) - timedelta(seconds=window_s)
    rows = session.execute(
        select(
            RolloutBatch.worker_id,
            Worker.gpu_type,
            RolloutBatch.n_tokens,
            RolloutBatch.n_samples,
            RolloutBatch.state,
            RolloutBatch.created_at,
            Lease.created_at,
        )
        .join(Lease, Lease.id == RolloutBatch.lease_id)
        .join(Worker, Worker.id == RolloutBatch.worker_id)
        .where(RolloutBatch.run_id == run_id, RolloutBatch.created_at >= since)
    ).all()
    tokens = sum(r[2] for r in rows)
    samples = sum(r[3] for r in rows)
    accepted = sum(r[3] for r in rows if r[4] != "rejected")
    per_worker: dict[uuid.UUID, list[tuple[str, int, float, float]]] = defaultdict(list)
    for worker_id, gpu, n_tokens, _n, _state, uploaded, leased in rows:
        per_worker[worker_id].append((gpu, n_tokens, uploaded.timestamp(), leased.timestamp()))
    by_gpu: dict[str, list[float]] = defaultdict(list)
    for batches in per_worker.values():
        span = max(b[2] for b in batches) - min(b[3] for b in batches)
        if span > 0:
            by_gpu[batches[0][0]].append(sum(b[1] for b in batches) / span)
    return Measured(
        run_name=run.name,
        group_size=config.group_size,
        bound_groups=config.admission_bound_groups(),
        learner_tokens_per_s=_learner_rate(session, run_id),
        completion_tokens=tokens / samples if samples else None,
        accept_fraction=accepted / samples if samples else None,
        worker_tokens_per_s={gpu: sum(v) / len(v) for gpu, v in sorted(by_gpu.items())},
    )
