"""Wire models of the admin adapter reads."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class AdapterFileInfo(BaseModel):
    name: str = Field(description="File name, e.g. adapter_model.safetensors.")
    key: str = Field(description="Bucket key.")
    sha256: str | None = Field(description="Hex sha256 the download must match.")
    size: int | None = Field(description="Bytes, when recorded.")


class AdapterFileDownload(AdapterFileInfo):
    url: str = Field(description="Short-lived download URL.")
    expires_in_s: int = Field(description="Seconds the URL stays valid.")


class AdapterVersionOut(BaseModel):
    """One published adapter version."""

    run_id: uuid.UUID = Field(description="Run id.")
    version: int = Field(description="Version number (1, 2, …; 0 is the base model).")
    sha256: str = Field(description="sha256 recorded for the version.")
    bytes: int = Field(description="Total bytes of the adapter files.")
    learner_step: int = Field(description="Learner optimizer step at publication.")
    final: bool = Field(description="The run's last version.")
    best: bool = Field(
        description="The run's best version so far by its best metric (kept by retention)."
    )
    deleted: bool = Field(description="Its files were removed by retention.")
    created_at: datetime = Field(description="Publication time (database time).")
    metrics: dict[str, Any] = Field(description="Metrics the learner reported with it.")
    files: list[AdapterFileInfo] = Field(description="The PEFT files.")


class AdapterVersionDetail(AdapterVersionOut):
    """A version with a download URL per file."""

    base_model: str = Field(description="Base model the adapter applies to.")
    files: list[AdapterFileDownload] = Field(  # type: ignore[assignment]
        description="The PEFT files with short-lived download URLs."
    )
