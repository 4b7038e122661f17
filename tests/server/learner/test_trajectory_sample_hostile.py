"""`GET /api/v1/runs/{id}/trajectories/sample` on batch objects a hostile worker wrote: the
server accepts a batch at `complete` on its sha256 alone (the learner's validating reader
judges the content), so the sample reads whatever bytes are in the store. Every malformed
object is a 422 naming what is wrong, never a 500."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from protocol.batch_format import METADATA_KEY
from protocol.batches import trajectories_table
from tests.protocol import trajectory_factory as tf
from tests.server.learner.support import make_run
from tests.server.learner.test_trajectory_sample import ENVIRONMENT, _batch_with, _get

pytestmark = pytest.mark.timeout(60)


def _honest(run_id: uuid.UUID) -> pa.Table:
    return trajectories_table(tf.make_meta(run_id=str(run_id)), tf.make_samples(seed=3))


def _footer(table: pa.Table, footer: bytes | None = None) -> pa.Table:
    """The table with every field nullable (as a hostile writer may declare it)."""
    schema = pa.schema([f.with_nullable(True) for f in table.schema])
    out = table.cast(schema)
    meta = dict(table.schema.metadata or {})
    if footer is not None:
        meta[METADATA_KEY] = footer
    return out.replace_schema_metadata(meta)


def _set(table: pa.Table, name: str, values: list[Any], type_: Any = None) -> pa.Table:
    field = table.schema.field(name)
    column = pa.array(values, type=type_ or field.type)
    at = table.schema.get_field_index(name)
    return table.set_column(at, pa.field(name, column.type, nullable=True), column)


def _bytes(table: pa.Table, name: str, raw: bytes) -> pa.Table:
    """The string column `name` holding `raw` in every row, unchecked (not UTF-8)."""
    column = pa.array([raw] * table.num_rows, pa.binary()).view(pa.string())
    at = table.schema.get_field_index(name)
    return table.set_column(at, pa.field(name, pa.string(), nullable=True), column)


def _doctored(table: pa.Table, name: str, value: Any, type_: Any = None) -> pa.Table:
    return _set(table, name, [value] * table.num_rows, type_)


CASES = {
    "null stop_reason": lambda t: _doctored(t, "stop_reason", None),
    "null tool_calls": lambda t: _doctored(t, "tool_calls", None),
    "null token_ids": lambda t: _doctored(t, "token_ids", None),
    "null transcript": lambda t: _doctored(t, "transcript", None),
    "null spans": lambda t: _doctored(t, "spans", None),
    "null prompt_row_id in one row": lambda t: _set(
        t, "prompt_row_id", [None, *t["prompt_row_id"].to_pylist()[1:]]
    ),
    "prompt_row_id as text": lambda t: _doctored(t, "prompt_row_id", "7", pa.string()),
    "tool_calls as text": lambda t: _doctored(t, "tool_calls", "many", pa.string()),
    "info NaN": lambda t: _doctored(t, "info", "NaN"),
    "info Infinity in an object": lambda t: _doctored(t, "info", '{"a": Infinity}'),
    "info not JSON": lambda t: _doctored(t, "info", "{"),
    "spans as text": lambda t: _doctored(t, "spans", "[]", pa.string()),
    "a column missing": lambda t: t.drop_columns(["stop_reason"]),
    "info nested past the parser's stack": lambda t: _doctored(t, "info", "[" * 100_000),
    "info with an unpaired surrogate": lambda t: _doctored(t, "info", '{"a": "\\ud800"}'),
    "transcript not UTF-8": lambda t: _bytes(t, "transcript", b"\xff\xfe\xfd\xfc"),
    "info not UTF-8": lambda t: _bytes(t, "info", b'{"a": "\xc3("}'),
    "transcript with an unpaired surrogate": lambda t: _set(
        t,
        "transcript",
        [
            x.replace('"content": "', '"content": "\\udc00', 1) if x else x
            for x in t["transcript"].to_pylist()
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_doctored_row_is_422(app, client, admin_headers, tmp_path: Path, case: str) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    table = CASES[case](_footer(_honest(run.id)))
    table = table.replace_schema_metadata(_honest(run.id).schema.metadata)
    path = tmp_path / "doctored.parquet"
    pq.write_table(table, path)
    batch_id = _batch_with(app, run.id, path)
    for row in (0, 1):
        answer = _get(client, run.id, admin_headers, batch_id=str(batch_id), row=row)
        assert answer.status_code == 422, (case, answer.status_code, answer.text)
        assert answer.json()["field"] in ("row", "batch_id"), answer.text


@pytest.mark.parametrize(
    "footer",
    [b"[2]", b'"2"', b"2", b"null", b"{", b'{"format_version": "2"}', b"\xff", b"[" * 100_000],
)
def test_a_footer_that_is_not_an_object_is_422(
    app, client, admin_headers, tmp_path: Path, footer: bytes
) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    table = _footer(_honest(run.id), footer)
    path = tmp_path / "footer.parquet"
    pq.write_table(table, path)
    batch_id = _batch_with(app, run.id, path)
    answer = _get(client, run.id, admin_headers, batch_id=str(batch_id))
    assert answer.status_code == 422, (footer, answer.status_code, answer.text)
    assert answer.json()["field"] == "batch_id"


def test_bytes_that_are_not_parquet_are_422(app, client, admin_headers, tmp_path: Path) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 64)
    batch_id = _batch_with(app, run.id, path)
    answer = _get(client, run.id, admin_headers, batch_id=str(batch_id))
    assert answer.status_code == 422 and answer.json()["field"] == "batch_id", answer.text


def test_column_metadata_pyarrow_cannot_read_is_422_not_the_end_of_the_server(
    app, client, admin_headers, tmp_path: Path
) -> None:
    """Size statistics that do not fit the column's levels: pyarrow's C++ refuses the column
    chunk's metadata with an exception its binding does not translate, which ends the process
    (std::terminate) unless the footer is checked first."""
    from tests.server.datasets.files import required_in_schema

    run = make_run(app, environment=ENVIRONMENT)
    path = tmp_path / "stats.parquet"
    pq.write_table(_footer(_honest(run.id)), path)
    path.write_bytes(required_in_schema(path.read_bytes(), "prompt_row_id"))
    batch_id = _batch_with(app, run.id, path)
    answer = _get(client, run.id, admin_headers, batch_id=str(batch_id))
    assert answer.status_code == 422, answer.text
    assert (answer.json()["field"], answer.json()["code"]) == ("batch_id", "batch_unreadable")
    assert "'prompt_row_id'" in answer.json()["detail"], answer.text
