"""Wire models of the runs API (the request body is protocol.run_config.RunConfig)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from protocol.schemas import RunStatus
from server.projects.schemas import ProjectNameOf


class RunAction(BaseModel):
    """Optional body of pause / resume / cancel."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(
        None, max_length=500, description="Why; shown as the run's status reason."
    )


class RunOut(BaseModel):
    """A run as listed."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID = Field(description="Run id.")
    name: str = Field(description="Run name.")
    status: RunStatus = Field(description="Lifecycle state.")
    status_reason: str | None = Field(description="Why the run is in this state, when known.")
    base_model: str = Field(description="Base model.")
    priority: int = Field(description="Higher runs are leased first.")
    current_version: int = Field(description="Last published adapter version (0: base model).")
    best_version: int | None = Field(
        description="The best version so far by the run's best metric (0: the base model; "
        "null until a version is ranked); served as /adapters/best."
    )
    best_value: float | None = Field(description="The best version's figure by that metric.")
    tokenizer_fingerprint: str | None = Field(description="Reported by the learner on attach.")
    groups_in_flight: int = Field(description="Groups leased, accepted or claimed, unconsumed.")
    spent_usd: float = Field(description="Spend attributed to the run so far.")
    created_at: datetime = Field(description="Creation time (database time).")
    updated_at: datetime | None = Field(description="Last state change (database time).")
    learner_attached_at: datetime | None = Field(description="Last learner attach.")
    last_version_at: datetime | None = Field(description="When the last version was published.")
    sweep_id: uuid.UUID | None = Field(
        None, description="The sweep that made the run (null: made on its own)."
    )
    project_id: uuid.UUID = Field(description="The run's project.")
    project: ProjectNameOf = Field(description="Its project's name.")
    created_by_token_id: uuid.UUID | None = Field(
        None, description="The admin or project token that created it (null before 0015)."
    )
    overrides: dict[str, Any] | None = Field(
        None,
        description="The overrides of the sweep's base config that made this run's config "
        "({field path: value}; null: not a sweep's run).",
    )


class SpendOut(BaseModel):
    total_usd: float = Field(description="Spend recorded on the run.")
    workers_usd: float = Field(description="Worker alive-seconds × price, from cost records.")
    learner_usd: float = Field(description="Learner time × learner price, from cost records.")
    budget_usd: float | None = Field(description="The run's budget, if any.")


class RunStats(BaseModel):
    """Live counts, read in the request's transaction."""

    prompt_rows: dict[str, int] = Field(description="Prompt rows by state (all epochs).")
    dropped: dict[str, int] = Field(description="Dropped prompt rows by drop reason.")
    batches: dict[str, int] = Field(description="Rollout batches by state.")
    rejected: dict[str, int] = Field(description="Rejected rollout batches by reason.")
    active_leases: int = Field(description="Leases active and not yet expired.")
    current_version: int = Field(description="Last published adapter version.")
    groups_in_flight: int = Field(description="Groups counted against the admission bound.")
    admission_bound_groups: int = Field(description="The admission bound in groups.")
    learner_attached: bool = Field(description="A learner holds a live lease on the run.")
    spend: SpendOut = Field(description="Spend so far.")


class ServingProblem(BaseModel):
    """Why the live workers cannot serve a leasing run (server/runs/serving.py)."""

    code: Literal["no_worker_can_serve"] = Field(description="What is wrong, for programs.")
    reason: str = Field(description="Why, and the setting that would let a worker serve it.")
    workers: int = Field(description="Live workers of its base model that cannot serve it.")


class RunDetail(RunOut):
    """A run with its config and live stats."""

    config: dict[str, Any] = Field(description="The validated run config.")
    stats: RunStats = Field(description="Live stats.")
    best_metric: str = Field(
        description="The figure that ranks versions (config best.metric, or its default)."
    )
    serving: ServingProblem | None = Field(
        None,
        description="Set while the run hands out leases, its base model has live workers and "
        "none of them can serve it: none can run its environment, or none of those that can "
        "has an engine that loads its LoRA adapter (no_worker_can_serve, with the reason and the "
        "setting to change); null otherwise (server/runs/serving.py).",
    )


class RunCreated(BaseModel):
    run: RunDetail = Field(description="The new run (status pending until a learner attaches).")
    learner_token: str = Field(description="The run's learner token; shown only here.")
