"""Learner metrics, spot checks (worker trust) and the admin read of a run's learner and proxy
series. Proxy figures are computed on read from batches and leases."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from protocol.schemas_learner import (
    MetricsAccepted,
    MetricsRequest,
    SpotCheckRequest,
    SpotCheckResponse,
)
from server.config import Settings
from server.errors import NotFound, Unprocessable
from server.events.service import raise_event
from server.learner import repository as repo
from server.learner.schemas import LearnerPoint, ProxyStats, RunMetrics
from server.learner.service import fence, run_config
from server.models import Token
from server.runs.waste import stale_waste
from server.workers import repository as workers

# Rejections made after a batch was accepted (at claim, by the learner, or at completion).
AFTER_ACCEPTANCE = frozenset(
    {
        "stale",
        "checksum",
        "invalid",
        "prompt_mismatch",
        "spot_check",
        "reward_error",
        "env_mismatch",
        "run_completed",
    }
)


def record_metrics(
    session: Session, settings: Settings, token: Token, run_id: uuid.UUID, body: MetricsRequest
) -> MetricsAccepted:
    # A learner may flush its last points right after the final publish completed the run.
    fence(session, settings, token, run_id, body.fencing, live_run=False)
    points = [p.model_dump() for p in body.points]
    return MetricsAccepted(stored=repo.insert_metric_points(session, run_id, "learner", points))


def spot_check(
    session: Session,
    settings: Settings,
    token: Token,
    run_id: uuid.UUID,
    body: SpotCheckRequest,
) -> SpotCheckResponse:
    """Record one re-scored batch in the worker's running mean; quarantine the worker (no more
    leases) with an event when this check or the running mean is above the run's threshold."""
    fence(session, settings, token, run_id, body.fencing)
    batch = repo.get_batch(session, run_id, body.batch_id)
    if batch is None:
        raise NotFound("batch not found", code=ErrorCode.batch_not_found)
    if batch.worker_id != body.worker_id:
        raise Unprocessable(
            "the batch was not made by this worker",
            field="worker_id",
            code=ErrorCode.batch_of_another_worker,
        )
    row = workers.record_spot_check(session, body.worker_id, body.mean_abs_logprob_diff)
    if row is None:
        raise NotFound("worker not found", code=ErrorCode.worker_not_found)
    status, checks, mean = row
    threshold = run_config(session, run_id).alarms.spot_check_mismatch
    quarantined = False
    if max(body.mean_abs_logprob_diff, mean) > threshold:
        reason = (
            f"spot check mean |Δ log-prob| {body.mean_abs_logprob_diff:.4g} "
            f"(running mean {mean:.4g}) above the threshold {threshold:.4g}"
        )
        quarantined = workers.quarantine(session, body.worker_id, reason)
        if quarantined:
            status = "quarantined"
            raise_event(
                session,
                run_id=run_id,
                worker_id=body.worker_id,
                kind="worker_quarantined",
                severity="critical",
                message=reason,
                data={
                    "batch_id": str(body.batch_id),
                    "mean_abs_logprob_diff": body.mean_abs_logprob_diff,
                    "kl": body.kl,
                    "n_tokens": body.n_tokens,
                    "running_mean": mean,
                    "threshold": threshold,
                },
            )
    return SpotCheckResponse(
        worker_id=body.worker_id,
        worker_status=status,
        spot_checks=checks,
        spot_check_mismatch=mean,
        quarantined=quarantined,
    )


def proxy_stats(session: Session, run_id: uuid.UUID) -> ProxyStats:
    by_state: dict[str, int] = defaultdict(int)
    rejected: dict[str, int] = defaultdict(int)
    histogram: dict[int, int] = defaultdict(int)
    per_version: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for version, state, reason, staleness, n, n_samples in repo.batch_stats(session, run_id):
        by_state[state] += n
        per_version[version]["batches"] += n
        per_version[version]["samples"] += n_samples
        per_version[version][state] += n
        if state == "rejected":
            rejected[reason or "unknown"] += n
        if state == "consumed" and staleness is not None:
            histogram[staleness] += n
    waste = stale_waste(session, run_id)
    # Every batch that passed `complete` was accepted, whatever happened to it afterwards.
    accepted = sum(n for s, n in by_state.items() if s != "rejected") + sum(
        n for r, n in rejected.items() if r in AFTER_ACCEPTANCE
    )
    return ProxyStats(
        batches_by_state=dict(by_state),
        batches_accepted=accepted,
        rejected_by_reason=dict(rejected),
        samples_generated=waste.generated,
        samples_rejected_stale=waste.stale_rejected,
        samples_aborted=waste.stale_aborted,
        stale_waste=waste.ratio,
        staleness_histogram={str(k): v for k, v in sorted(histogram.items())},
        by_adapter_version=[
            {"adapter_version": v, **counts} for v, counts in sorted(per_version.items())
        ],
    )


def _points(session: Session, run_id: uuid.UUID, source: str, since: int | None) -> list[Any]:
    return [
        LearnerPoint(step=p.step, version=p.version, values=p.values, created_at=p.created_at)
        for p in repo.metric_points(session, run_id, source, since)
    ]


def run_metrics(session: Session, run_id: uuid.UUID, since_step: int | None) -> RunMetrics:
    run = repo.get_run(session, run_id)
    if run is None:
        raise NotFound("run not found", code=ErrorCode.run_not_found)
    return RunMetrics(
        run_id=run_id,
        current_version=run.current_version,
        learner=_points(session, run_id, "learner", since_step),
        proxy_points=_points(session, run_id, "proxy", since_step),
        proxy=proxy_stats(session, run_id),
    )
