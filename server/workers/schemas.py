from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from protocol.capabilities import WorkerCapabilities
from protocol.schemas import (
    MAX_DECLARED_ENVIRONMENTS,
    MAX_WORKER_MODELS,
    EnvironmentName,
    ModelName,
)
from server.projects.schemas import ProjectNameOf
from server.workers.liveness import WorkerState


class WorkerRegister(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="Worker name shown in the fleet.")
    gpu_type: str = Field("cpu", min_length=1, max_length=100, description="e.g. H100, L4, cpu.")
    gpu_count: int = Field(1, ge=0, le=64, description="GPUs on this box.")
    price_per_hour: float = Field(0.0, ge=0, le=10_000, description="Self-reported USD/hour.")
    models: list[ModelName] = Field(
        default_factory=list,
        max_length=MAX_WORKER_MODELS,
        description=f"Base models this worker serves (at most {MAX_WORKER_MODELS}).",
    )
    environments: list[EnvironmentName] = Field(
        default_factory=lambda: ["single_turn"],
        max_length=MAX_DECLARED_ENVIRONMENTS,
        description="Environments this worker can run (EnvironmentAllowlist.names()); a worker "
        "that sends none runs single_turn only.",
    )
    capabilities: WorkerCapabilities | None = Field(
        None,
        description="What its engine can load (largest LoRA rank, target modules, dtype): it is "
        "granted only runs it can serve; null: every run.",
    )


class WorkerRegistered(BaseModel):
    id: uuid.UUID
    token: str = Field(description="The worker token; shown only in this response.")
    project_id: uuid.UUID | None = Field(
        description="The project it serves (its registration token's); null: the shared "
        "fleet, it serves every project."
    )


class WorkerOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    name: str
    gpu_type: str
    gpu_count: int
    price_per_hour: float
    effective_price_per_hour: float
    models: list[str]
    environments: list[str] = Field(description="The environments the worker declared.")
    capabilities: WorkerCapabilities | None = Field(
        None, description="What its engine can load, as it declared last; null: never declared."
    )
    trusted: bool = Field(
        description="An admin's mark: only trusted workers get leases of runs whose "
        "environment requires_trusted_worker."
    )
    status: str = Field(
        description="Stored status: active, quarantined or revoked (an admin's or a spot check's "
        "decision; a worker that stopped calling stays active here, see `state`)."
    )
    state: WorkerState = Field(
        description="Derived when read: online (active and seen within the silence threshold, "
        "settings.jobs.worker_silent_s), offline (active but silent), quarantined or revoked."
    )
    last_seen_at: datetime | None
    created_at: datetime
    accepted_batches: int
    rejected_batches: int
    spot_checks: int
    spot_check_mismatch: float | None
    quarantine_reason: str | None
    project_id: uuid.UUID | None = Field(
        description="The project it serves (its registration token's); null: the shared "
        "fleet, it serves every project."
    )
    project: ProjectNameOf | None = Field(description="That project's name; null: shared.")
