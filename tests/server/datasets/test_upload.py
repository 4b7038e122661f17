"""POST /api/v1/datasets: JSONL and Parquet become ready with rows and columns; hostile files
are refused with the reason and leave nothing behind (no row, no object, no temp file)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from sqlalchemy import func, select

from server.models import Dataset
from tests.server.datasets.files import (
    QUESTIONS,
    empty_parquet,
    footer_claims,
    jsonl,
    not_utf8_column_name_parquet,
    not_utf8_metadata_parquet,
    not_utf8_nested_parquet,
    not_utf8_parquet,
    parquet,
    prompts_parquet,
    typed_parquet,
    upload,
)


def _nothing_left(db, app) -> None:  # type: ignore[no-untyped-def]
    db.rollback()
    assert db.execute(select(func.count()).select_from(Dataset)).scalar_one() == 0
    root = Path(app.state.store.root)
    files = [p.relative_to(root) for p in root.rglob("*") if p.is_file()]
    assert files == [Path(".asyncgrpo/database.json")]  # the bucket's binding only


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_upload_becomes_ready_with_rows_and_columns(ds_app, ds_client, admin, run_jobs, kind):  # type: ignore[no-untyped-def]
    data = jsonl(QUESTIONS) if kind == "jsonl" else parquet(QUESTIONS)
    resp = upload(ds_client, admin, data, f"gsm.{kind}")
    assert resp.status_code == 202, resp.text
    created = resp.json()
    assert created["status"] == "pending" and created["format"] == kind
    assert created["sha256"] == hashlib.sha256(data).hexdigest()
    assert created["size_bytes"] == len(data)
    assert ds_app.state.store.get_bytes(f"datasets/{created['id']}/data.{kind}") == data

    assert run_jobs("datasets") == [1]
    one = ds_client.get(f"/api/v1/datasets/{created['id']}", headers=admin).json()
    assert one["status"] == "ready", one
    assert one["row_count"] == len(QUESTIONS)
    assert one["columns"] == ["question", "answer", "source"]
    assert one["fingerprint"] == created["sha256"]
    listed = ds_client.get("/api/v1/datasets", headers=admin).json()
    assert [(d["id"], d["row_count"], d["status"]) for d in listed] == [
        (created["id"], len(QUESTIONS), "ready")
    ]


def test_format_from_the_query_and_unknown_suffix(ds_client, admin) -> None:  # type: ignore[no-untyped-def]
    resp = upload(ds_client, admin, parquet(QUESTIONS), "data.bin", format="parquet")
    assert resp.status_code == 202, resp.text
    resp = upload(ds_client, admin, jsonl(QUESTIONS), "data.bin")
    assert resp.status_code == 422
    assert resp.json()["field"] == "format"


TEN_MB_ROW = b'{"prompt": "' + b"x" * (10 * 1024 * 1024) + b'"}\n'
HOSTILE = [
    (b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n', "line 2: not UTF-8"),
    (b'{"prompt": "ok"}\n' + TEN_MB_ROW, "line 2: longer than"),
    (b"", "no rows"),
    (b"\n  \n\n", "no rows"),
    (b'{"prompt": "ok"}\n[1, 2]\n', "line 2: a row must be a non-empty JSON object"),
    (b'{"prompt": "ok"}\n{"prompt": NaN}\n', "line 2: numbers must be finite"),
    (b'{"prompt": "ok"\n', "line 1: invalid JSON"),
    # json.loads raises ValueError / RecursionError for these, not JSONDecodeError (were 500s)
    (b'{"prompt": "ok", "n": ' + b"9" * 5000 + b"}\n", "line 1: invalid JSON (a number with too"),
    (b'{"prompt": "ok", "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 1: nested deeper"),
    (b'{"prompt": "ok", "n": ' + b'{"a":' * 40 + b"1" + b"}" * 40 + b"}\n", "line 1: nested deep"),
    (b'{"prompt": "a\\u0000b"}\n', "line 1: text may not contain NUL"),  # Postgres cannot store
    # an unpaired surrogate cannot be encoded as UTF-8 (a lease carrying it could not be sent)
    (b'{"prompt": "ok"}\n{"prompt": "\\ud800"}\n', "line 2: text may not contain an unpaired"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "reason"), HOSTILE)
def test_hostile_jsonl_is_refused_and_nothing_is_kept(ds_app, ds_client, admin, db, data, reason):  # type: ignore[no-untyped-def]
    resp = upload(ds_client, admin, data, "bad.jsonl")
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == "file"
    assert reason in resp.json()["detail"]
    _nothing_left(db, ds_app)


HOSTILE_PARQUET = [
    (b"PAR1 not really parquet", "not a readable Parquet file"),
    (empty_parquet(), "no rows"),
    # a bytes column is refused from the footer's schema (a string column whose bytes are not
    # UTF-8: test_text_that_is_not_utf8_is_422_naming_row_and_column)
    (typed_parquet(prompt=pa.array([b"caf\xe9"], pa.binary())), "column 'prompt' is binary"),
    (typed_parquet(prompt=["a"], t=pa.array([datetime(2020, 1, 1)])), "column 't' is timestamp"),
    (typed_parquet(prompt=["a"], d=pa.array([Decimal("1.5")])), "column 'd' is decimal128"),
    (typed_parquet(m=pa.array([[{"role": "user", "content": b"x"}]])), "column 'm' is list<"),
]


@pytest.mark.parametrize(("data", "reason"), HOSTILE_PARQUET)
def test_hostile_parquet_is_refused(ds_app, ds_client, admin, db, data, reason):  # type: ignore[no-untyped-def]
    resp = upload(ds_client, admin, data, "bad.parquet")
    assert resp.status_code == 422, resp.text
    assert reason in resp.json()["detail"]
    _nothing_left(db, ds_app)


NOT_UTF8 = {
    "string column": (not_utf8_parquet(), "row_invalid_utf8", ["row 1", "column 'note'"]),
    "string in a list of structs": (
        not_utf8_nested_parquet(),
        "row_invalid_utf8",
        ["row 1", "column 'messages'"],
    ),
    "column name": (not_utf8_column_name_parquet(), "column_invalid_utf8", ["column name"]),
}


NOT_UTF8["jsonl line"] = (
    b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n',
    "row_invalid_utf8",
    ["line 2", "not UTF-8"],
)


@pytest.mark.parametrize("case", sorted(NOT_UTF8))
def test_text_that_is_not_utf8_is_422_naming_row_and_column(ds_app, ds_client, admin, db, case):  # type: ignore[no-untyped-def]
    data, code, named = NOT_UTF8[case]
    name = "bad.jsonl" if case == "jsonl line" else "bad.parquet"
    resp = upload(ds_client, admin, data, name)
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert (body["field"], body["code"]) == ("file", code), body
    assert all(n in body["detail"] for n in named), body
    _nothing_left(db, ds_app)


def test_metadata_that_is_not_utf8_is_not_read(ds_client, admin) -> None:  # type: ignore[no-untyped-def]
    """Key-value metadata is no part of a dataset: its bytes do not matter."""
    resp = upload(ds_client, admin, not_utf8_metadata_parquet(), "meta.parquet")
    assert resp.status_code == 202, resp.text
    assert resp.json()["row_count"] == 2


@pytest.mark.parametrize(("real", "claimed"), [(12_345, 1_000_000), (3_000, 1)])
def test_a_footer_whose_row_count_is_not_the_rows_is_refused(
    ds_app, ds_client, admin, db, real, claimed
):  # type: ignore[no-untyped-def]
    data = footer_claims(prompts_parquet(real), real, claimed)
    resp = upload(ds_client, admin, data, "lying.parquet")
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["code"] == "row_count_mismatch", body
    assert f"{claimed:,}" in body["detail"] and f"{real:,}" in body["detail"], body
    _nothing_left(db, ds_app)


def test_the_row_count_stored_is_the_rows_read(ds_client, admin) -> None:  # type: ignore[no-untyped-def]
    resp = upload(ds_client, admin, prompts_parquet(12_345, row_group_size=1_000), "p.parquet")
    assert resp.status_code == 202, resp.text
    assert resp.json()["row_count"] == 12_345


def test_declared_size_over_the_limit_is_413_before_reading(ds_app, ds_client, admin, db):  # type: ignore[no-untyped-def]
    def body():  # type: ignore[no-untyped-def]
        yield b'{"prompt": "never read"}\n'

    headers = {**admin, "Content-Length": str(2 * 1024**3)}
    resp = ds_client.post("/api/v1/datasets?name=big.jsonl", content=body(), headers=headers)
    assert resp.status_code == 413, resp.text
    assert "datasets.max_upload_bytes" in resp.json()["detail"]
    _nothing_left(db, ds_app)


def test_streamed_size_over_the_limit_is_413(ds_app, ds_client, admin, db):  # type: ignore[no-untyped-def]
    ds_app.state.settings.datasets.max_upload_bytes = 64 * 1024
    row = json.dumps({"prompt": "y" * 1000}).encode() + b"\n"

    def body():  # type: ignore[no-untyped-def]
        for _ in range(200):  # 200 KB, chunked: no Content-Length
            yield row

    resp = ds_client.post("/api/v1/datasets?name=big.jsonl", content=body(), headers=admin)
    assert resp.status_code == 413, resp.text
    _nothing_left(db, ds_app)


def test_a_parquet_row_over_the_row_limit_is_refused_at_upload(ds_app, ds_client, admin, db):  # type: ignore[no-untyped-def]
    rows = [{"prompt": "short"}, {"prompt": "z" * (10 * 1024 * 1024)}]  # 10 MB, limit 1 MiB
    resp = upload(ds_client, admin, parquet(rows), "rows.parquet")
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == "file"
    detail = resp.json()["detail"]
    assert "row 1" in detail and "1048576" in detail.replace(",", ""), detail
    assert resp.json()["code"] == "row_too_large"
    _nothing_left(db, ds_app)


@pytest.mark.parametrize(
    ("column", "reason"),
    [
        (pa.array([1.0, float("nan")]), "row 1"),
        (pa.array(["ok", "a\x00b"]), "row 1"),
    ],
)
def test_parquet_values_that_are_not_json_are_refused_at_upload(
    ds_app, ds_client, admin, db, column, reason
):  # type: ignore[no-untyped-def]
    data = typed_parquet(prompt=["a", "b"], v=column)
    resp = upload(ds_client, admin, data, "values.parquet")
    assert resp.status_code == 422, resp.text
    assert reason in resp.json()["detail"]
    _nothing_left(db, ds_app)


def test_upload_needs_an_admin_token(ds_client) -> None:  # type: ignore[no-untyped-def]
    assert upload(ds_client, {}, jsonl(QUESTIONS), "a.jsonl").status_code == 401
    assert ds_client.get("/api/v1/datasets").status_code == 401


def test_nul_in_the_name_or_a_parquet_column_is_refused(ds_app, ds_client, admin, db):  # type: ignore[no-untyped-def]
    resp = upload(ds_client, admin, jsonl(QUESTIONS), "a\x00.jsonl")
    assert resp.status_code == 422
    assert resp.json()["errors"][0]["field"] == "query.name"
    resp = upload(ds_client, admin, parquet([{"pro\x00mpt": "x"}]), "nul.parquet")
    assert resp.status_code == 422 and "NUL" in resp.json()["detail"]
    _nothing_left(db, ds_app)


class _FlakyBucket:
    """The app's store, with reads failing as S3 does when unreachable or answering 5xx."""

    def __init__(self, store, error: Exception) -> None:  # type: ignore[no-untyped-def]
        self.store, self.error = store, error

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name in ("head", "download_file"):
            raise self.error
        return getattr(self.store, name)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_bucket_error_leaves_the_upload_pending_and_kept(ds_app, ds_client, admin, kind):  # type: ignore[no-untyped-def]
    from botocore.exceptions import EndpointConnectionError

    from protocol.storage import StoreError
    from server.datasets.jobs import check_pending

    data = jsonl(QUESTIONS) if kind == "jsonl" else parquet(QUESTIONS)
    created = upload(ds_client, admin, data, f"q.{kind}").json()
    key = f"datasets/{created['id']}/data.{kind}"
    store, limits = ds_app.state.store, ds_app.state.settings.datasets
    factory = ds_app.state.sessionmaker
    for error in (EndpointConnectionError(endpoint_url="http://s3"), StoreError("503 on key")):
        assert check_pending(factory, _FlakyBucket(store, error), limits) == 0
        one = ds_client.get(f"/api/v1/datasets/{created['id']}", headers=admin).json()
        assert (one["status"], one["reason"]) == ("pending", None)
        assert store.get_bytes(key) == data  # the upload is kept
    assert check_pending(factory, store, limits) == 1  # the bucket is back
    one = ds_client.get(f"/api/v1/datasets/{created['id']}", headers=admin).json()
    assert one["status"] == "ready"


def test_an_upload_gone_from_the_bucket_fails(ds_app, ds_client, admin, run_jobs):  # type: ignore[no-untyped-def]
    created = upload(ds_client, admin, parquet(QUESTIONS), "q.parquet").json()
    ds_app.state.store.delete(f"datasets/{created['id']}/data.parquet")
    assert run_jobs("datasets") == [1]
    one = ds_client.get(f"/api/v1/datasets/{created['id']}", headers=admin).json()
    assert one["status"] == "failed" and "missing from the bucket" in one["reason"]
