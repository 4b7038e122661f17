"""The `project` query parameter of the routes that create or list a project's rows (runs,
datasets): a name or an id, resolved by server/projects/service.py `resolve`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

ProjectQuery = Annotated[
    str | None,
    Query(
        max_length=63,
        description="A project's name or id (docs/guides/projects.md); on a create, the "
        "project it is made in (default: `default`); on a listing, only that project's.",
    ),
]
