"""protocol.parquet_pages reads each page's decoded size from its header, as pyarrow will
decompress it, and refuses any bytes it cannot read with PageError only."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from protocol import parquet_pages


def _file(rows: int, size: int, **write: object) -> bytes:
    text = [f"{i:08d}" + "a" * (size - 8) for i in range(rows)]
    buffer = io.BytesIO()
    pq.write_table(pa.table({"prompt": text, "n": list(range(rows))}), buffer, **write)
    return buffer.getvalue()


def _pages(data: bytes, budget: int = parquet_pages.MAX_PAGES) -> list[parquet_pages.ChunkPages]:
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    f = io.BytesIO(data)
    return [
        chunk
        for group in range(metadata.num_row_groups)
        for chunk in parquet_pages.row_group_pages(f, metadata, group, None, [budget])
    ]


def test_one_page_holds_a_write_batch_of_rows_and_the_sizes_add_up() -> None:
    data = _file(300, 10_000, compression="zstd", use_dictionary=False)
    prompt, n = _pages(data)
    assert prompt.column == "prompt" and n.column == "n"
    # pyarrow closes a page only after a write batch (1,024 rows): all 300 rows in one page
    assert prompt.largest_page >= 300 * 10_000
    assert prompt.dictionary_page == 0
    footer = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    assert prompt.total <= footer.total_uncompressed_size < prompt.total + 1_000


def test_small_write_batches_make_small_pages() -> None:
    data = _file(300, 10_000, data_page_size=1 << 16, write_batch_size=4)
    prompt = _pages(data)[0]
    assert prompt.largest_page < 4 * 10_000 + (1 << 16) + 1_000
    assert prompt.dictionary_page > 0  # pyarrow tries a dictionary first
    assert prompt.total >= 300 * 10_000


def test_the_columns_read_are_the_only_ones_walked() -> None:
    data = _file(10, 100)
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    chunks = parquet_pages.row_group_pages(io.BytesIO(data), metadata, 0, {"n"}, [100])
    assert [c.column for c in chunks] == ["n"]


def test_the_page_budget_is_shared_by_the_file() -> None:
    data = _file(3_000, 100, data_page_size=1 << 10, write_batch_size=8)
    with pytest.raises(parquet_pages.PageError, match="more than"):
        _pages(data, budget=10)


def test_damaged_headers_raise_page_error_only() -> None:
    data = _file(50, 100, compression="zstd")
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    rng = random.Random(7)
    end = len(data) - 8 - int.from_bytes(data[-8:-4], "little")  # the footer stays intact
    for _ in range(400):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            damaged[rng.randrange(4, end)] = rng.randrange(256)
        try:
            for group in range(metadata.num_row_groups):
                parquet_pages.row_group_pages(
                    io.BytesIO(bytes(damaged)), metadata, group, None, [10_000]
                )
        except parquet_pages.PageError:
            pass
