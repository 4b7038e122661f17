from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class RegistrationTokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=200, description="A label for the dashboard.")
    ttl_hours: float = Field(24.0, gt=0, le=24 * 365, description="Hours until it expires.")
    max_uses: int = Field(1, ge=1, le=100_000, description="Workers it may register.")


class RegistrationTokenCreated(BaseModel):
    id: uuid.UUID
    token: str = Field(description="The token itself; shown only in this response.")
    prefix: str
    expires_at: datetime | None
    max_uses: int | None
