"""The cost page: spend per run and per worker, per accepted sample, wasted spend and the spend
on leases of stopped runs (server/runs/waste.py: the latter is not waste), and the saving
against the on-demand price table (settings.dashboard.on_demand_prices)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from server.dashboard import repository as repo
from server.learner.telemetry import AFTER_ACCEPTANCE
from server.runs.waste import STOPPED_RUN_SPEND, WASTED_SPEND_KINDS


@dataclass
class RunCost:
    id: uuid.UUID
    name: str
    status: str
    spent_usd: float
    budget_usd: float | None
    accepted_samples: int
    wasted: dict[str, float] = field(default_factory=dict)  # by WASTED_SPEND_KINDS
    stopped_run_usd: float = 0.0

    @property
    def per_sample(self) -> float | None:
        return self.spent_usd / self.accepted_samples if self.accepted_samples else None


@dataclass(frozen=True)
class WorkerCost:
    id: uuid.UUID
    name: str
    gpu: str
    hours: float
    usd: float
    usd_on_runs: float
    on_demand_usd: float | None

    @property
    def saving(self) -> float | None:
        return None if self.on_demand_usd is None else self.on_demand_usd - self.usd


@dataclass(frozen=True)
class PoolLearnerCost:
    """A pool learner's spend: its time on the runs it held, and idle (holding none)."""

    id: uuid.UUID
    name: str
    gpu: str
    hours: float
    usd: float
    usd_on_runs: float


@dataclass(frozen=True)
class CostPage:
    runs: list[RunCost]
    workers: list[WorkerCost]
    learner_usd: float  # per-run learners and pool learners
    pool_learners: list[PoolLearnerCost]
    total_usd: float
    wasted_usd: dict[str, float]  # by WASTED_SPEND_KINDS
    stopped_run_usd: float
    on_demand_usd: float
    compared_usd: float

    @property
    def saving(self) -> float:
        return self.on_demand_usd - self.compared_usd


def on_demand_price(table: dict[str, float], gpu_type: str, gpu_count: int) -> float | None:
    """USD/h of the same GPUs on demand (type matched case-insensitively), or None."""
    prices = {k.lower(): v for k, v in table.items()}
    price = prices.get(gpu_type.lower())
    return None if price is None else price * max(gpu_count, 1)


def accepted_samples(rows: list[tuple[uuid.UUID, str, str | None, int]]) -> dict[uuid.UUID, int]:
    """Samples in batches that passed `complete` (learner.telemetry's rule: later rejections
    at claim or by the learner still count as accepted)."""
    out: dict[uuid.UUID, int] = defaultdict(int)
    for run_id, state, reason, samples in rows:
        if state != "rejected" or reason in AFTER_ACCEPTANCE:
            out[run_id] += int(samples or 0)
    return out


def cost_page(session: Session, prices: dict[str, float]) -> CostPage:
    accepted = accepted_samples(repo.batch_samples_by_run(session))
    runs = {
        r.id: RunCost(
            r.id,
            r.name,
            r.status,
            r.spent_usd,
            r.budget_usd,
            accepted.get(r.id, 0),
        )
        for r in repo.run_spend(session)
    }
    wasted: dict[str, float] = dict.fromkeys(WASTED_SPEND_KINDS, 0.0)
    stopped = 0.0
    for run_id, kind, usd in repo.spend_by_kind(session):
        run, usd = runs.get(run_id), float(usd or 0.0)
        if kind == STOPPED_RUN_SPEND:
            stopped += usd
            if run is not None:
                run.stopped_run_usd += usd
            continue
        wasted[kind] += usd
        if run is not None:
            run.wasted[kind] = run.wasted.get(kind, 0.0) + usd
    workers = []
    on_demand = compared = 0.0
    for wid, name, gpu_type, count, seconds, usd, on_runs in repo.spend_by_worker(session):
        price = on_demand_price(prices, gpu_type, count)
        od = None if price is None else float(seconds or 0.0) / 3600 * price
        if od is not None:
            on_demand += od
            compared += float(usd or 0.0)
        workers.append(
            WorkerCost(
                wid,
                name,
                f"{count}× {gpu_type}",
                float(seconds or 0.0) / 3600,
                float(usd or 0.0),
                float(on_runs or 0.0),
                od,
            )
        )
    pool_learners = [
        PoolLearnerCost(
            pid, name, gpu_type or "—", float(seconds or 0.0) / 3600, float(usd or 0.0),
            float(on_runs or 0.0),
        )
        for pid, name, gpu_type, seconds, usd, on_runs in repo.spend_by_pool_learner(session)
    ]  # fmt: skip
    _, per_run_learner_usd = repo.learner_spend(session)
    learner_usd = per_run_learner_usd + sum(p.usd for p in pool_learners)
    ordered = sorted(runs.values(), key=lambda r: r.spent_usd, reverse=True)
    return CostPage(
        runs=ordered,
        workers=workers,
        learner_usd=learner_usd,
        pool_learners=pool_learners,
        total_usd=sum(w.usd for w in workers) + learner_usd,
        wasted_usd=wasted,
        stopped_run_usd=stopped,
        on_demand_usd=on_demand,
        compared_usd=compared,
    )
