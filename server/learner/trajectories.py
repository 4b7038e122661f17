"""Admin read of one trajectory of a format 2 batch (the run page's transcript view): the
object is read from the store with pyarrow, the server having no tokenizer: spans are token
counts, the transcript's model messages are what was trained."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

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
from server.models import RolloutBatch

# A batch larger than this is not downloaded for a sample (the upload limits keep real batches
# far below it); one message's text is cut at MAX_MESSAGE_CHARS.
MAX_SAMPLE_BATCH_BYTES = 256 * 1024 * 1024
MAX_MESSAGE_CHARS = 8000
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
_SPANS = TypeAdapter(list[TurnSpan])


def latest_batch_id(session: Session, run_id: uuid.UUID) -> uuid.UUID | None:
    """The run's most recent consumed (else accepted or claimed) training batch."""
    for states in (("consumed",), ("accepted", "claimed")):
        found = session.execute(
            select(RolloutBatch.id)
            .where(
                RolloutBatch.run_id == run_id,
                RolloutBatch.kind == "train",
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
    table = _read_table(store, batch)
    keys = list(zip(*(table[name].to_pylist() for name in KEY_COLUMNS), strict=True))
    if any(None in key or not all(isinstance(k, int) for k in key) for key in keys):
        raise Unprocessable(
            "a row of the batch has no integer prompt_row_id and group_index",
            field="batch_id",
            code=ErrorCode.batch_unreadable,
        )
    order = sorted(range(table.num_rows), key=keys.__getitem__)
    if row >= len(order):
        raise Unprocessable(
            f"row {row} is outside the batch's {len(order)} rows",
            field="row",
            code=ErrorCode.row_out_of_range,
        )
    values = {name: table[name][order[row]].as_py() for name in COLUMNS}
    return _sample_out(batch, row, len(order), values)


def _read_table(store: ObjectStore, batch: RolloutBatch) -> pa.Table:
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-sample-") as folder:
        path = Path(folder) / "batch.parquet"
        try:
            store.download_file(batch.bucket_key, path)
        except ObjectNotFound as exc:
            raise NotFound(
                "the batch's object is no longer in the store",
                batch_id=str(batch.id),
                code=ErrorCode.batch_object_missing,
            ) from exc
        try:
            pf = pq.ParquetFile(path)
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
            return pf.read(columns=COLUMNS)
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


def _sample_out(
    batch: RolloutBatch, row: int, rows: int, values: dict[str, Any]
) -> TrajectorySampleOut:
    empty = [name for name, value in values.items() if value is None]
    if empty:
        raise Unprocessable(
            f"the row has no {', '.join(empty)}", field="row", code=ErrorCode.row_unreadable
        )
    try:
        spans = _SPANS.validate_python(values["spans"])
        messages = _MESSAGES.validate_json(values["transcript"])
        info = json.loads(values["info"], parse_constant=_no_constant)
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
        total_tokens=len(values["token_ids"]),
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
