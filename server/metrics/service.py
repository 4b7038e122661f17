"""Prometheus gauges computed from the database on every scrape (no in-process state, so any
number of server processes answer the same figures)."""

from __future__ import annotations

import math
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from protocol.run_config import AlarmConfig
from server.db import db_time, transaction
from server.evals import repository as evals_repo
from server.jobs import stats
from server.models import Lease, PromptRow, Run, Worker
from server.runs.repository import config_number
from server.runs.waste import stale_waste
from server.workers.liveness import WORKER_STATES, worker_state
from server.workers.repository import price_table
from server.workers.service import effective_price

P = "asyncgrpo_"
DEFAULT_WINDOW_MINUTES = AlarmConfig.model_fields["window_minutes"].default
# Latest learner step figures of each running run: (metric name the learner posts, gauge, help).
LEARNER_GAUGES = (
    (
        "learner_busy",
        "run_learner_busy",
        "Learner: time in forward/backward/optimizer ÷ wall time since the previous step "
        "(latest step).",
    ),
    (
        "intake_wait_s",
        "run_learner_intake_wait_seconds",
        "Learner: wait for batches (latest step).",
    ),
    ("publish_s", "run_learner_publish_seconds", "Learner: publish time (latest step)."),
    (
        "padding_fraction",
        "run_learner_padding_fraction",
        "Learner: padded ÷ computed positions of the step's micro-batches (latest step).",
    ),
    (
        "peak_memory_bytes",
        "run_learner_peak_memory_bytes",
        "Learner: peak memory, CUDA allocator on GPU, process RSS on CPU (latest step).",
    ),
)


def _active_leases(session: Session, column: object) -> dict[uuid.UUID, int]:
    rows = session.execute(
        select(column, func.count()).where(Lease.state == "active").group_by(column)  # type: ignore[call-overload]
    ).all()
    return {r[0]: int(r[1]) for r in rows}


def run_metrics(session: Session) -> Iterator[Metric]:
    runs = session.execute(
        select(
            Run.id,
            Run.name,
            Run.status,
            Run.current_version,
            Run.groups_in_flight,
            Run.spent_usd,
            config_number("alarms", "window_minutes").label("window_minutes"),
            config_number("budget_usd").label("budget_usd"),
        ).order_by(Run.created_at)
    ).all()
    labels = ["run_id"]
    info = GaugeMetricFamily(
        P + "run_info",
        "Run (value 1) with its name and status.",
        labels=["run_id", "name", "status"],
    )
    version = GaugeMetricFamily(P + "run_current_version", "Last published version.", labels=labels)
    leases = GaugeMetricFamily(P + "run_leases_in_flight", "Active worker leases.", labels=labels)
    groups = GaugeMetricFamily(
        P + "run_groups_in_flight", "Groups leased, accepted or claimed.", labels=labels
    )
    waste = GaugeMetricFamily(
        P + "run_stale_waste_ratio",
        "(Samples rejected stale + in leases aborted as stale) / samples generated, "
        "over the run's alarm window.",
        labels=labels,
    )
    generated = GaugeMetricFamily(
        P + "run_samples_generated_window",
        "Samples generated over the run's alarm window.",
        labels=labels,
    )
    clip = GaugeMetricFamily(
        P + "run_clip_fraction", "Latest learner clip fraction.", labels=labels
    )
    spent = GaugeMetricFamily(P + "run_spent_usd", "Spend attributed to the run.", labels=labels)
    budget = GaugeMetricFamily(P + "run_budget_usd", "The run's budget.", labels=labels)
    learner = {
        name: GaugeMetricFamily(P + gauge, text, labels=labels)
        for name, gauge, text in LEARNER_GAUGES
    }
    in_flight = _active_leases(session, Lease.run_id)
    for run in runs:
        rid = str(run.id)
        info.add_metric([rid, run.name, run.status], 1)
        version.add_metric([rid], run.current_version)
        leases.add_metric([rid], in_flight.get(run.id, 0))
        groups.add_metric([rid], run.groups_in_flight)
        window_minutes = (
            run.window_minutes if run.window_minutes is not None else DEFAULT_WINDOW_MINUTES
        )
        w = stale_waste(session, run.id, window_minutes * 60)
        waste.add_metric([rid], w.ratio)
        generated.add_metric([rid], w.generated)
        latest = stats.latest_learner_values(session, run.id) or {}
        value = stats.clip_fraction_of(latest)
        if value is not None:
            clip.add_metric([rid], value)
        if run.status == "running":
            _add_learner_figures(learner, rid, latest)
        spent.add_metric([rid], run.spent_usd)
        if run.budget_usd is not None:
            budget.add_metric([rid], run.budget_usd)
    yield from (info, version, leases, groups, waste, generated, clip, spent, budget)
    yield from learner.values()
    yield from _run_breakdowns(session)
    yield from _run_evals(session)


EVAL_GAUGES = (
    ("version", "run_eval_version", "The latest evaluated version (0: the base model)."),
    ("accuracy", "run_eval_accuracy", "Eval accuracy of the latest evaluated version."),
    ("mean_reward", "run_eval_mean_reward", "Eval mean reward of the latest evaluated version."),
    ("pass_at_n", "run_eval_pass_at_n", "Eval pass@n of the latest evaluated version."),
)


def _run_evals(session: Session) -> Iterator[Metric]:
    """Per run with an evaluated version: the latest one's version and figures."""
    families = {
        field: GaugeMetricFamily(P + gauge, text, labels=["run_id"])
        for field, gauge, text in EVAL_GAUGES
    }
    for row in evals_repo.latest_done(session):
        for field, family in families.items():
            value = getattr(row, field)
            if value is not None:
                family.add_metric([str(row.run_id)], float(value))
    yield from families.values()


def _add_learner_figures(
    families: dict[str, GaugeMetricFamily], run_id: str, latest: Mapping[str, Any]
) -> None:
    for name, family in families.items():
        value = latest.get(name)
        if isinstance(value, int | float) and math.isfinite(value):
            family.add_metric([run_id], float(value))


def _run_breakdowns(session: Session) -> Iterator[Metric]:
    rejected = CounterMetricFamily(
        P + "run_rejected_batches", "Rejected batches by reason.", labels=["run_id", "reason"]
    )
    rejected_samples = CounterMetricFamily(
        P + "run_rejected_samples",
        "Samples in rejected batches by reason.",
        labels=["run_id", "reason"],
    )
    for run_id, reason, batches, samples in stats.rejections_by_reason(session):
        rejected.add_metric([str(run_id), reason], batches)
        rejected_samples.add_metric([str(run_id), reason], samples)
    mean = GaugeMetricFamily(
        P + "run_staleness_mean",
        "Mean staleness at claim of the batches uploaded in the last 10 minutes.",
        labels=["run_id"],
    )
    peak = GaugeMetricFamily(
        P + "run_staleness_max",
        "Largest staleness at claim of the batches uploaded in the last 10 minutes.",
        labels=["run_id"],
    )
    for run_id, (avg, top) in stats.staleness(session, 600.0).items():
        mean.add_metric([str(run_id)], avg)
        peak.add_metric([str(run_id)], top)
    rows = GaugeMetricFamily(
        P + "run_prompt_rows", "Prompt rows by state.", labels=["run_id", "state"]
    )
    for run_id, state, count in session.execute(
        select(PromptRow.run_id, PromptRow.state, func.count()).group_by(
            PromptRow.run_id, PromptRow.state
        )
    ).all():
        rows.add_metric([str(run_id), state], int(count))
    yield from (rejected, rejected_samples, mean, peak, rows)


def model_label(model: str) -> str:
    """`model` as a Kubernetes label value (an HPA's metric selector cannot name
    `Qwen/Qwen2.5-7B`): characters outside [A-Za-z0-9_.-] become `_`, at most 63, alphanumeric
    at both ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "_", model)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def admissible_metrics(session: Session) -> Iterator[Metric]:
    """Per served model, over its running runs: the groups they would still admit now,
    Σ min(admission bound − groups in flight, queued prompt rows), and their groups in flight.
    The sum of the two is the work a fleet of that model's workers could hold at once: what an
    autoscaler scales workers on (docs/guides/fleet.md, "Run a fleet of spot workers")."""
    labels = ["model", "model_label"]
    admissible = GaugeMetricFamily(
        P + "admissible_groups",
        "Groups the running runs of a model would admit now: sum over runs of min(admission "
        "bound - groups in flight, queued prompt rows); 0 for a model with no running run.",
        labels=labels,
    )
    in_flight = GaugeMetricFamily(
        P + "model_groups_in_flight",
        "Groups leased, accepted or claimed in the running runs of a model.",
        labels=labels,
    )
    bound = (
        (config_number("max_staleness") + 1)
        * config_number("weight_sync_steps")
        * config_number("prompts_per_step")
    )
    runs = session.execute(
        select(
            Run.id,
            Run.base_model,
            Run.status,
            Run.groups_in_flight,
            bound.label("bound"),
            Run.config["admission_control"].as_boolean().label("admission"),
        )
    ).all()
    queued: dict[uuid.UUID, int] = {
        r[0]: int(r[1])
        for r in session.execute(
            select(PromptRow.run_id, func.count())
            .where(PromptRow.state == "queued")
            .group_by(PromptRow.run_id)
        ).all()
    }
    room: dict[str, int] = {}
    held: dict[str, int] = {}
    for run in runs:
        room.setdefault(run.base_model, 0)
        held.setdefault(run.base_model, 0)
        if run.status != "running":
            continue
        rows = queued.get(run.id, 0)
        free = int(run.bound) - run.groups_in_flight if run.admission else rows
        room[run.base_model] += max(0, min(free, rows))
        held[run.base_model] += run.groups_in_flight
    for model in sorted(room):
        admissible.add_metric([model, model_label(model)], room[model])
        in_flight.add_metric([model, model_label(model)], held[model])
    yield from (admissible, in_flight)


def worker_metrics(session: Session, silent_s: float) -> Iterator[Metric]:
    now = db_time(session)
    table = price_table(session)
    labels = ["worker_id"]
    info = GaugeMetricFamily(
        P + "worker_info",
        "Worker (value 1) with name, GPU, stored status and derived state.",
        labels=["worker_id", "name", "gpu_type", "status", "state"],
    )
    seen = GaugeMetricFamily(
        P + "worker_last_seen_timestamp_seconds",
        "Unix time the worker last called the API.",
        labels=labels,
    )
    age = GaugeMetricFamily(
        P + "worker_last_seen_age_seconds",
        "Seconds since the worker last called the API (database time).",
        labels=labels,
    )
    leases = GaugeMetricFamily(P + "worker_leases_in_flight", "Active leases.", labels=labels)
    price = GaugeMetricFamily(P + "worker_price_per_hour", "Effective USD/hour.", labels=labels)
    by_state = GaugeMetricFamily(
        P + "workers",
        "Workers by derived state: online, offline (silent past the silence threshold), "
        "quarantined, revoked.",
        labels=["state"],
    )
    counts = dict.fromkeys(WORKER_STATES, 0)
    in_flight = _active_leases(session, Lease.worker_id)
    for worker in session.execute(select(Worker).order_by(Worker.created_at)).scalars():
        wid = str(worker.id)
        state = worker_state(worker.status, worker.last_seen_at, now, silent_s)
        counts[state] += 1
        info.add_metric([wid, worker.name, worker.gpu_type, worker.status, state], 1)
        if worker.last_seen_at is not None:
            seen.add_metric([wid], worker.last_seen_at.timestamp())
            age.add_metric([wid], max((now - worker.last_seen_at).total_seconds(), 0.0))
        leases.add_metric([wid], in_flight.get(worker.id, 0))
        price.add_metric([wid], effective_price(worker, table))
    for state, n in counts.items():
        by_state.add_metric([state], n)
    yield from (info, by_state, seen, age, leases, price)


class DatabaseCollector(Collector):
    """Collects every family in one read-only transaction per scrape."""

    def __init__(self, factory: sessionmaker[Session], worker_silent_s: float) -> None:
        self._factory = factory
        self._worker_silent_s = worker_silent_s

    def collect(self) -> Iterable[Metric]:
        with transaction(self._factory) as session:
            families = [
                *run_metrics(session),
                *admissible_metrics(session),
                *worker_metrics(session, self._worker_silent_s),
            ]
        return families


class WorkerCallCollector(Collector):
    """Worker calls this server process answered, by call (acquire counts each long-poll try,
    the batch heartbeat each lease).

    The counts live in this process, and under `--workers N` a scrape reaches any one of the N:
    the `pid` label keeps each process's counter its own series (without it Prometheus would
    read the alternation as counter resets); `sum without (pid)` gives the server's total."""

    def __init__(self, counts: Mapping[str, int], pid: int | None = None) -> None:
        self._counts = counts
        self._pid = str(os.getpid() if pid is None else pid)

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "asyncgrpo_worker_calls",
            "Worker calls answered by this server process (pid), by call.",
            labels=["call", "pid"],
        )
        for call, count in sorted(self._counts.items()):
            family.add_metric([call, self._pid], count)
        yield family
