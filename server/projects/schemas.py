"""Wire models of the projects API (docs/guides/projects.md)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# The one rule of a project's name: a lowercase slug, 1-63 characters, starting with a letter
# or digit (a DNS label, so that it can name a namespace or a bucket prefix as it is).
PROJECT_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
ProjectName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=63,
        pattern=PROJECT_NAME_PATTERN,
        description="The project's name: a lowercase slug of 1-63 characters (a-z, 0-9 and "
        "`-`, starting with a letter or digit).",
    ),
]


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ProjectName


class ProjectRename(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ProjectName


class ProjectOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID = Field(description="Project id.")
    name: str = Field(description="Its name (unique).")
    created_at: datetime = Field(description="When it was created (database time).")


class ProjectListed(ProjectOut):
    runs: int = Field(description="How many runs it has.")


def _name_of(value: object) -> object:
    return getattr(value, "name", value)


# A row's project as its wire models show it: the name (read from the row's `project`).
ProjectNameOf = Annotated[str, BeforeValidator(_name_of)]
