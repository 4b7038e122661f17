from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from server.tokens.roles import Role


class RegistrationTokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = Field(None, max_length=200, description="A label for the dashboard.")
    ttl_hours: float = Field(24.0, gt=0, le=24 * 365, description="Hours until it expires.")
    max_uses: int = Field(1, ge=1, le=100_000, description="Workers it may register.")
    project: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="The project (name or id) whose runs the workers and pool learners it "
        "registers serve, and only those; none: a shared token, they serve every project.",
    )


class RegistrationTokenCreated(BaseModel):
    id: uuid.UUID
    token: str = Field(description="The token itself; shown only in this response.")
    prefix: str
    expires_at: datetime | None
    max_uses: int | None
    project_id: uuid.UUID | None = Field(
        description="Its project (what its workers and pool learners serve); null: shared."
    )


class TokenOut(BaseModel):
    """An admin, project or registration token as listed: never the token itself."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID = Field(description="The token's id (what revoke takes).")
    kind: str = Field(description="admin, project or registration.")
    prefix: str = Field(description="The token's first characters, to recognise it.")
    name: str | None = Field(description="Its label.")
    created_at: datetime = Field(description="When it was minted.")
    expires_at: datetime | None = Field(description="When it expires; null: never.")
    uses: int = Field(description="Registrations made with it (registration tokens).")
    max_uses: int | None = Field(description="Its use limit; null: none.")
    last_used_at: datetime | None = Field(description="Its last use, where counted.")
    revoked_at: datetime | None = Field(description="When it was revoked; null: live.")
    project_id: uuid.UUID | None = Field(
        description="A registration token's project: the workers and pool learners it "
        "registers serve only that project's runs; null: shared (every project). A project "
        "token's: the one it acts in; null for an admin token."
    )
    project: str | None = Field(description="That project's name; null: shared.")
    role: Role | None = Field(None, description="A project token's role; null otherwise.")

    @field_validator("project", mode="before")
    @classmethod
    def _project_name(cls, value: object) -> object:
        return getattr(value, "name", value)


class SessionsEnded(BaseModel):
    ended: int = Field(description="Dashboard sessions ended by this call.")


class ProjectTokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(
        min_length=1, max_length=200, description="Who or what holds it, e.g. `ci-main`."
    )
    role: Role = Field(description="What it may do in the project (docs/guides/projects.md).")
    ttl_hours: float | None = Field(
        None, gt=0, le=24 * 365 * 5, description="Hours until it expires; null: never."
    )


class ProjectTokenCreated(TokenOut):
    token: str = Field(description="The token itself; shown only in this response.")
