"""Reading a Parquet dataset's rows (the upload request and the `datasets` job) holds at most
about files.BATCH_BYTES of rows at once, whatever the file's compression: rows of
max_row_bytes each are read in batches of BATCH_BYTES // max_row_bytes rows."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from server.datasets import files

pytestmark = pytest.mark.timeout(60)


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
