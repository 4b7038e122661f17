"""Reading a Parquet dataset's rows (the upload request and the `datasets` job) holds a bounded
amount whatever the file's compression: the pages' decoded sizes are read from their headers
before any is decompressed (a row group whose pages take more than files.MAX_PAGE_BYTES at once
is refused), and rows are decoded in batches of about files.BATCH_BYTES. Measured in-process
(Python allocations) and on a real `asyncgrpo server` process (the peak of its resident size
during the upload)."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from server.datasets import files
from tests.conftest import make_settings, mint_token
from tests.harness.serve import peak_rss, reset_peak_rss, serve_in_process

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024
SMALL_PAGES = {"data_page_size": MiB, "write_batch_size": 16}


def test_compressible_rows_are_read_in_batches_bounded_by_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "BATCH_BYTES", 1024 * 1024)
    row_bytes = 8 * 1024
    path = tmp_path / "compressible.parquet"  # 32 MB of rows in a file of a few hundred KB
    text = [f"{i:08d}" + "a" * (row_bytes - 100) for i in range(4000)]
    pq.write_table(pa.table({"prompt": text}), path, compression="zstd")
    assert path.stat().st_size < 2 * 1024 * 1024
    tracemalloc.start()
    try:
        rows = sum(1 for _ in files.iter_rows(path, "parquet", max_row_bytes=row_bytes))
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == 4000
    assert peak < 6 * 1024 * 1024, f"{peak:,} bytes of rows held at once"


def test_the_batch_is_at_least_one_row_and_at_most_batch_rows() -> None:
    assert files.batch_rows(files.BATCH_BYTES * 4) == 1
    assert files.batch_rows(1) == files.BATCH_ROWS
    assert files.batch_rows(1024 * 1024) == files.BATCH_BYTES // (1024 * 1024)
    # a row group of 10 rows taking BATCH_BYTES decoded: one row's share each
    assert files.batch_rows(1, group_rows=10, group_bytes=files.BATCH_BYTES) == 10
    assert files.batch_rows(1, row_bound=files.BATCH_BYTES // 3) == 3


def _parquet(prompt: pa.Array, **write: Any) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"prompt": prompt}), buffer, compression="zstd", **write)
    return buffer.getvalue()


def _same_rows(rows: int, size: int) -> bytes:
    """`rows` copies of one `size`-byte string: one dictionary entry (no Arrow schema kept, so
    it reads back as a plain string column), a file of a few hundred bytes."""
    text = pa.array(["a" * size])
    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), text)
    return _parquet(column, store_schema=False)


def _distinct_rows(rows: int, size: int, **write: Any) -> bytes:
    return _parquet(pa.array([f"{i:08d}" + "a" * (size - 8) for i in range(rows)]), **write)


GROWN = 300 * 10**6  # the bound for the refused files
# name: (file, status, code, bound on the server's growth)
CASES: dict[str, tuple[Any, int, str | None, int]] = {
    # the file: 336 bytes, 256 rows of 2 MiB each (one dictionary entry)
    "256 x 2 MiB, one value": (lambda: _same_rows(256, 2 * MiB), 422, "row_too_large", GROWN),
    # one page of 512 MiB: refused from its header, never decompressed
    "256 x 2 MiB, one page": (lambda: _distinct_rows(256, 2 * MiB), 422, "page_too_large", GROWN),
    "256 x 2 MiB, small pages": (
        lambda: _distinct_rows(256, 2 * MiB, **SMALL_PAGES), 422, "row_too_large", GROWN
    ),
    # within max_row_bytes (1 MiB): within the documented 256 MiB bound
    "300 x 1 MB, small pages": (
        lambda: _distinct_rows(300, 10**6, **SMALL_PAGES), 202, None, 256 * MiB
    ),
    "300 x 1 MB, one page": (lambda: _distinct_rows(300, 10**6), 422, "page_too_large", 256 * MiB),
}  # fmt: skip


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Both databases (conftest's db_url)."""
    return make_settings(db_url, tmp_path / "bucket")


def test_uploads_of_huge_rows_in_small_files_keep_the_server_bounded(
    app, settings, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {mint_token(app, 'admin', name='rss')}"}
    log = tmp_path / "server.log"
    seen = {}
    with serve_in_process(settings.database_url, Path(settings.bucket_url), log) as (base, pid):
        for name, (make, status, code, bound) in CASES.items():
            data = make()
            assert len(data) < MiB, (name, len(data))  # small files: the rows are what is big
            baseline = reset_peak_rss(pid)
            answer = httpx.post(
                f"{base}/api/v1/datasets",
                params={"name": "huge.parquet"},
                content=data,
                headers=headers,
                timeout=120,
            )
            growth = peak_rss(pid) - baseline
            seen[name] = (answer.status_code, answer.json().get("code"), growth // MiB)
            assert growth < bound, f"{name}: the server grew by {growth / MiB:.0f} MiB ({seen})"
            assert answer.status_code == status, (name, answer.text)
            assert answer.json().get("code") == code, (name, answer.text)
