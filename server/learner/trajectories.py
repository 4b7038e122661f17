"""Admin read of one trajectory of a format 2 batch (the run page's transcript view): the
object is read from the store with pyarrow, the server having no tokenizer: spans are token
counts, the transcript's model messages are what was trained."""

from __future__ import annotations

import codecs
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from protocol import parquet_pages
from protocol.batch_format import FORMAT_VERSION_V2, METADATA_KEY
from protocol.error_codes import ErrorCode
from protocol.schemas import check_free_json
from protocol.storage import ObjectNotFound, ObjectStore
from protocol.trajectories import TranscriptMessage, TurnSpan
from server.errors import NotFound, PayloadTooLarge, Unprocessable
from server.learner import repository as repo
from server.learner.schemas import (
    SampleMessage,
    SampleSpan,
    SampleToolCall,
    TrajectorySampleOut,
)
from server.leases import ledger
from server.models import RolloutBatch

# A batch larger than this is not downloaded for a sample (the upload limits keep real batches
# far below it); one message's text is cut at MAX_MESSAGE_CHARS.
MAX_SAMPLE_BATCH_BYTES = 256 * 1024 * 1024
MAX_MESSAGE_CHARS = 8000
# Only the row shown is kept, and what is decoded is bounded as the page headers describe it
# (pyarrow decompresses whole pages, and one page may hold every value of the row group): a
# column of a row group is decoded only when its pages take at most MAX_DECODED_BYTES, in record
# batches of about SAMPLE_READ_BYTES; a transcript or info over that bound is not decoded, and of
# a decoded one at most MAX_TRANSCRIPT_BYTES is parsed (the messages that fit). The answer says
# what was cut.
MAX_DECODED_BYTES = 64 * 1024 * 1024
SAMPLE_READ_BYTES = 16 * 1024 * 1024
READ_BUFFER_BYTES = 1024 * 1024
MAX_TRANSCRIPT_BYTES = 1024 * 1024
TEXT_COLUMNS = ("transcript", "info")
KEY_COLUMNS = ("prompt_row_id", "group_index")
COLUMNS = [
    "prompt_row_id",
    "group_index",
    "token_ids",
    "spans",
    "transcript",
    "stop_reason",
    "tool_calls",
    "tool_errors",
    "info",
]
_MESSAGES = TypeAdapter(list[TranscriptMessage])
_MESSAGE = TypeAdapter(TranscriptMessage)
_SPANS = TypeAdapter(list[TurnSpan])


def latest_batch_id(session: Session, run_id: uuid.UUID) -> uuid.UUID | None:
    """The run's most recent consumed (else accepted or claimed) training batch."""
    for states in (("consumed",), ("accepted", "claimed")):
        found = session.execute(
            select(RolloutBatch.id)
            .where(
                RolloutBatch.run_id == run_id,
                ledger.trained(RolloutBatch.kind),
                RolloutBatch.state.in_(states),
            )
            .order_by(RolloutBatch.created_at.desc(), RolloutBatch.id.desc())
            .limit(1)
        ).scalar_one_or_none()
        if found is not None:
            return found
    return None


def sample(
    session: Session, store: ObjectStore, run_id: uuid.UUID, batch_id: uuid.UUID | None, row: int
) -> TrajectorySampleOut:
    if repo.get_run(session, run_id) is None:
        raise NotFound("run not found", code=ErrorCode.run_not_found)
    if batch_id is None:
        batch_id = latest_batch_id(session, run_id)
        if batch_id is None:
            raise NotFound(
                "the run has no accepted or consumed batch yet", code=ErrorCode.batch_not_found
            )
    batch = repo.get_batch(session, run_id, batch_id)
    if batch is None:
        raise NotFound("batch not found", batch_id=str(batch_id), code=ErrorCode.batch_not_found)
    if batch.bytes > MAX_SAMPLE_BATCH_BYTES:
        raise PayloadTooLarge(
            f"batch of {batch.bytes} bytes is above the sample bound {MAX_SAMPLE_BATCH_BYTES}",
            batch_id=str(batch_id),
            code=ErrorCode.batch_too_large,
        )
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-sample-") as folder:
        path = Path(folder) / "batch.parquet"
        _download(store, batch, path)
        rows, values = _read_row(path, row)
    return _sample_out(batch, row, rows, values)


def _download(store: ObjectStore, batch: RolloutBatch, path: Path) -> None:
    try:
        store.download_file(batch.bucket_key, path)
    except ObjectNotFound as exc:
        raise NotFound(
            "the batch's object is no longer in the store",
            batch_id=str(batch.id),
            code=ErrorCode.batch_object_missing,
        ) from exc


def _read_row(path: Path, row: int) -> tuple[int, dict[str, Any]]:
    """(rows in the batch, the values of the row-th row in (prompt_row_id, group_index)
    order): the key columns of every row, then the other columns of that one row."""
    try:
        pf = _open_v2(path)
        keys = _keys(pf)
        order = sorted(range(len(keys)), key=keys.__getitem__)
        if row >= len(order):
            raise Unprocessable(
                f"row {row} is outside the batch's {len(order)} rows",
                field="row",
                code=ErrorCode.row_out_of_range,
            )
        return len(order), _values_at(pf, order[row])
    except (pa.ArrowException, OSError, ValueError, KeyError) as exc:
        raise Unprocessable(
            f"the batch's object cannot be read: {exc}",
            field="batch_id",
            code=ErrorCode.batch_unreadable,
        ) from exc
    except RecursionError:  # a footer nested past the JSON parser's stack
        raise Unprocessable(
            "the batch's footer is nested too deeply",
            field="batch_id",
            code=ErrorCode.batch_unreadable,
        ) from None


def _open_v2(path: Path) -> _Batch:
    pf = _Batch(path)
    meta = json.loads((pf.metadata.metadata or {}).get(METADATA_KEY, b"{}"))
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION_V2:
        raise Unprocessable(
            "the batch is not a trajectory batch (format 2): single-turn batches carry "
            "no transcript",
            field="batch_id",
            code=ErrorCode.batch_unreadable,
        )
    missing = [name for name in COLUMNS if name not in pf.schema_arrow.names]
    if missing:
        raise Unprocessable(
            f"the batch lacks the column(s) {', '.join(missing)}",
            field="batch_id",
            code=ErrorCode.batch_unreadable,
        )
    return pf


def _keys(pf: _Batch) -> list[tuple[int, int]]:
    columns: list[list[Any]] = [[], []]
    for group in range(pf.metadata.num_row_groups):
        _check_decodable(pf, group, list(KEY_COLUMNS))
        for part in _batches(pf, group, list(KEY_COLUMNS)):
            for values, name in zip(columns, KEY_COLUMNS, strict=True):
                values.extend(part[name].to_pylist())
    keys = list(zip(*columns, strict=True))
    if any(None in key or not all(isinstance(k, int) for k in key) for key in keys):
        raise Unprocessable(
            "a row of the batch has no integer prompt_row_id and group_index",
            field="batch_id",
            code=ErrorCode.batch_unreadable,
        )
    return keys


def _values_at(pf: _Batch, index: int) -> dict[str, Any]:
    """The values of the index-th row in file order, from its row group only."""
    group, offset = _locate(pf, index)
    plain = [name for name in COLUMNS if name not in TEXT_COLUMNS]
    _check_decodable(pf, group, plain)
    values = _row_values(_row_of(pf, group, offset, plain))
    sizes = pf.column_bytes(group)
    for name in TEXT_COLUMNS:
        if sizes.get(name, 0) > MAX_DECODED_BYTES:
            values.update({name: "", f"{name}_bytes": None, f"{name}_cut": True})
        else:
            values.update(_text_value(_row_of(pf, group, offset, [name]), name))
    return values


def _locate(pf: _Batch, index: int) -> tuple[int, int]:
    """(row group, row within it) of the index-th row in file order."""
    first = 0
    for group in range(pf.metadata.num_row_groups):
        rows = pf.metadata.row_group(group).num_rows
        if index < first + rows:
            return group, index - first
        first += rows
    raise Unprocessable(
        "the batch's row groups do not hold its rows",
        field="batch_id",
        code=ErrorCode.batch_unreadable,
    )


class _Batch(pq.ParquetFile):
    """The batch file, and the decoded bytes of each top-level column of a row group as its
    page headers say (pyarrow decompresses exactly that; the footer's totals are not
    trusted)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)
        self.path = path
        self.sizes: dict[int, dict[str, int]] = {}
        self.pages_left = [parquet_pages.MAX_PAGES]  # for the whole file, however many groups
        with open(path, "rb") as raw:
            parquet_pages.check_column_chunks(raw, self.metadata)

    def column_bytes(self, group: int) -> dict[str, int]:
        if group not in self.sizes:
            with open(self.path, "rb") as raw:
                chunks = parquet_pages.row_group_pages(
                    raw, self.metadata, group, None, self.pages_left
                )
            sizes: dict[str, int] = {}
            for chunk in chunks:
                name = chunk.column.split(".")[0]
                sizes[name] = sizes.get(name, 0) + chunk.total
            self.sizes[group] = sizes
        return self.sizes[group]


def _check_decodable(pf: _Batch, group: int, columns: list[str]) -> None:
    sizes = pf.column_bytes(group)
    size = sum(sizes.get(name, 0) for name in columns)
    if size > MAX_DECODED_BYTES:
        raise Unprocessable(
            f"the batch's {', '.join(columns)} take {size:,} bytes decoded in row group {group}, "
            f"over the view's bound of {MAX_DECODED_BYTES:,}",
            field="batch_id",
            code=ErrorCode.batch_too_large_to_show,
        )


def _row_of(pf: _Batch, group: int, offset: int, columns: list[str]) -> pa.RecordBatch:
    """Row `offset` of the row group, of `columns`: the row group is read in record batches,
    and each batch but the one holding the row is dropped as soon as it is read."""
    first = 0
    for part in _batches(pf, group, columns):
        if offset < first + part.num_rows:
            return part.slice(offset - first, 1)
        first += part.num_rows
    raise Unprocessable(
        "the batch's row groups do not hold its rows",
        field="batch_id",
        code=ErrorCode.batch_unreadable,
    )


def _batches(pf: _Batch, group: int, columns: list[str]) -> Any:
    """Record batches of `columns` in the row group, each about SAMPLE_READ_BYTES decoded."""
    meta = pf.metadata.row_group(group)
    sizes = pf.column_bytes(group)
    size = sum(sizes.get(name, 0) for name in columns)
    rows = max(1, min(65_536, SAMPLE_READ_BYTES * meta.num_rows // max(size, 1)))
    return pf.iter_batches(batch_size=rows, row_groups=[group], columns=columns, use_threads=False)


def _row_values(one: pa.RecordBatch) -> dict[str, Any]:
    """The row's values, token_ids as its length (the server shows counts, not tokens)."""
    values: dict[str, Any] = {}
    for name in one.schema.names:
        column = one.column(name)
        if name == "token_ids":
            values[name] = pc.list_value_length(column)[0].as_py()
        else:
            values[name] = column[0].as_py()
    return values


def _text_value(one: pa.RecordBatch, name: str) -> dict[str, Any]:
    """A text column's value cut at MAX_TRANSCRIPT_BYTES before it becomes a Python string."""
    column = one.column(name)
    if not pa.types.is_string(column.type):
        return {name: column[0].as_py(), f"{name}_bytes": None, f"{name}_cut": False}
    size = pc.binary_length(column)[0].as_py()
    text = None if size is None else _cut(column, MAX_TRANSCRIPT_BYTES)
    return {name: text, f"{name}_bytes": size, f"{name}_cut": (size or 0) > MAX_TRANSCRIPT_BYTES}


def _cut(column: pa.Array, max_bytes: int) -> str:
    """The first max_bytes of the value as text (a UTF-8 sequence cut at the end is dropped;
    bytes that are not UTF-8 before it raise UnicodeDecodeError, a ValueError)."""
    head = pc.binary_slice(column.cast(pa.binary()), 0, max_bytes)[0].as_py()
    text: str = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    return text


def _messages(text: str, truncated: bool) -> list[TranscriptMessage]:
    """The transcript's messages; of a cut transcript, the messages wholly within the cut."""
    if not truncated:
        return _MESSAGES.validate_json(text)
    if not text:  # not decoded
        return []
    decoder = json.JSONDecoder()
    at = _past_space(text, 0)
    if not text.startswith("[", at):
        raise ValueError("the transcript is not a JSON list")
    messages: list[TranscriptMessage] = []
    at += 1
    while True:
        try:
            value, end = decoder.raw_decode(text, _past_space(text, at))
        except json.JSONDecodeError:
            return messages  # the message the cut goes through
        messages.append(_MESSAGE.validate_python(value))
        at = _past_space(text, end)
        if not text.startswith(",", at):
            return messages
        at += 1


def _past_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _sample_out(
    batch: RolloutBatch, row: int, rows: int, values: dict[str, Any]
) -> TrajectorySampleOut:
    empty = [name for name in COLUMNS if values.get(name) is None]
    if empty:
        raise Unprocessable(
            f"the row has no {', '.join(empty)}", field="row", code=ErrorCode.row_unreadable
        )
    try:
        spans = _SPANS.validate_python(values["spans"])
        messages = _messages(values["transcript"], _cut_off(values, "transcript"))
        info = {} if _cut_off(values, "info") else _info(values["info"])
        # as the response is encoded: no unpaired surrogate (not UTF-8), bounded depth
        check_free_json(info, MAX_SAMPLE_BATCH_BYTES)
        return _out(batch, row, rows, values, spans, messages, info)
    except RecursionError:  # json.loads on nesting past the parser's stack
        raise Unprocessable(
            "the row's info is nested too deeply", field="row", code=ErrorCode.row_unreadable
        ) from None
    except (ValidationError, ValueError, TypeError) as exc:
        raise Unprocessable(
            f"the row's transcript, spans or counts do not parse: {exc}",
            field="row",
            code=ErrorCode.row_unreadable,
        ) from exc


def _cut_off(values: dict[str, Any], name: str) -> bool:
    return bool(values.get(f"{name}_cut"))


def _info(text: Any) -> Any:
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise ValueError(f"info holds {name}, which is not JSON")


def _out(
    batch: RolloutBatch,
    row: int,
    rows: int,
    values: dict[str, Any],
    spans: list[TurnSpan],
    messages: list[TranscriptMessage],
    info: Any,
) -> TrajectorySampleOut:
    return TrajectorySampleOut(
        run_id=batch.run_id,
        batch_id=batch.id,
        batch_state=batch.state,
        adapter_version=batch.adapter_version,
        row=row,
        rows=rows,
        prompt_row_id=values["prompt_row_id"],
        group_index=values["group_index"],
        stop_reason=values["stop_reason"],
        tool_calls=values["tool_calls"],
        tool_errors=values["tool_errors"],
        total_tokens=values["token_ids"],
        trained_tokens=sum(s.end - s.start for s in spans if s.kind == "model"),
        spans=[
            SampleSpan(
                kind=s.kind,
                start=s.start,
                end=s.end,
                tokens=s.end - s.start,
                trained=s.kind == "model",
            )
            for s in spans
        ],
        messages=[_message(m) for m in messages],
        info=info if isinstance(info, dict) else {"value": info},
        transcript_bytes=values.get("transcript_bytes"),
        transcript_truncated=_cut_off(values, "transcript"),
        info_truncated=_cut_off(values, "info"),
    )


def _message(m: TranscriptMessage) -> SampleMessage:
    return SampleMessage(
        role=m.role,
        kind=m.kind,
        name=m.name,
        content=m.content[:MAX_MESSAGE_CHARS],
        truncated=len(m.content) > MAX_MESSAGE_CHARS,
        trained=m.kind == "model",
        tool_calls=[SampleToolCall(name=c.name, arguments=c.arguments) for c in m.tool_calls],
    )
