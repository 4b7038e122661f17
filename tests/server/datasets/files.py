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
