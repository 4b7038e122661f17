"""The compare view (docs/guides/dashboard.md, "Comparing runs"): up to MAX_COMPARED runs side by
side — per-version charts overlaid, one series per run, and a table of each run's figures. The
figures come from their homes: the run's best version (server/runs/best.py), stale waste per
version (server/runs/waste.py), the learner's per-version means and the eval results by version
(server/runs/figures.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from server.errors import NotFound, Unprocessable
from server.models import Run
from server.runs import figures
from server.runs import service as runs
from server.runs.waste import Samples, stale_samples_by_version
from server.sweeps import repository as sweeps_repo
from server.sweeps.expand import label

MAX_COMPARED = 32
# The per-version learner figures charted: reward mean, and the clip fraction (low + high).
SUMS = {"reward": ("reward_mean",), "clip": ("clip_low", "clip_high")}
INT_X = {"x": "int"}


@dataclass(frozen=True)
class ComparedRun:
    """One row of the compare table."""

    run: Run
    label: str
    best_metric: str
    last_reward: float | None
    last_eval_accuracy: float | None
    stale_waste: float
    wall_s: float | None


def chosen_ids(session: Session, raw: list[str], sweep: uuid.UUID | None) -> list[uuid.UUID]:
    """The runs of `?sweep=…` (in their combination order) or of `?ids=…`, not both (422)."""
    if sweep is None:
        return parse_ids(raw)
    if raw:
        raise Unprocessable(
            "ids: give either a sweep or run ids, not both",
            field="ids",
            code=ErrorCode.invalid_value,
        )
    if sweeps_repo.get(session, sweep) is None:
        raise NotFound(f"sweep {sweep} not found", code=ErrorCode.sweep_not_found)
    ids = sweeps_repo.run_ids_of(session, sweep)
    if len(ids) > MAX_COMPARED:
        raise Unprocessable(
            f"sweep: it has {len(ids)} runs; compare at most {MAX_COMPARED} (choose them by ids)",
            field="sweep",
            code=ErrorCode.invalid_value,
        )
    return ids


RECENT_SWEEPS = 20


def recent_sweeps(session: Session) -> list[Any]:
    """The latest sweeps, for the runs page's links to their comparison."""
    return sweeps_repo.list_sweeps(session, RECENT_SWEEPS, 0)


def label_of(run: Run) -> str:
    """A sweep's run is named by its overrides, by path (the legend says which setting each
    line is; Postgres keeps no key order in JSON); any other run by its name."""
    if run.sweep_id is not None and run.overrides is not None:
        return label(dict(sorted(run.overrides.items())))
    return run.name


def parse_ids(raw: list[str]) -> list[uuid.UUID]:
    """The run ids of `?ids=…` in their order, each once: 1 to MAX_COMPARED of them (422)."""
    seen: dict[uuid.UUID, None] = {}
    parts = (part.strip() for value in raw for part in value.split(","))
    for part in parts:
        if not part:
            continue
        try:
            seen[uuid.UUID(part)] = None
        except ValueError:
            raise Unprocessable(
                f"ids: {part[:80]!r} is not a run id", field="ids", code=ErrorCode.invalid_value
            ) from None
        if len(seen) > MAX_COMPARED:
            break
    ids = list(seen)
    if not 1 <= len(ids) <= MAX_COMPARED:
        got = "none" if not ids else f"more than {MAX_COMPARED}"
        raise Unprocessable(
            f"ids: choose 1 to {MAX_COMPARED} runs to compare (got {got})",
            field="ids",
            code=ErrorCode.invalid_value,
        )
    return ids


def _runs(session: Session, ids: list[uuid.UUID]) -> list[Run]:
    found = {r.id: r for r in session.execute(select(Run).where(Run.id.in_(ids))).scalars()}
    missing = [str(i) for i in ids if i not in found]
    if missing:
        raise NotFound(f"run {missing[0]} not found", code=ErrorCode.run_not_found)
    return [found[i] for i in ids]


def _wall_s(run: Run) -> float | None:
    """From the run's creation to its last published version."""
    end: datetime | None = run.last_version_at
    return (end - run.created_at).total_seconds() if end is not None else None


def table(session: Session, ids: list[uuid.UUID]) -> list[ComparedRun]:
    """The compare table's rows, in the order of `ids`."""
    chosen = _runs(session, ids)
    last_reward = figures.last_version_means(session, ids, "reward_mean")
    evals = figures.eval_accuracy_by_version(session, ids)
    waste = stale_samples_by_version(session, ids)
    rows = []
    for run in chosen:
        latest = figures.latest_eval(evals[run.id])
        terms = waste.get(run.id, {}).values()
        total = Samples(sum(t.generated for t in terms), sum(t.wasted for t in terms))
        rows.append(
            ComparedRun(
                run=run,
                label=label_of(run),
                best_metric=runs.get_config(run).best_metric,
                last_reward=last_reward.get(run.id),
                last_eval_accuracy=latest[1] if latest is not None else None,
                stale_waste=total.ratio,
                wall_s=_wall_s(run),
            )
        )
    return rows


def charts(session: Session, ids: list[uuid.UUID]) -> dict[str, Any]:
    """The overlaid per-version charts (uPlot data), one series per run in the order of `ids`."""
    chosen = _runs(session, ids)
    labels = [label_of(run) for run in chosen]
    means = figures.means_by_version(session, ids, SUMS)
    evals = figures.eval_accuracy_by_version(session, ids)
    accuracy = {i: {v: a for v, a in evals[i].items() if a is not None} for i in ids}
    waste = stale_samples_by_version(session, ids)
    stale = {i: {v: t.ratio for v, t in waste.get(i, {}).items()} for i in ids}
    return {
        "reward": _chart(labels, [means[i]["reward"] for i in ids]),
        "eval": _chart(labels, [accuracy[i] for i in ids]),
        "stale": _chart(labels, [stale[i] for i in ids]),
        "clip": _chart(labels, [means[i]["clip"] for i in ids]),
    }


def _chart(labels: list[str], series: list[dict[int, float]]) -> dict[str, Any]:
    """uPlot data over the union of the versions; None where a run has no figure."""
    versions = sorted(set().union(*series)) if series else []
    return {
        "labels": ["version", *labels],
        "data": [versions, *([s.get(v) for v in versions] for s in series)],
        "y": "zero",
        **INT_X,
    }
