"""A run's figures per version, the one home every view reads them from
(docs/architecture/contract.md, "One home per rule"): the learner's metric means over each
version's steps (the collapse alarms, the compare view's charts, the compare table's and
`asyncgrpo sweep show`'s last reward) and the done eval results by version (the compare view,
`asyncgrpo sweep show`). A version's learner figure is the mean over its steps that report it;
a step without it (entropy: a step that trained no token) counts for nothing."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import ColumnElement, Select, func, select
from sqlalchemy.orm import Session

from server.models import EvalResult, MetricPoint

# A named sum of learner metrics, e.g. {"clip": ("clip_low", "clip_high")}.
Sums = dict[str, tuple[str, ...]]


def _mean_of(keys: tuple[str, ...]) -> ColumnElement[Any]:
    terms = [MetricPoint.values[key].as_float() for key in keys]
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return func.avg(total)


def _per_version(run_id: uuid.UUID, *means: ColumnElement[Any]) -> Select[Any]:
    return (
        select(MetricPoint.version, *means)
        .where(
            MetricPoint.run_id == run_id,
            MetricPoint.source == "learner",
            MetricPoint.version.is_not(None),
        )
        .group_by(MetricPoint.version)
    )


def version_means(
    session: Session, run_id: uuid.UUID, key: str, *, limit: int, newest: bool = True
) -> list[tuple[int, float]]:
    """(version, mean of the learner metric `key`) for the run's newest `limit` versions that
    have the figure, newest first (`newest=False`: the oldest, oldest first)."""
    mean = _mean_of((key,))
    order = MetricPoint.version.desc() if newest else MetricPoint.version.asc()
    rows = session.execute(
        _per_version(run_id, mean).having(mean.is_not(None)).order_by(order).limit(limit)
    ).all()
    return [(int(r[0]), float(r[1])) for r in rows]


def means_by_version(
    session: Session, run_ids: list[uuid.UUID], sums: Sums
) -> dict[uuid.UUID, dict[str, dict[int, float]]]:
    """Per run, for each named sum, its mean over each version's steps; a version whose steps
    lack a term has no figure."""
    names = list(sums)
    means = [_mean_of(sums[name]) for name in names]
    connection = session.connection()
    out: dict[uuid.UUID, dict[str, dict[int, float]]] = {}
    for run_id in run_ids:  # one statement per run: no run id to parse on each of its rows
        series: dict[str, dict[int, float]] = {name: {} for name in names}
        out[run_id] = series
        for version, *values in connection.execute(_per_version(run_id, *means)):
            for name, value in zip(names, values, strict=True):
                if value is not None:
                    series[name][int(version)] = float(value)
    return out


def last_version_means(
    session: Session, run_ids: list[uuid.UUID], key: str
) -> dict[uuid.UUID, float]:
    """Per run, the mean of the learner metric `key` over the steps of its last version that
    has learner points (a run without any is left out)."""
    if not run_ids:
        return {}
    last = (
        select(MetricPoint.run_id, func.max(MetricPoint.version).label("version"))
        .where(MetricPoint.run_id.in_(run_ids), MetricPoint.source == "learner")
        .group_by(MetricPoint.run_id)
        .subquery()
    )
    rows = session.connection().execute(
        select(MetricPoint.run_id, _mean_of((key,)))
        .join(last, (last.c.run_id == MetricPoint.run_id) & (last.c.version == MetricPoint.version))
        .where(MetricPoint.source == "learner")
        .group_by(MetricPoint.run_id)
    )
    return {run_id: float(v) for run_id, v in rows if v is not None}


def eval_accuracy_by_version(
    session: Session, run_ids: list[uuid.UUID]
) -> dict[uuid.UUID, dict[int, float | None]]:
    """Per run (every id given), the accuracy of each evaluated (done) version; None where the
    task scores no accuracy."""
    out: dict[uuid.UUID, dict[int, float | None]] = {i: {} for i in run_ids}
    if not run_ids:
        return out
    for run_id, version, accuracy in session.connection().execute(
        select(EvalResult.run_id, EvalResult.version, EvalResult.accuracy).where(
            EvalResult.run_id.in_(run_ids), EvalResult.state == "done"
        )
    ):
        out[run_id][int(version)] = float(accuracy) if accuracy is not None else None
    return out


def latest_eval(by_version: dict[int, float | None]) -> tuple[int, float | None] | None:
    """(version, accuracy) of the latest evaluated version, None before the first eval."""
    if not by_version:
        return None
    version = max(by_version)
    return version, by_version[version]
