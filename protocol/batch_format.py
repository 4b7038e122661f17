"""The rollout batch file formats: Arrow schemas, footer metadata and one sample (pure data).

Format 1 (single-turn: one row per completion) and format 2 (one row per trajectory,
docs/architecture/environments.md). See protocol/batches.py for the column lists; the writers
live there, the validating reader in protocol/batch_reader.py (`read_trajectories` reads both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from protocol.trajectories import Trajectory

FORMAT_VERSION: Final = 1
FORMAT_VERSION_V2: Final = 2
FORMAT_VERSIONS = (FORMAT_VERSION, FORMAT_VERSION_V2)
METADATA_KEY = b"asyncgrpo.batch"
FINISH_REASONS = ("stop", "length")

BATCH_SCHEMA = pa.schema(
    [
        pa.field("prompt_row_id", pa.int64(), nullable=False),
        pa.field("group_index", pa.int32(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("completion_token_ids", pa.list_(pa.int32()), nullable=False),
        # null in every row of an eval batch (eval samples are scored, never trained on)
        pa.field("behaviour_logprobs", pa.list_(pa.float32()), nullable=True),
        pa.field("finish_reason", pa.string(), nullable=False),
    ]
)
COLUMNS = tuple(BATCH_SCHEMA.names)

SPAN_TYPE = pa.struct(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("start", pa.int32(), nullable=False),
        pa.field("end", pa.int32(), nullable=False),
    ]
)
TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("prompt_row_id", pa.int64(), nullable=False),
        pa.field("group_index", pa.int32(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        # items null where the mask is 0; the whole column null in every row of an eval batch
        pa.field("behaviour_logprobs", pa.list_(pa.float32()), nullable=True),
        pa.field("spans", pa.list_(SPAN_TYPE), nullable=False),
        pa.field("transcript", pa.string(), nullable=False),  # JSON list of messages
        pa.field("stop_reason", pa.string(), nullable=False),
        pa.field("tool_calls", pa.int32(), nullable=False),
        pa.field("tool_errors", pa.int32(), nullable=False),
        pa.field("info", pa.string(), nullable=False),  # JSON object
    ]
)
TRAJECTORY_COLUMNS = tuple(TRAJECTORY_SCHEMA.names)


def schema_of(format_version: int) -> pa.Schema:
    return TRAJECTORY_SCHEMA if format_version == FORMAT_VERSION_V2 else BATCH_SCHEMA


class BatchMetadata(BaseModel):
    """Who produced the batch, for which lease, with which adapter, tokenizer and sampling."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    format_version: Literal[1, 2] = Field(
        FORMAT_VERSION, description="Batch file format version (1: completions, 2: trajectories)."
    )
    run_id: str = Field(description="Run id (UUID string).")
    lease_id: str = Field(description="Lease id (UUID string).")
    fencing: int = Field(description="The lease's fencing token.")
    worker_id: str = Field(description="Worker id (UUID string).")
    adapter_version: int = Field(description="Adapter version sampled with (0 = base model).")
    adapter_sha256: str | None = Field(description="That version's sha256 (None for version 0).")
    tokenizer_fingerprint: str = Field(description="protocol.fingerprint of the tokenizer used.")
    sampling: dict[str, Any] = Field(description="Sampling parameters (temperature, ...).")
    kind: Literal["train", "eval"] = Field(
        "train", description="train, or eval (no behaviour log-probs: the column is null)."
    )
    environment: dict[str, Any] | None = Field(
        None,
        description="Format 2: the run's environment config (EnvironmentConfig as JSON) the "
        "trajectories were rolled out with; absent in format 1.",
    )

    def footer_json(self) -> dict[str, Any]:
        """The footer's JSON: format 1 files keep exactly their historical keys."""
        out = self.model_dump(mode="json")
        if self.format_version == FORMAT_VERSION:
            out.pop("environment")
        return out


@dataclass(frozen=True)
class RolloutSample:
    """One completion of one prompt (format 1)."""

    prompt_row_id: int
    group_index: int
    prompt_token_ids: Sequence[int]
    completion_token_ids: Sequence[int]
    behaviour_logprobs: Sequence[float] | None  # None in eval batches
    finish_reason: str


@dataclass(frozen=True)
class TrajectorySample:
    """One trajectory of one prompt (format 2). An eval batch writes no behaviour log-probs
    whatever the trajectory holds."""

    prompt_row_id: int
    group_index: int
    trajectory: Trajectory
