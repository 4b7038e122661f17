"""The rollout batch file format: Arrow schema, footer metadata and one sample (pure data).

See protocol/batches.py for the column list; the writer lives there and the validating reader
in protocol/batch_reader.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

FORMAT_VERSION = 1
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


class BatchMetadata(BaseModel):
    """Who produced the batch, for which lease, with which adapter, tokenizer and sampling."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    format_version: int = Field(FORMAT_VERSION, description="Batch file format version.")
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


@dataclass(frozen=True)
class RolloutSample:
    """One completion of one prompt."""

    prompt_row_id: int
    group_index: int
    prompt_token_ids: Sequence[int]
    completion_token_ids: Sequence[int]
    behaviour_logprobs: Sequence[float] | None  # None in eval batches
    finish_reason: str
