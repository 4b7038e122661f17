"""The planner page's form: its string fields, and "fill from a run", into the arithmetic of
fleet_plan.py."""

from __future__ import annotations

import math
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.dashboard.fleet_plan import FleetInputs, FullPlan, Gpu, full_plan
from server.dashboard.measured import Measured, measure
from server.dashboard.planner import ModelShape, Plan, plan
from server.models import Run


def field_number(values: dict[str, str], name: str, kind: type[int] | type[float]) -> Any:
    """The form field `name` as an int or a finite float; ValueError naming the field."""
    label = name.replace("_", " ")
    try:
        value = kind(values[name])
    except ValueError:
        whole = " whole" if kind is int else ""
        raise ValueError(f"{label}: enter a{whole} number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{label}: enter a finite number")
    return value


def payload_from_form(values: dict[str, str]) -> Plan:
    """The adapter payload and sync time of the page's preset, rank, targets and link."""
    rank = field_number(values, "rank", int)
    return plan(values["model"], rank, values["targets"], field_number(values, "link_gbps", float))


def plan_from_form(
    shape: ModelShape, values: dict[str, str], measured: Measured | None = None
) -> FullPlan:
    """The planner page's fields (strings) → a plan; ValueError naming the bad field. GPU offers
    written NAME:PRICE take their tokens/s from `measured`."""

    def number(name: str, kind: type[int] | type[float]) -> Any:
        return field_number(values, name, kind)

    values.setdefault("runs", "1")  # a sweep's fields: one run, no sample count, unless given
    values.setdefault("samples_per_run", "")
    offers = [w.strip() for w in values["worker_gpus"].split(",") if w.strip()]
    learner = values["learner_gpu"].strip()
    learner_rate = None
    if measured is not None and measured.learner_tokens_per_s is not None:
        learner_rate = {learner.split(":")[0]: measured.learner_tokens_per_s}
    return full_plan(
        shape,
        number("rank", int),
        values["targets"],
        micro_batch_tokens=number("micro_batch_tokens", int),
        learner=Gpu.parse(learner, learner_rate) if learner else None,
        workers=[Gpu.parse(w, measured.worker_tokens_per_s if measured else None) for w in offers],
        fleet=FleetInputs(
            completion_tokens=number("completion_tokens", float),
            group_size=number("group_size", int),
            bound_groups=number("bound_groups", int),
            worker_sequences=number("worker_sequences", int),
            accept_fraction=number("accept_fraction", float),
            learner_gpus=number("learner_gpus", int),
        ),
        runs=number("runs", int),
        samples_per_run=number("samples_per_run", float) if values["samples_per_run"] else None,
        checkpointing=bool(values.get("gradient_checkpointing")),
    )


def runs_to_measure(session: Session, limit: int = 50) -> list[tuple[str, str]]:
    """(id, name) of the latest runs, for the page's "fill from a run"."""
    rows = session.execute(
        select(Run.id, Run.name).order_by(Run.created_at.desc()).limit(limit)
    ).all()
    return [(str(r.id), r.name) for r in rows]


def measured_for_form(
    session: Session, run_id: str, values: dict[str, str], *, fill: bool
) -> Measured | None:
    """The chosen run's measurements (None without one; ValueError for an unknown run). With
    `fill` (the "fill from a run" button) they replace the fields they cover, shown back in the
    form; later recomputes keep what the user edits and use the run only for NAME:PRICE offers."""
    if not run_id:
        return None
    try:
        m = measure(session, uuid.UUID(run_id))
    except (ValueError, LookupError):
        raise ValueError(f"from run: no run {run_id!r}") from None
    if fill:
        values["group_size"] = str(m.group_size)
        values["bound_groups"] = str(m.bound_groups)
        if m.completion_tokens is not None:
            values["completion_tokens"] = f"{m.completion_tokens:.1f}"
        if m.accept_fraction is not None:
            values["accept_fraction"] = f"{m.accept_fraction:.3f}"
    return m
