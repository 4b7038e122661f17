"""Wire models of the datasets API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from server.projects.schemas import ProjectNameOf

DatasetKind = Literal["uploaded", "hf"]
DatasetStatus = Literal["pending", "ready", "failed"]
DatasetFormat = Literal["jsonl", "parquet"]


class DatasetOut(BaseModel):
    """A stored dataset."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID = Field(description="Dataset id; a run names it as {kind: uploaded, id}.")
    name: str = Field(description="Name given at upload (the file name), or the hf spec.")
    kind: DatasetKind = Field(description="uploaded (POST /api/v1/datasets) or hf.")
    status: DatasetStatus = Field(
        description="pending until a job has checked or loaded it, then ready or failed."
    )
    reason: str | None = Field(description="Why it failed.")
    format: DatasetFormat = Field(description="File format in the bucket.")
    sha256: str | None = Field(description="Hex sha256 of the stored file.")
    size_bytes: int | None = Field(description="Size of the stored file.")
    row_count: int | None = Field(description="Rows (known once the file is read).")
    columns: list[str] | None = Field(description="Column names.")
    fingerprint: str | None = Field(
        description="The file's sha256 for uploads; the `datasets` library's fingerprint for hf."
    )
    spec: dict[str, Any] | None = Field(description="The hf spec (path, name, split, …).")
    created_at: datetime = Field(description="Creation time (database time).")
    ready_at: datetime | None = Field(description="When it became ready.")
    project_id: uuid.UUID = Field(
        description="Its project: only that project's runs may read it (docs/guides/projects.md)."
    )
    project: ProjectNameOf = Field(description="Its project's name.")
