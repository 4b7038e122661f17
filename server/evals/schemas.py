"""API models of the eval results (GET /api/v1/runs/{run_id}/evals)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EvalVersionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    version: int = Field(description="The adapter version evaluated (0: the base model).")
    state: Literal["pending", "done"] = Field(description="pending until every item is scored.")
    n_prompts: int = Field(description="Eval prompts of the version.")
    n_samples: int = Field(description="Samples scored (prompts scored × n); 0 while pending.")
    mean_reward: float | None = Field(description="Mean total reward over the samples.")
    accuracy: float | None = Field(
        description="Share of samples whose accuracy_reward is at least the threshold."
    )
    pass_at_n: float | None = Field(description="Share of prompts with an accurate sample.")
    created_at: datetime | None = Field(description="When the version's eval was queued.")
    scored_at: datetime | None = Field(description="When its last item was scored.")


class EvalsOut(BaseModel):
    run_id: uuid.UUID = Field(description="The run.")
    enabled: bool = Field(description="Whether the run has an eval block.")
    every_versions: int | None = Field(description="Versions 0, k, 2k, … and the final one.")
    n: int | None = Field(description="Samples per prompt.")
    accuracy_reward: str | None = Field(description="The reward that defines accuracy.")
    threshold: float | None = Field(description="Its accuracy threshold.")
    versions: list[EvalVersionOut] = Field(description="Evaluated versions, oldest first.")
