"""What the run pages show, assembled from the services that own each figure:
runs.service (status, live stats, spend), jobs.alarms/jobs.stats (stale waste, clip fraction,
entropy, zero-advantage share —
the alarm's own readings), learner.telemetry (proxy stats, staleness histogram),
learner.ledger (the prompt ledger), adapters.service (versions). Series over time come from
dashboard.repository, the one place they are computed; the drift banner's advice from
dashboard.symptoms, the table the docs' symptom page is rendered from."""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, get_args

from sqlalchemy.orm import Session

from protocol.environments import worker_can_run
from protocol.run_config import RunConfig
from protocol.trajectories import StopReason
from server.adapters import service as adapters
from server.dashboard import repository as repo
from server.dashboard.symptoms import BY_ALARM, NO_WORKER_CAN_SERVE
from server.db import db_time
from server.evals import repository as evals_repo
from server.jobs import alarms, stats
from server.learner import telemetry
from server.learner.ledger import ledger_model
from server.models import Run
from server.runs import lifecycle
from server.runs import service as runs
from server.runs.waste import stale_waste_series
from server.workers import repository as workers_repo
from server.workers.liveness import worker_state

DRIFT_KINDS = ("stale_waste", "clip_fraction", "entropy", "zero_advantage")
SPARK_POINTS = 30
LIVE_LEASES_SHOWN = 50
EVENTS_SHOWN = 50
CHART_BUCKETS = 60
CHART_POINTS = 1000
GIB = float(1 << 30)


@dataclass(frozen=True)
class Drift:
    kind: str
    value: float
    threshold: float
    message: str
    meaning: str  # what it usually means, and the settings that change it: symptoms.py
    settings: tuple[str, ...]


@dataclass(frozen=True)
class RunRow:
    run: Run
    config: RunConfig
    spark: str
    stale_waste: float
    drift: list[Drift]


def sparkline(values: list[float], width: int = 120, height: int = 24) -> str:
    """SVG polyline points for the values (empty when fewer than two)."""
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / (len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - 2 - (v - low) / span * (height - 4):.1f}"
        for i, v in enumerate(values)
    )


def drift_of(session: Session, run: Run, now: Any) -> tuple[float, list[Drift]]:
    """The run's stale waste and its drift alarms that are over threshold now — the alarm
    job's own readings (jobs.alarms.run_readings), so the banner and the events agree."""
    waste = 0.0
    firing: list[Drift] = []
    for reading in alarms.run_readings(session, run, now):
        if reading.kind == "stale_waste":
            waste = reading.value
        if reading.kind in DRIFT_KINDS and reading.firing and run.status not in lifecycle.TERMINAL:
            firing.append(
                Drift(
                    reading.kind,
                    reading.value,
                    reading.threshold,
                    reading.message,
                    BY_ALARM[reading.kind].meaning,
                    BY_ALARM[reading.kind].settings,
                )
            )
    return waste, firing


def run_rows(
    session: Session, status: str | None, project_id: uuid.UUID | None = None
) -> list[RunRow]:
    """The runs page's rows, newest first: of one status and one project when given."""
    listed = runs.list_runs(session, status, 200, 0, project_id)
    sparks = repo.recent_rewards(session, [r.id for r in listed], SPARK_POINTS)
    now = db_time(session)
    rows = []
    for out in listed:
        run = runs.get_run(session, out.id)
        waste, drift = drift_of(session, run, now)
        rows.append(
            RunRow(run, runs.get_config(run), sparkline(sparks.get(run.id, [])), waste, drift)
        )
    return rows


def run_live(session: Session, run_id: uuid.UUID, silent_s: float) -> dict[str, Any]:
    """Everything the run page's live fragment shows; a lease's worker with its derived state
    (server/workers/liveness.py, silent past `silent_s` = offline)."""
    run = runs.get_run(session, run_id)
    detail = runs.detail(session, run, silent_s)
    now = db_time(session)
    waste, drift = drift_of(session, run, now)
    latest = stats.latest_learner_values(session, run_id) or {}
    return {
        "run": run,
        "detail": detail,
        "config": runs.get_config(run),
        "actions": lifecycle.admin_actions_from(run.status),
        "stale_waste": waste,
        "drift": drift,
        "clip_fraction": stats.clip_fraction_of(latest) if latest else None,
        "latest": latest,
        "learner_busy": _num(latest, "learner_busy"),
        "peak_memory_gib": _scaled(latest, "peak_memory_bytes", 1.0 / GIB),
        "proxy": telemetry.proxy_stats(session, run_id),
        "ledger": ledger_model(session, run_id),
        "adapters": adapters.list_versions(session, run_id),
        "leases": [
            (*row[:7], worker_state(row.status, row.last_seen_at, now, silent_s))
            for row in repo.live_leases(session, run_id, LIVE_LEASES_SHOWN)
        ],
        "events": repo.events(session, run_id, EVENTS_SHOWN),
        "environment_workers": environment_workers(session, run, now, silent_s),
        "serving_advice": NO_WORKER_CAN_SERVE,
    }


def environment_workers(session: Session, run: Run, now: Any, silent_s: float) -> tuple[int, int]:
    """(online workers of the run's base model that can run its environment, online workers
    of its base model): a run whose environment no online worker declared waits."""
    config = runs.get_config(run)
    serving = [
        w
        for w in workers_repo.list_all(session)
        if run.base_model in (w.models or [])
        and worker_state(w.status, w.last_seen_at, now, silent_s) == "online"
    ]
    able = [w for w in serving if worker_can_run(config.environment, w.environments, w.trusted)]
    return len(able), len(serving)


# -- chart data ------------------------------------------------------------------------------


def _num(values: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = values.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value)
    return None


# (chart key, [(metric name, scale)]) of the learner series charted per step; a point that
# lacks a name (a learner that does not report it) leaves a gap.
STEP_SERIES: dict[str, list[tuple[str, float]]] = {
    "clip": [("clip_low", 1.0), ("clip_high", 1.0)],
    "ratio": [("ratio_min", 1.0), ("ratio_mean", 1.0), ("ratio_max", 1.0)],
    "tokens": [("tokens_per_s", 1.0)],
    "pipeline": [("learner_busy", 1.0), ("padding_fraction", 1.0)],
    "timing": [("intake_wait_s", 1.0), ("publish_s", 1.0)],
    "memory": [("peak_memory_bytes", 1.0 / GIB)],
}


def _scaled(values: dict[str, Any], key: str, scale: float) -> float | None:
    value = _num(values, key)
    return value * scale if value is not None else None


def learner_charts(points: list[tuple[int, int | None, Any]]) -> dict[str, Any]:
    """uPlot data ([x, y1, y2, …]) of the learner series: reward mean per version, and the
    STEP_SERIES per step."""
    steps = [step for step, _version, _values in points]
    by_version: dict[int, list[float]] = defaultdict(list)
    for _step, version, values in points:
        reward = _num(values or {}, "reward_mean")
        if reward is not None and version is not None:
            by_version[version].append(reward)
    versions = sorted(by_version)
    out: dict[str, Any] = {
        "reward": [versions, [sum(by_version[v]) / len(by_version[v]) for v in versions]]
    }
    for chart, names in STEP_SERIES.items():
        out[chart] = [
            steps,
            *(
                [_scaled(values or {}, key, scale) for _s, _v, values in points]
                for key, scale in names
            ),
        ]
    return out


# Multi-turn runs: the learner's per-step trajectory figures (learner/trajectory_metrics.py),
# charted per version as means over the version's (charted) steps; stop reasons as the share of
# a step's trajectories, so thinning the points does not skew them.
TRAJECTORY_MEANS = ("turns_mean", "tool_calls_per_trajectory", "tool_errors_per_trajectory")
STOP_REASONS: tuple[str, ...] = get_args(StopReason)


def trajectory_charts(points: list[tuple[int, int | None, Any]]) -> dict[str, Any]:
    """uPlot data of the trajectory figures per version: {"trajectories": [versions, turns,
    tool calls, tool errors (per trajectory)], "stops": [versions, one share series per stop
    reason]}."""
    steps: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for _step, version, values in points:
        if version is not None and _num(values or {}, "turns_mean") is not None:
            steps[version].append(values)
    versions = sorted(steps)

    def mean(version: int, key: str) -> float | None:
        got = [v for v in (_num(p, key) for p in steps[version]) if v is not None]
        return sum(got) / len(got) if got else None

    def share(version: int, reason: str) -> float | None:
        got = [
            (_num(p, f"stop_{reason}") or 0.0) / n
            for p in steps[version]
            if (n := _num(p, "trajectories"))
        ]
        return sum(got) / len(got) if got else None

    return {
        "trajectories": [versions, *([mean(v, k) for v in versions] for k in TRAJECTORY_MEANS)],
        "stops": [versions, *([share(v, r) for v in versions] for r in STOP_REASONS)],
    }


def _buckets(session: Session, run_id: uuid.UUID) -> int:
    return max(10, math.ceil(repo.run_age_seconds(session, run_id) / CHART_BUCKETS))


def waste_chart(session: Session, run_id: uuid.UUID, bucket_s: int) -> dict[str, Any]:
    """Stale waste per interval and rejected samples per reason per interval (the figure of
    server/runs/waste.py, bucketed)."""
    series = stale_waste_series(session, run_id, bucket_s)
    keys = sorted(series.generated)
    names = sorted(series.rejected)
    return {
        "x": [k * bucket_s for k in keys],
        "waste": [series.ratio(k) for k in keys],
        "reasons": names,
        "by_reason": [[series.rejected[n].get(k, 0) for k in keys] for n in names],
    }


def spend_chart(session: Session, run_id: uuid.UUID, bucket_s: int) -> dict[str, Any]:
    xs: list[float] = []
    total: list[float] = []
    running = 0.0
    for bucket, usd in repo.spend_over_time(session, run_id, bucket_s):
        running += float(usd or 0.0)
        xs.append((bucket + 1) * bucket_s)
        total.append(running)
    return {"x": xs, "cumulative": total}


# Axis kinds read by static/app.js: x "int" (integer ticks) unless "time"; y "count" (integers
# from 0), "zero" (from 0), "compact" (from 0, 1.2k labels), "ratio" (decimals around 1).
INT_X = {"x": "int"}


def eval_chart(session: Session, run_id: uuid.UUID, config: RunConfig) -> dict[str, Any]:
    """Accuracy, pass@n and mean reward of each evaluated version (pending ones left out)."""
    n = config.eval.n if config.eval is not None else 1
    done = [r for r in evals_repo.results(session, run_id) if r.state == "done"]
    return {
        "labels": ["version", "accuracy", f"pass@{n}", "mean reward"],
        "data": [
            [r.version for r in done],
            [r.accuracy for r in done],
            [r.pass_at_n for r in done],
            [r.mean_reward for r in done],
        ],
        **INT_X,
        "y": "zero",
    }


def charts(session: Session, run_id: uuid.UUID) -> dict[str, Any]:
    """All chart data of the run page (one JSON document polled by the page)."""
    run = runs.get_run(session, run_id)
    config = runs.get_config(run)
    bucket_s = _buckets(session, run_id)
    points = repo.learner_points(session, run_id, CHART_POINTS)
    learner = learner_charts(points)
    trajectories = trajectory_charts(points)
    waste = waste_chart(session, run_id, bucket_s)
    spend = spend_chart(session, run_id, bucket_s)
    histogram = telemetry.proxy_stats(session, run_id).staleness_histogram
    budget = config.budget_usd
    clip_limit = config.alarms.clip_fraction
    return {
        "reward": {"labels": ["version", "reward mean"], "data": learner["reward"], **INT_X},
        "eval": eval_chart(session, run_id, config),
        "clip": {
            "labels": ["step", "clip low", "clip high", "threshold (low+high)"],
            "data": [*learner["clip"], [clip_limit] * len(learner["clip"][0])],
            **INT_X,
            "y": "zero",
        },
        "ratio": {
            "labels": ["step", "ratio min", "ratio mean", "ratio max"],
            "data": learner["ratio"],
            **INT_X,
            "y": "ratio",
        },
        "tokens": {
            "labels": ["step", "tokens/s"],
            "data": learner["tokens"],
            **INT_X,
            "y": "compact",
        },
        "pipeline": {
            "labels": ["step", "learner busy", "padding fraction"],
            "data": learner["pipeline"],
            **INT_X,
            "y": "zero",
        },
        "timing": {
            "labels": ["step", "intake wait (s)", "publish (s)"],
            "data": learner["timing"],
            **INT_X,
            "y": "zero",
        },
        "memory": {
            "labels": ["step", "peak memory (GiB)"],
            "data": learner["memory"],
            **INT_X,
            "y": "zero",
        },
        "trajectories": {
            "labels": ["version", "turns per trajectory", "tool calls", "tool errors"],
            "data": trajectories["trajectories"],
            **INT_X,
            "y": "zero",
        },
        "stops": {
            "labels": ["version", *(f"stopped: {r}" for r in STOP_REASONS)],
            "data": trajectories["stops"],
            **INT_X,
            "y": "zero",
        },
        "waste": {
            "labels": ["time", "stale waste", "threshold"],
            "data": [waste["x"], waste["waste"], [config.alarms.stale_waste] * len(waste["x"])],
            "time": True,
            "y": "zero",
        },
        "rejections": {
            "labels": ["time", *(f"{r} (samples)" for r in waste["reasons"])],
            "data": [waste["x"], *waste["by_reason"]],
            "time": True,
            "y": "count",
        },
        "staleness": {
            "labels": ["staleness", "consumed batches"],
            "data": [[int(k) for k in histogram], list(histogram.values())],
            "bars": True,
            **INT_X,
            "y": "count",
        },
        "spend": {
            "labels": ["time", "spend USD", *(["budget USD"] if budget else [])],
            "data": [
                spend["x"],
                spend["cumulative"],
                *([[budget] * len(spend["x"])] if budget else []),
            ],
            "time": True,
            "y": "zero",
        },
    }
