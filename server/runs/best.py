"""The run's best version and early stopping (docs/architecture/run-lifecycle.md, "The best
version").

A version is *ranked* when its figure by the run's best metric is known: an eval metric when the
version's eval is done (server/evals/service.py), `train_reward` at each publish once
`best.window_versions` versions are published (server/learner/publish.py). Ranking moves the
run's best (`runs.best_version`, `runs.best_value`) by one compare-and-set when the figure
beats the best one (a tie keeps the earlier version), in the transaction of the call that
ranked it. Version 0, the base model, is ranked like the others when its eval is done.
Retention never deletes the best version (invariant 13). Then the run's `early_stop` rules are
read: a running run they stop is completed, with the reason in its status and in an event.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from protocol.run_config import EVAL_METRICS, BestMetric, RunConfig
from server.events.service import raise_event
from server.models import AdapterVersion, EvalResult, Run
from server.runs import lifecycle

BEST_EVENT = "run.best"
EARLY_STOP_EVENT = "run.early_stop"
# The eval result's aggregate each eval metric reads (server/evals/service.py maybe_finish).
EVAL_FIGURES: dict[BestMetric, str] = {
    "eval_accuracy": "accuracy",
    "eval_mean_reward": "mean_reward",
    "eval_pass_at_n": "pass_at_n",
}
TRAIN_FIGURE = "reward_mean"  # the learner's per-version metric train_reward averages


def eval_figure(config: RunConfig, values: Mapping[str, Any]) -> float | None:
    """The figure a done eval gives the version, when the run ranks by an eval metric."""
    metric = config.best_metric
    if metric not in EVAL_METRICS:
        return None
    return _finite(values.get(EVAL_FIGURES[metric]))


def train_figure(
    session: Session, run_id: uuid.UUID, version: int, config: RunConfig
) -> float | None:
    """train_reward at `version`: the mean reward_mean of the last window_versions versions,
    once that many are published and each reported it."""
    if config.best_metric != "train_reward":
        return None
    window = config.best.window_versions
    if version < window:
        return None
    rows = session.execute(
        select(AdapterVersion.metrics).where(
            AdapterVersion.run_id == run_id,
            AdapterVersion.version > version - window,
            AdapterVersion.version <= version,
        )
    ).scalars()
    figures = [_finite((m or {}).get(TRAIN_FIGURE)) for m in rows]
    known = [x for x in figures if x is not None]
    return sum(known) / window if len(known) == window else None


def rank(
    session: Session, run_id: uuid.UUID, version: int, value: float | None, config: RunConfig
) -> bool:
    """Rank `version` by its figure (None: not ranked); True when early stopping completed the
    run with it."""
    if value is None:
        return False
    if _beats_the_best(session, run_id, version, value, config):
        raise_event(
            session,
            kind=BEST_EVENT,
            severity="info",
            message=f"version {version} is the best so far: {config.best_metric} {value:.4g}",
            run_id=run_id,
            data={"version": version, "metric": config.best_metric, "value": value},
        )
    return _stop_early(session, run_id, version, value, config)


def _beats_the_best(
    session: Session, run_id: uuid.UUID, version: int, value: float, config: RunConfig
) -> bool:
    better = Run.best_value < value if config.best.direction == "max" else Run.best_value > value
    earlier_tie = and_(Run.best_value == value, Run.best_version > version)
    moved = session.execute(
        update(Run)
        .where(Run.id == run_id, or_(Run.best_value.is_(None), better, earlier_tie))
        .values(best_version=version, best_value=value)
        .returning(Run.id)
        .execution_options(synchronize_session=False)
    ).first()
    return moved is not None


def _stop_early(
    session: Session, run_id: uuid.UUID, version: int, value: float, config: RunConfig
) -> bool:
    rule = config.early_stop
    if rule is None or version < rule.min_version:
        return False
    run = session.execute(
        select(Run.status, Run.best_version, Run.best_value).where(Run.id == run_id)
    ).one()
    if run.status != "running" or run.best_version is None or run.best_value is None:
        return False
    reason = None
    worse = run.best_value - value if config.best.direction == "max" else value - run.best_value
    if rule.max_drop is not None and worse >= rule.max_drop:
        reason = (
            f"version {version}'s {config.best_metric} {value:.4g} is {worse:.4g} below the best "
            f"(version {run.best_version}: {run.best_value:.4g}; max_drop {rule.max_drop:g})"
        )
    elif rule.patience is not None:
        since = _ranked_after(session, run_id, run.best_version, version, config)
        if since >= rule.patience:
            reason = (
                f"{since} versions ranked after the best (version {run.best_version}: "
                f"{config.best_metric} {run.best_value:.4g}) without beating it "
                f"(patience {rule.patience})"
            )
    if reason is None or not lifecycle.stop_early(session, run_id, f"early stop: {reason}"):
        return False
    raise_event(
        session,
        kind=EARLY_STOP_EVENT,
        severity="info",
        message=f"early stop: {reason}; the best version is {run.best_version}",
        run_id=run_id,
        data={"version": version, "best_version": run.best_version, "reason": reason},
    )
    return True


def _ranked_after(
    session: Session, run_id: uuid.UUID, best: int, version: int, config: RunConfig
) -> int:
    """How many versions after the best one are ranked, up to `version`."""
    if config.best_metric not in EVAL_METRICS:
        return version - best  # train_reward ranks every version past its window
    column = getattr(EvalResult, EVAL_FIGURES[config.best_metric])
    return int(
        session.execute(
            select(func.count()).where(
                EvalResult.run_id == run_id,
                EvalResult.state == "done",
                EvalResult.version > best,
                EvalResult.version <= version,
                column.is_not(None),
            )
        ).scalar_one()
    )


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)
