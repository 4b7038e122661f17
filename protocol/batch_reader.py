"""The validating reader of rollout batch files: everything a worker uploads is untrusted.

`read_trajectories(path, expect)` reads either format (1: one completion per row; 2: one
trajectory per row) and returns one `TrajectoryRecord` per row; `read_batch(path, expect)` reads
format 1 only, as columns (the single-turn learner's view). Both raise `BatchRejected(reason,
detail, check=)`: `reason` is the wire reason the learner sends to `batches/{batch}/reject`
(`checksum`, `invalid`, `prompt_mismatch`; the learner's intake adds `reward_error` and
`env_mismatch`), `check` names the precise failed check.

Memory is bounded on a hostile file before anything is decoded: the file size, the footer
length (read from the last 8 bytes), Thrift limits on the footer, then the row count, row
groups, per-column value counts and uncompressed sizes from the footer. Only pyarrow reads the
file; nothing is unpickled or executed.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from protocol import parquet_pages
from protocol.batch_format import (
    BATCH_SCHEMA,
    FINISH_REASONS,
    FORMAT_VERSION,
    FORMAT_VERSION_V2,
    METADATA_KEY,
    TRAJECTORY_SCHEMA,
    BatchMetadata,
)
from protocol.batch_validate import RowError, check_rows
from protocol.trajectories import TranscriptMessage, TurnSpan

if TYPE_CHECKING:
    from protocol.environments import EnvironmentConfig

RejectReason = Literal["invalid", "checksum", "prompt_mismatch", "reward_error", "env_mismatch"]
LOGPROB_EPSILON = 1e-5
_MAGIC = b"PAR1"
# The column of each Parquet leaf, by format (format 2's spans struct has three leaves)
_LEAF_COLUMNS = {
    FORMAT_VERSION: list(BATCH_SCHEMA.names),
    FORMAT_VERSION_V2: [
        n for f in TRAJECTORY_SCHEMA for n in [f.name] * (3 if f.name == "spans" else 1)
    ],
}


class BatchRejected(Exception):
    """A batch file failed validation; `reason` is the wire reason, `check` the exact check."""

    def __init__(self, reason: RejectReason, detail: str, *, check: str) -> None:
        super().__init__(f"{reason} ({check}): {detail}")
        self.reason: RejectReason = reason
        self.detail = detail
        self.check = check


@dataclass(frozen=True)
class BatchLimits:
    """Hard bounds applied before decoding a file."""

    max_file_bytes: int = 256 << 20
    max_footer_bytes: int = 1 << 20
    max_decoded_bytes: int = 512 << 20
    max_prompt_tokens: int = 8192
    # format 2: a trajectory's tokens when the run's environment sets no max_total_tokens
    max_trajectory_tokens: int = 1 << 17
    max_row_groups: int = 64
    thrift_string_size_limit: int = 1 << 20
    thrift_container_size_limit: int = 100_000


@dataclass(frozen=True)
class BatchExpectations:
    """What the lease (and the learner's own tokenization) say the batch must be."""

    run_id: str
    lease_id: str
    fencing: int
    worker_id: str
    adapter_version: int
    adapter_sha256: str | None
    tokenizer_fingerprint: str
    prompt_row_ids: Sequence[int]
    group_size: int
    vocab_size: int
    max_new_tokens: int
    sha256: str | None = None
    sampling: Mapping[str, Any] | None = None
    prompt_token_ids: Mapping[int, Sequence[int]] | None = None
    limits: BatchLimits = field(default_factory=BatchLimits)
    # eval: behaviour_logprobs must be null in every row (and group_size is the eval's n)
    kind: Literal["train", "eval"] = "train"
    # the run's environment: a format 2 file must record exactly it, and its trajectories fit
    # its max_turns and max_total_tokens; a format 1 file is accepted only for single_turn.
    # None: not checked (format 2 then bounded by limits.max_trajectory_tokens).
    environment: EnvironmentConfig | None = None

    @property
    def n_samples(self) -> int:
        return len(self.prompt_row_ids) * self.group_size


@dataclass(frozen=True)
class RolloutBatchData:
    """A validated batch, rows sorted by (prompt_row_id, group_index)."""

    metadata: BatchMetadata
    prompt_row_ids: list[int]
    group_indices: list[int]
    prompt_token_ids: list[list[int]]
    completion_token_ids: list[list[int]]
    behaviour_logprobs: list[list[float]]  # empty lists in an eval batch
    finish_reasons: list[str]

    @property
    def n_samples(self) -> int:
        return len(self.prompt_row_ids)

    @property
    def n_tokens(self) -> int:
        return sum(len(c) for c in self.completion_token_ids)


@dataclass(frozen=True)
class TrajectoryRecord:
    """One validated row as a trajectory (protocol.trajectories.Trajectory's fields, plus the
    row's keys). A format 1 row is the trajectory [prompt, model]: mask 0…0 1…1, log-probs None
    on the prompt, no transcript (`messages` None: decode the model tokens), stop_reason `done`
    (finish reason `stop`) or `length`. In an eval batch every log-prob is None."""

    prompt_row_id: int
    group_index: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float | None]
    spans: list[TurnSpan]
    messages: list[TranscriptMessage] | None
    stop_reason: str
    tool_calls: int = 0
    tool_errors: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return self.spans[0].end

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.prompt_tokens]

    @property
    def model_token_ids(self) -> list[int]:
        """The trained tokens in order (format 1: the completion)."""
        return [t for t, m in zip(self.token_ids, self.loss_mask, strict=True) if m]

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def model_turns(self) -> int:
        return sum(span.kind == "model" for span in self.spans)


@dataclass(frozen=True)
class TrajectoryBatch:
    """A validated batch of either format as trajectories, rows sorted by (prompt_row_id,
    group_index)."""

    metadata: BatchMetadata
    rows: list[TrajectoryRecord]

    @property
    def format_version(self) -> int:
        return self.metadata.format_version

    @property
    def n_samples(self) -> int:
        return len(self.rows)

    @property
    def n_tokens(self) -> int:
        """Model (trained) tokens."""
        return sum(r.trained_tokens for r in self.rows)


def _invalid(check: str, detail: str) -> BatchRejected:
    return BatchRejected("invalid", detail, check=check)


def _check_file(path: Path, expect: BatchExpectations) -> int:
    """Size, checksum, magic bytes and footer length, before pyarrow sees the file."""
    limits = expect.limits
    try:
        size = path.stat().st_size
    except FileNotFoundError as exc:
        raise _invalid("missing", f"{path} does not exist") from exc
    if size > limits.max_file_bytes:
        raise _invalid("too_large", f"{size} bytes > limit {limits.max_file_bytes}")
    if expect.sha256 is not None:
        from protocol.storage import sha256_file

        actual = sha256_file(path)
        if actual != expect.sha256.lower():
            raise BatchRejected("checksum", f"sha256 {actual} != {expect.sha256}", check="sha256")
    if size < 12:
        raise _invalid("not_parquet", f"{size} bytes is too short for Parquet")
    with path.open("rb") as fh:
        head = fh.read(4)
        fh.seek(size - 8)
        tail = fh.read(8)
    if head != _MAGIC or tail[4:] != _MAGIC:
        raise _invalid("not_parquet", "missing PAR1 magic bytes")
    (footer_len,) = struct.unpack("<I", tail[:4])
    if footer_len > limits.max_footer_bytes or footer_len > size - 12:
        raise _invalid("footer", f"footer length {footer_len} is out of bounds")
    return size


def _open(path: Path, limits: BatchLimits) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(
            path,
            thrift_string_size_limit=limits.thrift_string_size_limit,
            thrift_container_size_limit=limits.thrift_container_size_limit,
        )
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _invalid("not_parquet", f"unreadable footer: {exc}") from exc


def _check_schema(pf: pq.ParquetFile) -> int:
    """The exact schema of format 1 or 2; returns which."""
    try:
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _invalid("schema", f"unreadable schema: {exc}") from exc
    version, want_schema = FORMAT_VERSION, BATCH_SCHEMA
    if schema.names == TRAJECTORY_SCHEMA.names:
        version, want_schema = FORMAT_VERSION_V2, TRAJECTORY_SCHEMA
    elif schema.names != BATCH_SCHEMA.names:
        raise _invalid("schema", f"columns {schema.names} != {BATCH_SCHEMA.names}")
    for got, want in zip(schema, want_schema, strict=True):
        if not got.type.equals(want.type):
            raise _invalid("schema", f"column {want.name}: type {got.type} != {want.type}")
    return version


def _metadata(pf: pq.ParquetFile) -> BatchMetadata:
    kv = pf.metadata.metadata or {}
    raw = kv.get(METADATA_KEY)
    if raw is None:
        raise _invalid("metadata", f"no {METADATA_KEY.decode()} key in the file metadata")
    try:
        return BatchMetadata.model_validate_json(raw)
    except (ValidationError, ValueError) as exc:
        raise _invalid("metadata", f"malformed metadata: {exc}") from exc


def _check_lease(meta: BatchMetadata, expect: BatchExpectations) -> None:
    """Every metadata field must match the lease; check = metadata_<field>."""
    wanted: dict[str, Any] = {
        "run_id": expect.run_id,
        "lease_id": expect.lease_id,
        "fencing": expect.fencing,
        "worker_id": expect.worker_id,
        "adapter_version": expect.adapter_version,
        "adapter_sha256": expect.adapter_sha256,
        "tokenizer_fingerprint": expect.tokenizer_fingerprint,
        "kind": expect.kind,
    }
    if expect.sampling is not None:
        wanted["sampling"] = dict(expect.sampling)
    for name, value in wanted.items():
        got = getattr(meta, name)
        if got != value:
            raise _invalid(f"metadata_{name}", f"{name} {got!r} != lease's {value!r}")
    _check_environment(meta, expect)


def _check_environment(meta: BatchMetadata, expect: BatchExpectations) -> None:
    env = expect.environment
    if meta.format_version == FORMAT_VERSION:
        if meta.environment is not None:
            raise _invalid("metadata_environment", "a format 1 batch records no environment")
        if env is not None and env.name != "single_turn":
            raise _invalid(
                "format_version",
                f"a format 1 (single-turn) batch for a run whose environment is {env.name!r}",
            )
        return
    if meta.environment is None:
        raise _invalid("metadata_environment", "a format 2 batch must record its environment")
    if env is not None and meta.environment != env.model_dump(mode="json"):
        raise _invalid(
            "metadata_environment",
            f"environment {meta.environment!r} != the run's {env.model_dump(mode='json')!r}",
        )


def max_trajectory_tokens(expect: BatchExpectations) -> int:
    env = expect.environment
    if env is not None and env.max_total_tokens is not None:
        return int(env.max_total_tokens)
    return expect.limits.max_trajectory_tokens


def max_spans(expect: BatchExpectations) -> int:
    """prompt + (model, environment) per turn: an upper bound on a trajectory's spans."""
    from protocol.environments import MAX_TURNS

    turns = expect.environment.turns if expect.environment is not None else MAX_TURNS
    return 2 * turns + 1


def _per_row_bounds(version: int, expect: BatchExpectations) -> dict[str, int]:
    logprobs = 0 if expect.kind == "eval" else None
    if version == FORMAT_VERSION:
        return {
            "prompt_token_ids": expect.limits.max_prompt_tokens,
            "completion_token_ids": expect.max_new_tokens,
            "behaviour_logprobs": expect.max_new_tokens if logprobs is None else logprobs,
        }
    tokens = max_trajectory_tokens(expect)
    return {
        "token_ids": tokens,
        "loss_mask": tokens,
        "behaviour_logprobs": tokens if logprobs is None else logprobs,
        "spans": max_spans(expect),
    }


def _check_footer(pf: pq.ParquetFile, expect: BatchExpectations, version: int) -> None:
    """Row count, row groups, value counts and decoded sizes claimed by the footer."""
    md = pf.metadata
    limits = expect.limits
    if md.num_rows == 0:
        raise _invalid("empty", "the batch has no rows")
    if md.num_rows != expect.n_samples:
        raise _invalid(
            "sample_count",
            f"{md.num_rows} rows != {len(expect.prompt_row_ids)} prompts x {expect.group_size}",
        )
    if md.num_row_groups > limits.max_row_groups:
        raise _invalid("footer", f"{md.num_row_groups} row groups > {limits.max_row_groups}")
    per_row = _per_row_bounds(version, expect)
    leaves = _LEAF_COLUMNS[version]
    per_leaf = [0] * len(leaves)
    decoded = 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        if rg.num_columns != len(leaves):
            raise _invalid("footer", f"row group {g} has {rg.num_columns} columns")
        for c in range(rg.num_columns):
            col = rg.column(c)
            per_leaf[c] += max(col.num_values, 0)
            decoded += max(col.total_uncompressed_size, 0)
    values: dict[str, int] = {}  # by column: its largest leaf (a struct list has several)
    for name, count in zip(leaves, per_leaf, strict=True):
        values[name] = max(values.get(name, 0), count)
    n = md.num_rows
    for name, bound in per_row.items():
        if values.get(name, 0) > n * (bound + 1):
            raise _invalid("list_too_long", f"{name}: {values[name]} values > {n} x {bound}")
    if decoded > limits.max_decoded_bytes:
        raise _invalid("too_large", f"{decoded} decoded bytes > {limits.max_decoded_bytes}")


def _read_table(pf: pq.ParquetFile) -> pa.Table:
    try:
        return pf.read(use_threads=False)
    except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
        raise _invalid("unreadable", f"cannot decode the data: {exc}") from exc


def _open_checked(path: Path, expect: BatchExpectations) -> tuple[pq.ParquetFile, BatchMetadata]:
    """Everything before decoding: file, footer, schema, metadata against the lease, bounds."""
    _check_file(path, expect)
    pf = _open(path, expect.limits)
    version = _check_schema(pf)
    meta = _metadata(pf)
    if meta.format_version != version:
        raise _invalid(
            "format_version", f"metadata says format {meta.format_version}, columns {version}"
        )
    _check_lease(meta, expect)
    _check_column_chunks(path, pf)
    _check_footer(pf, expect, version)
    return pf, meta


def _check_column_chunks(path: Path, pf: pq.ParquetFile) -> None:
    """Before `_check_footer` reads each column chunk's metadata: what pyarrow would end the
    process on is refused (protocol/parquet_pages.py)."""
    with path.open("rb") as raw:
        try:
            parquet_pages.check_column_chunks(raw, pf.metadata)
        except parquet_pages.PageError as exc:
            raise _invalid("footer", str(exc)) from None


def _decoded(pf: pq.ParquetFile, expect: BatchExpectations) -> pa.Table:
    table = _read_table(pf)
    if table.num_rows != expect.n_samples:
        raise _invalid("sample_count", f"decoded {table.num_rows} rows != {expect.n_samples}")
    return table


def _read_v1(
    pf: pq.ParquetFile, meta: BatchMetadata, expect: BatchExpectations
) -> RolloutBatchData:
    table = _decoded(pf, expect)
    try:
        rows = check_rows(table, expect, LOGPROB_EPSILON, FINISH_REASONS)
    except RowError as exc:
        raise BatchRejected(exc.reason, exc.detail, check=exc.check) from exc
    order = pa.array(rows.order)
    cols = {name: table.column(name).combine_chunks().take(order) for name in table.column_names}
    return RolloutBatchData(
        metadata=meta,
        prompt_row_ids=cols["prompt_row_id"].to_pylist(),
        group_indices=cols["group_index"].to_pylist(),
        prompt_token_ids=cols["prompt_token_ids"].to_pylist(),
        completion_token_ids=cols["completion_token_ids"].to_pylist(),
        behaviour_logprobs=(
            [[] for _ in range(table.num_rows)]
            if expect.kind == "eval"
            else cols["behaviour_logprobs"].to_pylist()
        ),
        finish_reasons=cols["finish_reason"].to_pylist(),
    )


def read_batch(path: Path | str, expect: BatchExpectations) -> RolloutBatchData:
    """Validate and read a format 1 batch file, or raise BatchRejected with the failed check
    (a format 2 file: `format_version`; read it with `read_trajectories`)."""
    pf, meta = _open_checked(Path(path), expect)
    if meta.format_version != FORMAT_VERSION:
        raise _invalid("format_version", "a format 2 (trajectory) batch: use read_trajectories")
    return _read_v1(pf, meta, expect)


def read_trajectories(path: Path | str, expect: BatchExpectations) -> TrajectoryBatch:
    """Validate and read a batch file of either format as trajectories, one `TrajectoryRecord`
    per row sorted by (prompt_row_id, group_index), or raise BatchRejected."""
    pf, meta = _open_checked(Path(path), expect)
    if meta.format_version == FORMAT_VERSION:
        return _v1_as_trajectories(_read_v1(pf, meta, expect))
    from protocol.batch_validate_v2 import check_trajectory_rows

    table = _decoded(pf, expect)
    try:
        rows = check_trajectory_rows(table, expect, LOGPROB_EPSILON)
    except RowError as exc:
        raise BatchRejected(exc.reason, exc.detail, check=exc.check) from exc
    return TrajectoryBatch(metadata=meta, rows=rows)


def _v1_as_trajectories(data: RolloutBatchData) -> TrajectoryBatch:
    rows = []
    for i in range(data.n_samples):
        prompt, completion = data.prompt_token_ids[i], data.completion_token_ids[i]
        p, n = len(prompt), len(prompt) + len(completion)
        logprobs: list[float | None] = [None] * n
        if data.behaviour_logprobs[i]:
            logprobs[p:] = data.behaviour_logprobs[i]
        rows.append(
            TrajectoryRecord(
                prompt_row_id=data.prompt_row_ids[i],
                group_index=data.group_indices[i],
                token_ids=prompt + completion,
                loss_mask=[0] * p + [1] * len(completion),
                logprobs=logprobs,
                spans=[
                    TurnSpan(kind="prompt", start=0, end=p),
                    TurnSpan(kind="model", start=p, end=n),
                ],
                messages=None,
                stop_reason="done" if data.finish_reasons[i] == "stop" else "length",
            )
        )
    return TrajectoryBatch(metadata=data.metadata, rows=rows)


__all__ = [
    "BatchExpectations",
    "BatchLimits",
    "BatchRejected",
    "RejectReason",
    "RolloutBatchData",
    "TrajectoryBatch",
    "TrajectoryRecord",
    "read_batch",
    "read_trajectories",
]
