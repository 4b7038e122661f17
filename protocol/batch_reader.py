"""The validating reader of rollout batch files: everything a worker uploads is untrusted.

`read_batch(path, expect)` returns the batch or raises `BatchRejected(reason, detail, check=)`:
`reason` is the wire reason the learner sends to `batches/{batch}/reject` (`checksum`,
`invalid`, `prompt_mismatch`; the learner's intake adds `reward_error`), `check` names the
precise failed check.

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
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from protocol.batch_format import BATCH_SCHEMA, FINISH_REASONS, METADATA_KEY, BatchMetadata
from protocol.batch_validate import RowError, check_rows

RejectReason = Literal["invalid", "checksum", "prompt_mismatch", "reward_error", "env_mismatch"]
LOGPROB_EPSILON = 1e-5
_MAGIC = b"PAR1"


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


def _check_schema(pf: pq.ParquetFile) -> None:
    try:
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _invalid("schema", f"unreadable schema: {exc}") from exc
    if schema.names != BATCH_SCHEMA.names:
        raise _invalid("schema", f"columns {schema.names} != {BATCH_SCHEMA.names}")
    for got, want in zip(schema, BATCH_SCHEMA, strict=True):
        if not got.type.equals(want.type):
            raise _invalid("schema", f"column {want.name}: type {got.type} != {want.type}")


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


def _check_footer(pf: pq.ParquetFile, expect: BatchExpectations) -> None:
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
    per_row = {
        "prompt_token_ids": limits.max_prompt_tokens,
        "completion_token_ids": expect.max_new_tokens,
        "behaviour_logprobs": 0 if expect.kind == "eval" else expect.max_new_tokens,
    }
    values = dict.fromkeys(BATCH_SCHEMA.names, 0)
    decoded = 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        if rg.num_columns != len(BATCH_SCHEMA):
            raise _invalid("footer", f"row group {g} has {rg.num_columns} columns")
        for c in range(rg.num_columns):
            col = rg.column(c)
            name = BATCH_SCHEMA.names[c]
            values[name] += max(col.num_values, 0)
            decoded += max(col.total_uncompressed_size, 0)
    n = md.num_rows
    for name, bound in per_row.items():
        if values[name] > n * (bound + 1):
            raise _invalid("list_too_long", f"{name}: {values[name]} values > {n} x {bound}")
    if decoded > limits.max_decoded_bytes:
        raise _invalid("too_large", f"{decoded} decoded bytes > {limits.max_decoded_bytes}")


def _read_table(pf: pq.ParquetFile) -> pa.Table:
    try:
        return pf.read(use_threads=False)
    except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
        raise _invalid("unreadable", f"cannot decode the data: {exc}") from exc


def read_batch(path: Path | str, expect: BatchExpectations) -> RolloutBatchData:
    """Validate and read a batch file, or raise BatchRejected with the failed check."""
    path = Path(path)
    _check_file(path, expect)
    pf = _open(path, expect.limits)
    _check_schema(pf)
    meta = _metadata(pf)
    _check_lease(meta, expect)
    _check_footer(pf, expect)
    table = _read_table(pf)
    if table.num_rows != expect.n_samples:
        raise _invalid("sample_count", f"decoded {table.num_rows} rows != {expect.n_samples}")
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


__all__ = [
    "BatchExpectations",
    "BatchLimits",
    "BatchRejected",
    "RejectReason",
    "RolloutBatchData",
    "read_batch",
]
