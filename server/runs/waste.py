"""The waste vocabulary (docs/architecture/contract.md, invariant 16): stale waste, the drift
alarm's figure, used by the alarm job, Prometheus, the dashboard's banner and chart, the API's
proxy stats and the benchmarks; and the cost page's spend categories (`spend_kind`).

    stale waste = (samples in batches rejected `stale` + samples of leases aborted as stale)
                  ÷ (samples in every uploaded batch + samples of those stale-aborted leases)

A lease aborted because its run paused, was cancelled or completed produced nothing that was
too old: it is not waste. The same figure in worker-seconds: generation time of the
stale-rejected batches plus the lifetime of the stale-aborted leases, over the generation time
of every batch plus that lifetime. Windows and buckets are in database time.

Spend (the cost page): worker spend on a lease whose work was lost is *wasted spend*, by cause —
`rejected` (its batch was rejected), `expired` (the lease ran out of TTL), `aborted_stale`
(aborted as stale) or `worker_revoked` (ended because its worker was revoked). Spend on a lease
aborted because its run stopped (paused, out of budget, cancelled, completed) is not waste: it
is *stopped-run spend*, a separate figure."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, select
from sqlalchemy.orm import Session

from server.db_types import db_now_plus, epoch_bucket, epoch_seconds
from server.models import Lease, RolloutBatch

STALE = "stale"
# The end reason of a revoked worker's leases (server/leases/expiry.py ends them so), here
# because runs sit below leases in the feature order.
REVOKED = "revoked"
# How a stale-aborted lease shows among the rejection reasons of the dashboard's chart and
# among the wasted spend's causes.
ABORTED_STALE = "aborted_stale"
WORKER_REVOKED = "worker_revoked"
WASTED_SPEND_KINDS = ("rejected", "expired", ABORTED_STALE, WORKER_REVOKED)
STOPPED_RUN_SPEND = "stopped_run"  # spend on leases aborted because their run stopped


# Stale waste is a training figure: which batches are training's is the work ledger's rule
# (server/leases/ledger.py trained), above runs in the feature order, so the composition root
# hands it in (server/wiring.py).
KindTest = Callable[[Any], ColumnElement[bool]]
_batch_kinds: list[KindTest] = []


def count_batches_with(test: KindTest) -> None:
    _batch_kinds[:] = [test]


def _counted() -> ColumnElement[bool]:
    """The batches stale waste counts: the kinds the learner trains on (eval's never stale)."""
    if not _batch_kinds:
        raise RuntimeError("no batch kind test: call server.wiring.wire() at start")
    return _batch_kinds[0](RolloutBatch.kind)


def _stale_aborted(run_id: uuid.UUID) -> ColumnElement[bool]:
    return and_(Lease.run_id == run_id, Lease.state == "aborted", Lease.end_reason == STALE)


_LEASE_SAMPLES = Lease.n_prompts * Lease.group_size
_LEASE_SECONDS = epoch_seconds(Lease.ended_at) - epoch_seconds(Lease.created_at)
_STALE_BATCH = RolloutBatch.reject_reason == STALE


@dataclass(frozen=True)
class Waste:
    """Samples (and worker-seconds) generated, and of them wasted by staleness."""

    batch_samples: int = 0
    stale_rejected: int = 0
    stale_aborted: int = 0
    batch_seconds: float = 0.0
    stale_rejected_seconds: float = 0.0
    stale_aborted_seconds: float = 0.0

    @property
    def generated(self) -> int:
        return self.batch_samples + self.stale_aborted

    @property
    def wasted(self) -> int:
        return self.stale_rejected + self.stale_aborted

    @property
    def ratio(self) -> float:
        return self.wasted / self.generated if self.generated else 0.0

    @property
    def worker_seconds(self) -> float:
        return self.batch_seconds + self.stale_aborted_seconds

    @property
    def wasted_worker_seconds(self) -> float:
        return self.stale_rejected_seconds + self.stale_aborted_seconds


def stale_waste(session: Session, run_id: uuid.UUID, window_s: float | None = None) -> Waste:
    """The run's stale waste over the last `window_s` seconds (None: the whole run); a training
    figure: eval batches (never stale) are not counted."""
    batch_where: list[Any] = [RolloutBatch.run_id == run_id, _counted()]
    lease_where: list[Any] = [_stale_aborted(run_id)]
    if window_s is not None:
        since = db_now_plus(-float(window_s))
        batch_where.append(RolloutBatch.created_at >= since)
        lease_where.append(Lease.ended_at >= since)
    seconds = func.coalesce(RolloutBatch.generation_seconds, 0.0)
    batches = session.execute(
        select(
            func.coalesce(func.sum(RolloutBatch.n_samples), 0),
            func.coalesce(func.sum(RolloutBatch.n_samples).filter(_STALE_BATCH), 0),
            func.coalesce(func.sum(seconds), 0.0),
            func.coalesce(func.sum(seconds).filter(_STALE_BATCH), 0.0),
        ).where(*batch_where)
    ).one()
    leases = session.execute(
        select(
            func.coalesce(func.sum(_LEASE_SAMPLES), 0),
            func.coalesce(func.sum(_LEASE_SECONDS), 0.0),
        ).where(*lease_where)
    ).one()
    return Waste(
        batch_samples=int(batches[0]),
        stale_rejected=int(batches[1]),
        stale_aborted=int(leases[0]),
        batch_seconds=float(batches[2]),
        stale_rejected_seconds=float(batches[3]),
        stale_aborted_seconds=float(leases[1]),
    )


@dataclass
class WasteSeries:
    """The run's waste per time bucket (bucket index × bucket_s = Unix seconds), and its
    rejected samples by reason per bucket (stale-aborted leases as `aborted_stale`)."""

    generated: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    wasted: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    rejected: dict[str, dict[int, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int))
    )

    def ratio(self, bucket: int) -> float:
        generated = self.generated.get(bucket, 0)
        return self.wasted.get(bucket, 0) / generated if generated else 0.0


def stale_waste_series(session: Session, run_id: uuid.UUID, bucket_s: int) -> WasteSeries:
    """The figure of stale_waste per bucket of `bucket_s` seconds: batches by their creation,
    stale-aborted leases by their end."""
    series = WasteSeries()
    bucket = epoch_bucket(RolloutBatch.created_at, bucket_s)
    for at, reason, samples in session.execute(
        select(bucket, RolloutBatch.reject_reason, func.sum(RolloutBatch.n_samples))
        .where(RolloutBatch.run_id == run_id, _counted())
        .group_by(bucket, RolloutBatch.reject_reason)
    ).all():
        series.generated[at] += int(samples or 0)
        if reason is not None:
            series.rejected[reason][at] += int(samples or 0)
        if reason == STALE:
            series.wasted[at] += int(samples or 0)
    ended = epoch_bucket(Lease.ended_at, bucket_s)
    for at, samples in session.execute(
        select(ended, func.sum(_LEASE_SAMPLES)).where(_stale_aborted(run_id)).group_by(ended)
    ).all():
        series.generated[at] += int(samples or 0)
        series.wasted[at] += int(samples or 0)
        series.rejected[ABORTED_STALE][at] += int(samples or 0)
    return series


@dataclass(frozen=True)
class Samples:
    """Samples generated and, of them, wasted by staleness (the figure's two terms)."""

    generated: int = 0
    wasted: int = 0

    @property
    def ratio(self) -> float:
        return self.wasted / self.generated if self.generated else 0.0


def stale_samples_by_version(
    session: Session, run_ids: list[uuid.UUID]
) -> dict[uuid.UUID, dict[int, Samples]]:
    """The terms of stale_waste per run and adapter version (the version that generated the
    samples): batches and stale-aborted leases by their adapter_version, in two statements."""
    if not run_ids:
        return {}
    terms: dict[tuple[uuid.UUID, int], list[int]] = defaultdict(lambda: [0, 0])
    connection = session.connection()
    stale = func.coalesce(func.sum(RolloutBatch.n_samples).filter(_STALE_BATCH), 0)
    for run_id, version, samples, rejected in connection.execute(
        select(
            RolloutBatch.run_id,
            RolloutBatch.adapter_version,
            func.coalesce(func.sum(RolloutBatch.n_samples), 0),
            stale,
        )
        .where(RolloutBatch.run_id.in_(run_ids), _counted())
        .group_by(RolloutBatch.run_id, RolloutBatch.adapter_version)
    ):
        terms[(run_id, version)][0] += int(samples)
        terms[(run_id, version)][1] += int(rejected)
    for run_id, version, samples in connection.execute(
        select(Lease.run_id, Lease.adapter_version, func.sum(_LEASE_SAMPLES))
        .where(Lease.run_id.in_(run_ids), Lease.state == "aborted", Lease.end_reason == STALE)
        .group_by(Lease.run_id, Lease.adapter_version)
    ):
        terms[(run_id, version)][0] += int(samples or 0)
        terms[(run_id, version)][1] += int(samples or 0)
    out: dict[uuid.UUID, dict[int, Samples]] = defaultdict(dict)
    for (run_id, version), (generated, wasted) in terms.items():
        out[run_id][version] = Samples(generated, wasted)
    return dict(out)


def spend_kind() -> ColumnElement[str | None]:
    """The spend category of a lease's cost (over leases outer-joined to their batch): one of
    WASTED_SPEND_KINDS, STOPPED_RUN_SPEND, or None (the spend produced a usable batch, or the
    lease was released or is still active)."""
    return case(
        (RolloutBatch.state == "rejected", "rejected"),
        (Lease.state == "expired", "expired"),
        (and_(Lease.state == "aborted", Lease.end_reason == STALE), ABORTED_STALE),
        (and_(Lease.state == "aborted", Lease.end_reason == REVOKED), WORKER_REVOKED),
        (Lease.state == "aborted", STOPPED_RUN_SPEND),
        else_=None,
    )
