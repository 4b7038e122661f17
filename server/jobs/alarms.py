"""Alarm evaluation: stale waste, clip fraction, entropy collapse, zero-advantage share, no new
version, worker quarantine.

An alarm raises one Event (and webhook) when its figure crosses the threshold and one
`.cleared` Event when it falls back, never one per evaluation: the raised state per subject
and kind lives in `alarm_states` and changes only through a compare-and-set.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from protocol.run_config import AlarmConfig
from server.db import db_time
from server.db_types import db_now
from server.events.service import raise_event
from server.jobs import stats
from server.models import AlarmState, Run, Worker
from server.runs import figures
from server.runs.service import config_of
from server.runs.waste import stale_waste

ALARM_STATUSES = ("running",)


@dataclass(frozen=True)
class Reading:
    """One alarm's figure for one subject now."""

    kind: str
    value: float
    threshold: float
    firing: bool
    message: str


def _set_state(session: Session, subject: uuid.UUID, kind: str, firing: bool, value: float) -> bool:
    """Compare-and-set the alarm state; True only for the evaluation that flips it."""
    flipped = session.execute(
        update(AlarmState)
        .where(
            AlarmState.subject_id == subject,
            AlarmState.kind == kind,
            AlarmState.active.is_(not firing),
        )
        .values(active=firing, value=value, changed_at=db_now())
        .returning(AlarmState.id)
    ).first()
    if flipped is not None:
        return True
    if not firing:
        return False
    exists = session.execute(
        select(AlarmState.id).where(AlarmState.subject_id == subject, AlarmState.kind == kind)
    ).first()
    if exists is not None:
        return False
    try:
        with session.begin_nested():
            session.add(
                AlarmState(
                    subject_id=subject, kind=kind, active=True, value=value, changed_at=db_now()
                )
            )
    except IntegrityError:
        return False
    return True


def apply_reading(
    session: Session,
    reading: Reading,
    *,
    run_id: uuid.UUID | None,
    worker_id: uuid.UUID | None = None,
) -> str | None:
    """Flip the alarm if needed and raise the matching event; returns 'fired', 'cleared' or
    None (no crossing)."""
    subject = run_id or worker_id
    assert subject is not None
    if not _set_state(session, subject, reading.kind, reading.firing, reading.value):
        return None
    state = "fired" if reading.firing else "cleared"
    raise_event(
        session,
        kind=f"alarm.{reading.kind}" + ("" if reading.firing else ".cleared"),
        severity="warning" if reading.firing else "info",
        message=reading.message if reading.firing else f"{reading.kind} alarm cleared",
        run_id=run_id,
        worker_id=worker_id,
        data={
            "alarm": reading.kind,
            "state": state,
            "value": reading.value,
            "threshold": reading.threshold,
        },
    )
    return state


def run_readings(session: Session, run: Run, now: datetime) -> list[Reading]:
    """The run alarms' figures against the run's thresholds (RunConfig.alarms)."""
    alarms = config_of(session, run.id).alarms
    out: list[Reading] = []
    window_s = alarms.window_minutes * 60
    waste = stale_waste(session, run.id, window_s)
    limit = alarms.stale_waste
    out.append(
        Reading(
            "stale_waste",
            waste.ratio,
            limit,
            waste.generated > 0 and waste.ratio >= limit,
            f"stale waste {waste.ratio:.1%} over {window_s / 60:g} min "
            f"(threshold {limit:.1%}): {waste.stale_rejected} samples rejected stale, "
            f"{waste.stale_aborted} in leases aborted as stale, of {waste.generated} generated",
        )
    )
    clip = stats.latest_clip_fraction(session, run.id)
    limit = alarms.clip_fraction
    out.append(
        Reading(
            "clip_fraction",
            clip or 0.0,
            limit,
            clip is not None and clip >= limit,
            f"clip fraction {clip or 0.0:.3f} at or above {limit:.3f}",
        )
    )
    out.extend(collapse_readings(session, run.id, alarms))
    since = run.last_version_at or run.learner_attached_at or run.created_at
    idle_min = (now - since).total_seconds() / 60 if since else 0.0
    limit = alarms.no_version_minutes
    out.append(
        Reading(
            "no_version",
            idle_min,
            limit,
            idle_min >= limit,
            f"no new adapter version for {idle_min:.1f} min (threshold {limit:g} min)",
        )
    )
    return out


def collapse_readings(session: Session, run_id: uuid.UUID, alarms: AlarmConfig) -> list[Reading]:
    """The collapse alarms (docs/guides/dashboard.md, "Collapse alarms"), each left out when its
    thresholds are all None. Entropy: the newest version's mean entropy under `entropy_floor`,
    or `entropy_drop` or more below the first version's. Zero advantage: the share of groups
    with no advantage at or above `zero_advantage` in each of the newest
    `zero_advantage_versions` versions; its value is the lowest of them."""
    out: list[Reading] = []
    floor, drop = alarms.entropy_floor, alarms.entropy_drop
    if floor is not None or drop is not None:
        newest = figures.version_means(session, run_id, "entropy", limit=1)
        first = figures.version_means(session, run_id, "entropy", limit=1, newest=False)
        lines = [] if floor is None else [floor]
        if drop is not None and first:
            lines.append(first[0][1] * (1.0 - drop))
        value = newest[0][1] if newest else 0.0
        under_floor = bool(newest) and floor is not None and value < floor
        dropped = bool(newest and first) and drop is not None and value <= lines[-1]
        why = []
        if under_floor:
            why.append(f"under the floor {floor:.3f}")
        if dropped and first:
            fell = 1.0 - value / first[0][1] if first[0][1] > 0 else 0.0
            why.append(
                f"{fell:.0%} below its start {first[0][1]:.3f} at version {first[0][0]} "
                f"(alarm at {drop:.0%})"
            )
        at = f" at version {newest[0][0]}" if newest else ""
        out.append(
            Reading(
                "entropy",
                value,
                max(lines) if lines else 0.0,
                under_floor or dropped,
                f"entropy {value:.3f}{at} " + " and ".join(why) + ": the policy is collapsing",
            )
        )
    limit, n = alarms.zero_advantage, alarms.zero_advantage_versions
    if limit is not None:
        shares = figures.version_means(session, run_id, "zero_advantage_fraction", limit=n)
        lowest = min((share for _v, share in shares), default=0.0)
        listed = ", ".join(f"v{v} {share:.2f}" for v, share in reversed(shares))
        out.append(
            Reading(
                "zero_advantage",
                lowest,
                limit,
                len(shares) == n and lowest >= limit,
                f"zero-advantage share at or above {limit:.2f} for {n} versions ({listed}): "
                "nearly every group scored all right or all wrong, no signal to learn from",
            )
        )
    return out


def evaluate_alarms(session: Session) -> list[tuple[str, str]]:
    """The alarm job: every running run's alarms and every worker's quarantine. Returns the
    crossings as (alarm kind, 'fired'|'cleared')."""
    now = db_time(session)
    crossings: list[tuple[str, str]] = []
    runs = session.execute(select(Run).where(Run.status.in_(ALARM_STATUSES))).scalars()
    for run in list(runs):
        for reading in run_readings(session, run, now):
            state = apply_reading(session, reading, run_id=run.id)
            if state:
                crossings.append((reading.kind, state))
    for worker in list(session.execute(select(Worker)).scalars()):
        quarantined = worker.status == "quarantined"
        reading = Reading(
            "worker_quarantined",
            1.0 if quarantined else 0.0,
            1.0,
            quarantined,
            f"worker {worker.name} quarantined: {worker.quarantine_reason or 'no reason given'}",
        )
        state = apply_reading(session, reading, run_id=None, worker_id=worker.id)
        if state:
            crossings.append((reading.kind, state))
    return crossings
