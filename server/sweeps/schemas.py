"""Wire models of the sweeps API (docs/guides/sweeps.md)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from protocol.schemas import KIB, RunStatus, free_json

# The body is free JSON until each combination is validated as a run config: bounded at the
# edge (finite numbers, storable text, depth), as every free JSON field is (protocol/schemas.py).
# The base may hold an inline dataset; the request body's own limit bounds it first.
BaseConfig = Annotated[dict[str, Any], AfterValidator(free_json(64 * KIB * KIB))]
Grid = Annotated[dict[str, Any], AfterValidator(free_json(KIB * KIB))]
OverrideList = Annotated[list[Any], AfterValidator(free_json(KIB * KIB))]


class SweepCreate(BaseModel):
    """A sweep: a base run config and either a grid or a list of overrides."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=160,
        description="The sweep's name; each run is named `<name> <path>=<value> ...` (cut to "
        "the 200 characters of a run name).",
    )
    base: BaseConfig = Field(
        description="The base run config (POST /api/v1/runs's body; its `name` is replaced by "
        "each run's). Every combination is this with its overrides applied."
    )
    grid: Grid | None = Field(
        None,
        description="Field path -> list of values; the sweep makes every combination (the "
        'product, the last path varying fastest). Paths are dotted: `{"grpo.learning_rate": '
        '[1e-5, 3e-5], "lora.rank": [8, 32]}`.',
    )
    overrides: OverrideList | None = Field(
        None,
        description="Instead of a grid, the combinations as a list of {field path: value} "
        "objects, one run each (`{}`: the base config itself).",
    )
    project: str | None = Field(
        None,
        max_length=63,
        description="The project (name or id) of the sweep and its runs (docs/guides/"
        "projects.md); default: `default`.",
    )

    @field_validator("name")
    @classmethod
    def _not_blank(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("name must not be blank")
        return name


class SweepRun(BaseModel):
    """One run of a sweep, with the figures that compare it to the others."""

    id: uuid.UUID = Field(description="Run id.")
    index: int = Field(description="The run's combination, from 0, in the sweep's order.")
    name: str = Field(description="Run name (the sweep's name and the overrides).")
    overrides: dict[str, Any] = Field(description="{field path: value} of this run.")
    status: RunStatus = Field(description="Lifecycle state.")
    status_reason: str | None = Field(description="Why the run is in this state, when known.")
    current_version: int = Field(description="Last published adapter version.")
    best_version: int | None = Field(description="The best version by the run's best metric.")
    best_value: float | None = Field(description="The best version's figure.")
    last_reward: float | None = Field(
        description=(
            "The mean of the learner's reward_mean over its last version's steps, as the"
            " compare view shows it (null before its first step)."
        )
    )
    eval_version: int | None = Field(description="The latest evaluated version (null: none).")
    eval_accuracy: float | None = Field(description="That version's eval accuracy.")
    stale_waste: float = Field(
        description="Stale waste over the whole run (server/runs/waste.py, invariant 16)."
    )
    spent_usd: float = Field(description="Spend attributed to the run so far.")


class SweepOut(BaseModel):
    """A sweep as listed."""

    id: uuid.UUID = Field(description="Sweep id.")
    name: str = Field(description="Sweep name.")
    n_runs: int = Field(description="Runs the sweep created.")
    grid: Grid | None = Field(description="The grid (null: a list of overrides).")
    created_at: datetime = Field(description="Creation time (database time).")
    statuses: dict[str, int] = Field(description="Its runs by status.")
    project_id: uuid.UUID = Field(description="The sweep's project (its runs').")
    project: str = Field(description="Its project's name.")
    created_by_token_id: uuid.UUID | None = Field(
        None, description="The admin or project token that created it (null before 0015)."
    )


class SweepDetail(SweepOut):
    """A sweep with its runs, in the sweep's order."""

    runs: list[SweepRun] = Field(description="The sweep's runs, by combination index.")


class SweepRunToken(BaseModel):
    run_id: uuid.UUID = Field(description="Run id.")
    name: str = Field(description="Run name.")
    overrides: dict[str, Any] = Field(description="{field path: value} of this run.")
    learner_token: str = Field(description="The run's learner token; shown only here.")


class SweepCreated(BaseModel):
    sweep: SweepDetail = Field(description="The new sweep and its runs (pending or preparing).")
    learners: list[SweepRunToken] = Field(
        description="Each run's learner token, in the sweep's order; shown only here."
    )


class SweepActionBody(BaseModel):
    """Optional body of a sweep's pause / resume / cancel."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(
        None, max_length=500, description="Why; shown as each moved run's status reason."
    )


class RunActionOutcome(BaseModel):
    run_id: uuid.UUID = Field(description="Run id.")
    name: str = Field(description="Run name.")
    status: RunStatus = Field(description="The run's status after the action.")
    moved: bool = Field(description="The action applied to this run.")
    code: str | None = Field(
        description="Why it did not (invalid_transition: its status does not allow the "
        "action); null when it moved."
    )
    detail: str | None = Field(description="The refusal's words, for people; null when moved.")


class SweepActionResult(BaseModel):
    """What one action did to each run of the sweep: the runs whose status allows it moved
    (each through the run lifecycle); the others are listed with the refusal, unchanged."""

    action: str = Field(description="pause, resume or cancel (the run lifecycle's admin actions).")
    moved: int = Field(description="Runs the action moved.")
    refused: int = Field(description="Runs whose status does not allow it (left as they were).")
    runs: list[RunActionOutcome] = Field(description="Every run of the sweep, in its order.")
