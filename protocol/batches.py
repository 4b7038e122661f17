"""Rollout batch files: Parquet, lease metadata in the file footer (key `asyncgrpo.batch`).

Format 1, one row per completion (docs/architecture/bucket.md, "Batch file"):
    prompt_row_id         int64          the PromptRow id
    group_index           int32          0..G-1 within the prompt's group
    prompt_token_ids      list<int32>    the chat-templated prompt, as the worker tokenized it
    completion_token_ids  list<int32>    sampled tokens (up to and including the first EOS)
    behaviour_logprobs    list<float32>  log_softmax(logits / T) of each sampled token (null in
                                         every row of an eval batch, never null in a training one)
    finish_reason         string         "stop" or "length"
Format 2, one row per trajectory (docs/architecture/environments.md, "Batch format v2"):
    prompt_row_id, group_index                as format 1
    token_ids             list<int32>         the whole trajectory, prompt first
    loss_mask             list<int8>          1 on model-turn tokens
    behaviour_logprobs    list<float32?>      aligned with token_ids, null where the mask is 0
                                              (the whole column null in an eval batch)
    spans                 list<struct<kind, start, end>>   the turn boundaries
    transcript            string              the messages, JSON
    stop_reason           string              why the rollout ended
    tool_calls, tool_errors  int32            counts
    info                  string              the environment's outcome, JSON object
File metadata (key `asyncgrpo.batch`, JSON): see `BatchMetadata` (format 2 adds the run's
`environment`).

The writers are here; the validating readers are `protocol.batch_reader.read_batch` (format 1,
the single-turn learner's view) and `read_trajectories` (both formats, as trajectories).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from protocol.batch_format import (
    BATCH_SCHEMA,
    COLUMNS,
    FINISH_REASONS,
    FORMAT_VERSION,
    FORMAT_VERSION_V2,
    METADATA_KEY,
    SPAN_TYPE,
    TRAJECTORY_COLUMNS,
    TRAJECTORY_SCHEMA,
    BatchMetadata,
    RolloutSample,
    TrajectorySample,
)
from protocol.batch_reader import (
    BatchExpectations,
    BatchLimits,
    BatchRejected,
    RolloutBatchData,
    TrajectoryBatch,
    TrajectoryRecord,
    read_batch,
    read_trajectories,
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
    if metadata.format_version != FORMAT_VERSION:
        raise ValueError("samples_table writes format 1; trajectories_table writes format 2")
    return pa.Table.from_arrays(arrays, schema=BATCH_SCHEMA.with_metadata(_footer(metadata)))


def _footer(metadata: BatchMetadata) -> dict[bytes, bytes]:
    return {METADATA_KEY: json.dumps(metadata.footer_json(), sort_keys=True).encode()}


def trajectories_table(metadata: BatchMetadata, samples: Sequence[TrajectorySample]) -> pa.Table:
    """The Arrow table of a format 2 batch (its metadata must say format 2 and carry the run's
    environment)."""
    if metadata.format_version != FORMAT_VERSION_V2 or metadata.environment is None:
        raise ValueError("a trajectory batch needs format_version 2 and the run's environment")
    ts = [s.trajectory for s in samples]
    eval_batch = metadata.kind == "eval"
    arrays = [
        pa.array([s.prompt_row_id for s in samples], pa.int64()),
        pa.array([s.group_index for s in samples], pa.int32()),
        pa.array([t.token_ids for t in ts], pa.list_(pa.int32())),
        pa.array([t.loss_mask for t in ts], pa.list_(pa.int8())),
        pa.array([None if eval_batch else t.logprobs for t in ts], pa.list_(pa.float32())),
        pa.array([[s.model_dump() for s in t.spans] for t in ts], pa.list_(SPAN_TYPE)),
        pa.array([_messages_json(t) for t in ts], pa.string()),
        pa.array([t.stop_reason for t in ts], pa.string()),
        pa.array([t.tool_calls for t in ts], pa.int32()),
        pa.array([t.tool_errors for t in ts], pa.int32()),
        pa.array([json.dumps(t.info, sort_keys=True) for t in ts], pa.string()),
    ]
    return pa.Table.from_arrays(arrays, schema=TRAJECTORY_SCHEMA.with_metadata(_footer(metadata)))


def _messages_json(t: Any) -> str:
    return json.dumps([m.model_dump(mode="json") for m in t.messages], ensure_ascii=False)


# Row groups of about this many decoded bytes (at most MAX_ROW_GROUPS of them): a reader that
# shows one row (the server's trajectory view) decodes its row group only.
ROW_GROUP_BYTES = 32 * 1024 * 1024
MAX_ROW_GROUPS = 32


def _write(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd", row_group_size=_group_rows(table))
    os.replace(tmp, path)


def _group_rows(table: pa.Table) -> int:
    rows = table.num_rows
    by_bytes = rows * ROW_GROUP_BYTES // max(table.nbytes, 1)
    return max(1, -(-rows // MAX_ROW_GROUPS), by_bytes)


def _info(path: Path, n_samples: int, n_groups: int, n_tokens: int) -> BatchFileInfo:
    return BatchFileInfo(
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        n_samples=n_samples,
        n_groups=n_groups,
        n_tokens=n_tokens,
    )


def write_batch(
    path: Path, metadata: BatchMetadata, samples: Sequence[RolloutSample]
) -> BatchFileInfo:
    """Write a format 1 batch file atomically (temporary file + rename); its size and sha256."""
    _write(path, samples_table(metadata, samples))
    return _info(
        path,
        len(samples),
        len({s.prompt_row_id for s in samples}),
        sum(len(s.completion_token_ids) for s in samples),
    )


def write_trajectory_batch(
    path: Path, metadata: BatchMetadata, samples: Sequence[TrajectorySample]
) -> BatchFileInfo:
    """Write a format 2 batch file atomically; `n_tokens` counts model (trained) tokens."""
    _write(path, trajectories_table(metadata, samples))
    return _info(
        path,
        len(samples),
        len({s.prompt_row_id for s in samples}),
        sum(s.trajectory.trained_tokens for s in samples),
    )


__all__ = [
    "BATCH_SCHEMA",
    "COLUMNS",
    "FINISH_REASONS",
    "FORMAT_VERSION",
    "FORMAT_VERSION_V2",
    "METADATA_KEY",
    "TRAJECTORY_COLUMNS",
    "TRAJECTORY_SCHEMA",
    "BatchExpectations",
    "BatchFileInfo",
    "BatchLimits",
    "BatchMetadata",
    "BatchRejected",
    "RolloutBatchData",
    "RolloutSample",
    "TrajectoryBatch",
    "TrajectoryRecord",
    "TrajectorySample",
    "read_batch",
    "read_trajectories",
    "samples_table",
    "trajectories_table",
    "write_batch",
    "write_trajectory_batch",
]
