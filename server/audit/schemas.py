"""Wire models of the audit API (docs/guides/audit.md)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

Outcome = Literal["ok", "unauthorized", "forbidden", "suppressed"]


def as_utc(value: datetime) -> datetime:
    """A filter's time in UTC (no zone: UTC); ValueError for one UTC cannot hold (e.g.
    9999-12-31T23:00-14:00), which would otherwise fail at the query."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("a time outside the years 1 to 9999 in UTC") from None


FilterTime = Annotated[datetime, AfterValidator(as_utc)]


class AuditEntryOut(BaseModel):
    """One entry of the audit log."""

    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="The entry's id; the order entries were written in.")
    at: datetime = Field(description="When, in database time.")
    token_id: uuid.UUID | None = Field(description="The calling token's id; null: unknown.")
    token_name: str | None = Field(description="The calling token's name.")
    token_prefix: str | None = Field(description="The calling token's first characters.")
    role: str | None = Field(
        description="What the caller was: today the token's kind (admin, registration, "
        "worker, learner, pool_learner)."
    )
    project_id: uuid.UUID | None = Field(description="The project the object belongs to.")
    action: str = Field(
        description="What was done, e.g. `run.create`; for a refused call of a route that is "
        "not audited, its method and path."
    )
    object_type: str | None = Field(description="run, sweep, project, dataset, token, ...")
    object_id: str | None = Field(description="The object's id.")
    source: str | None = Field(description="The caller's address (see trusted_proxies).")
    outcome: Outcome = Field(
        description="ok (the change was made), unauthorized (401), forbidden (403), or "
        "suppressed (refusals over `audit.refusals_per_minute`, counted in `count`)."
    )
    count: int = Field(description="Calls this entry stands for: 1, or the suppressed ones.")
    detail: dict[str, Any] | None = Field(
        description="A few facts of the call, e.g. a refusal's status and error code."
    )


class AuditPage(BaseModel):
    entries: list[AuditEntryOut] = Field(description="Newest first.")
    next_cursor: int | None = Field(
        description="Pass as `cursor` for the next (older) page; null: this was the last."
    )
