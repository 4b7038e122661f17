"""Dataset files for the tests, written by the tests themselves."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

QUESTIONS = [
    {"question": f"Tom has {i} apples and buys {i + 2}. How many now?", "answer": str(2 * i + 2),
     "source": f"gen-{i}"}
    for i in range(1, 7)
]  # fmt: skip


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet(rows: list[dict[str, Any]]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def empty_parquet() -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), buffer)
    return buffer.getvalue()


def upload(client: Any, admin: dict[str, str], data: bytes, name: str, **params: Any) -> Any:
    return client.post(
        "/api/v1/datasets", params={"name": name, **params}, content=data, headers=admin
    )


def typed_parquet(**columns: Any) -> bytes:
    """A Parquet file of the given pyarrow arrays (types a dataset may refuse)."""
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    return buffer.getvalue()


def not_utf8_parquet() -> bytes:
    """A string column whose second value is the bytes ff fe fd fc (pyarrow writes a binary
    array viewed as strings without checking it)."""
    text = pa.array([b"fine", b"\xff\xfe\xfd\xfc"], pa.binary()).view(pa.string())
    return typed_parquet(prompt=pa.array(["a", "b"]), note=text)


def not_utf8_nested_parquet() -> bytes:
    """A list of structs whose second row's `content` is not UTF-8."""
    content = pa.array([b"hi", b"ok\xc3("], pa.binary()).view(pa.string())
    role = pa.array(["user", "user"])
    messages = pa.ListArray.from_arrays(
        pa.array([0, 1, 2], pa.int32()),
        pa.StructArray.from_arrays([role, content], names=["role", "content"]),
    )
    return typed_parquet(prompt=pa.array(["a", "b"]), messages=messages)


def not_utf8_column_name_parquet() -> bytes:
    """A column named with the bytes ff fe fd fc (written as AAAA, renamed in the footer; no
    Arrow schema stored, so the footer's name is the only one)."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"AAAA": ["x"]}), buffer, store_schema=False)
    data = buffer.getvalue()
    assert data.count(b"AAAA") == 2  # the schema element and the column chunk's path
    return data.replace(b"AAAA", b"\xff\xfe\xfd\xfc")


def not_utf8_metadata_parquet() -> bytes:
    """Key-value metadata (not a column) that is not UTF-8."""
    table = pa.table({"prompt": ["a", "b"]}).replace_schema_metadata({b"\xff\xfe": b"\xfd\xfc"})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def prompts_parquet(rows: int, **write: Any) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"prompt": [f"question {i}" for i in range(rows)]}), buffer, **write)
    return buffer.getvalue()


def footer_claims(data: bytes, real: int, claimed: int) -> bytes:
    """The Parquet file `data` of `real` rows with its footer's file-level row count rewritten
    to `claimed` (the row groups keep theirs): the Thrift compact field 3 of FileMetaData, an
    i64 written as a zigzag varint, re-encoded in the same number of bytes (a varint may carry
    continuation bytes) so that no offset moves."""
    footer_length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_length
    old = b"\x16" + _varint(real * 2)  # field delta 1 (after the schema), type i64
    at = data.index(old, start)  # the first one: num_rows precedes the row groups
    new = b"\x16" + _varint(claimed * 2, width=len(old) - 1)
    return data[:at] + new + data[at + len(old) :]


def _varint(value: int, width: int = 0) -> bytes:
    out = bytearray()
    while value >= 0x80 or len(out) < width - 1:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    assert value < 0x80
    out.append(value)
    return bytes(out)


def required_in_schema(data: bytes, column: str) -> bytes:
    """The Parquet file `data` with the nullable top-level `column` declared required in its
    footer's schema (its chunks keep their size statistics, whose definition level histogram
    then has one entry too many): the Thrift compact repetition_type field (3, i32 zigzag 1 →
    0) just before the column's name, same length, so that no offset moves. The field header
    is 0x25 after a leaf's type field, 0x35 as a group's first field."""
    name = bytes([len(column)]) + column.encode()
    for header in (b"\x25", b"\x35"):
        old = header + b"\x02\x18" + name
        if data.count(old) == 1:
            return data.replace(old, header + b"\x00\x18" + name)
    raise AssertionError(f"the schema element of {column!r} was not found once")
