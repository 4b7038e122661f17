"""Rollout batch files: Parquet, one row per completion, lease metadata in the file footer.

Columns (docs/architecture.md, "Bucket layout and batch format"):
    prompt_row_id         int64          the PromptRow id
    group_index           int32          0..G-1 within the prompt's group
    prompt_token_ids      list<int32>    the chat-templated prompt, as the worker tokenized it
    completion_token_ids  list<int32>    sampled tokens (up to and including the first EOS)
    behaviour_logprobs    list<float32>  log_softmax(logits / T) of each sampled token (null in
                                         every row of an eval batch, never null in a training one)
    finish_reason         string         "stop" or "length"
File metadata (key `asyncgrpo.batch`, JSON): see `BatchMetadata`.

The writer is here; the validating reader is `protocol.batch_reader.read_batch` (re-exported).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from protocol.batch_format import (
    BATCH_SCHEMA,
    COLUMNS,
    FINISH_REASONS,
    FORMAT_VERSION,
    METADATA_KEY,
    BatchMetadata,
    RolloutSample,
)
from protocol.batch_reader import (
    BatchExpectations,
    BatchLimits,
    BatchRejected,
    RolloutBatchData,
    read_batch,
)
from protocol.storage import sha256_file


@dataclass(frozen=True)
class BatchFileInfo:
    """What the worker reports on complete: size, checksum and counts of the written file."""

    sha256: str
    bytes: int
    n_samples: int
    n_groups: int
    n_tokens: int


def samples_table(metadata: BatchMetadata, samples: Sequence[RolloutSample]) -> pa.Table:
    """The Arrow table of a batch, with its metadata in the schema."""
    arrays = [
        pa.array([s.prompt_row_id for s in samples], pa.int64()),
        pa.array([s.group_index for s in samples], pa.int32()),
        pa.array([list(s.prompt_token_ids) for s in samples], pa.list_(pa.int32())),
        pa.array([list(s.completion_token_ids) for s in samples], pa.list_(pa.int32())),
        pa.array(
            [None if s.behaviour_logprobs is None else list(s.behaviour_logprobs) for s in samples],
            pa.list_(pa.float32()),
        ),
        pa.array([s.finish_reason for s in samples], pa.string()),
    ]
    meta = {METADATA_KEY: json.dumps(metadata.model_dump(mode="json"), sort_keys=True).encode()}
    return pa.Table.from_arrays(arrays, schema=BATCH_SCHEMA.with_metadata(meta))


def write_batch(
    path: Path, metadata: BatchMetadata, samples: Sequence[RolloutSample]
) -> BatchFileInfo:
    """Write a batch file atomically (temporary file + rename) and return its size and sha256."""
    table = samples_table(metadata, samples)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return BatchFileInfo(
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        n_samples=len(samples),
        n_groups=len({s.prompt_row_id for s in samples}),
        n_tokens=sum(len(s.completion_token_ids) for s in samples),
    )


__all__ = [
    "BATCH_SCHEMA",
    "COLUMNS",
    "FINISH_REASONS",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "BatchExpectations",
    "BatchFileInfo",
    "BatchLimits",
    "BatchMetadata",
    "BatchRejected",
    "RolloutBatchData",
    "RolloutSample",
    "read_batch",
    "samples_table",
    "write_batch",
]
