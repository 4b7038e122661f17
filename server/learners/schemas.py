from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from protocol.schemas import ModelName

MAX_POOL_RUNS = 64


class LearnerRegister(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="Shown on the Learners page.")
    model: ModelName = Field(
        description="The base model it loaded (Hub id): it takes only runs of it."
    )
    tokenizer_fingerprint: str = Field(
        min_length=1,
        max_length=128,
        description="Its tokenizer's fingerprint (lm/chat.py tokenizer_fingerprint): it takes only "
        "runs whose fingerprint is unset or this one.",
    )
    max_runs: int = Field(
        ge=1, le=MAX_POOL_RUNS, description="The most runs it holds at once (1..64)."
    )
    memory_budget_gb: float | None = Field(
        None, gt=0, le=100_000, description="GPU memory it may spend on runs (informative)."
    )
    gpu_type: str | None = Field(None, min_length=1, max_length=100, description="e.g. H100.")
    price_per_hour: float | None = Field(
        None, ge=0, le=10_000, description="USD/hour, split over the runs it holds (Cost page)."
    )


class LearnerRegistered(BaseModel):
    learner_id: uuid.UUID
    learner_token: str = Field(description="The pool_learner token; shown only in this response.")


class TakeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max: int = Field(
        ge=1, le=MAX_POOL_RUNS, description="Take at most this many runs (at most its max_runs)."
    )


class TakenRun(BaseModel):
    run_id: uuid.UUID
    name: str
    status: str
    base_model: str
    tokenizer_fingerprint: str | None = Field(
        description="The run's fingerprint (null until its first attach)."
    )
    current_version: int
    attach_path: str = Field(
        description="Where to attach with the pool token (POST, the per-run learner's attach)."
    )


class TakeResponse(BaseModel):
    runs: list[TakenRun] = Field(description="The runs this take assigned (may be empty).")
    held: list[uuid.UUID] = Field(
        description="Every run the pool learner holds now, these included."
    )
    hold_s: float = Field(
        description="How long a taken run stays held before its attach (then it is takeable)."
    )


class PoolLearnerOut(BaseModel):
    id: uuid.UUID
    name: str
    model: str
    tokenizer_fingerprint: str
    max_runs: int
    memory_budget_gb: float | None
    gpu_type: str | None
    price_per_hour: float | None
    project_id: uuid.UUID | None
    runs_held: list[uuid.UUID] = Field(description="The runs it holds now.")
    created_at: datetime
    last_seen_at: datetime | None
    revoked_at: datetime | None
    revoked: bool
