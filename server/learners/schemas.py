from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, Field

from protocol.schemas_learner import (
    MAX_POOL_RUNS,
    LearnerMemory,
    LearnerRegister,
    LearnerRegistered,
    LeftRun,
    TakenRun,
    TakeRequest,
    TakeResponse,
)
from server.projects.schemas import ProjectNameOf

# The wire models are the learner protocol's (protocol/schemas_learner.py), shared with the
# pool learner's client; the listing is the server's own.
__all__ = [
    "MAX_POOL_RUNS",
    "LearnerMemory",
    "LearnerRegister",
    "LearnerRegistered",
    "LeftRun",
    "PoolLearnerOut",
    "TakeRequest",
    "TakeResponse",
    "TakenRun",
]


class PoolLearnerOut(BaseModel):
    id: uuid.UUID
    name: str
    model: str
    tokenizer_fingerprint: str
    max_runs: int
    memory_budget_gb: float | None
    gpu_type: str | None
    price_per_hour: float | None
    project_id: uuid.UUID | None = Field(
        description="The project it serves (its registration token's); null: the shared "
        "fleet, it serves every project."
    )
    project: ProjectNameOf | None = Field(description="That project's name; null: shared.")
    runs_held: list[uuid.UUID] = Field(description="The runs it holds now.")
    created_at: datetime
    last_seen_at: datetime | None
    revoked_at: datetime | None
    revoked: bool
