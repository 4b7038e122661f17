"""Reading dataset files: the checks an upload passes while it streams (JSONL), the footer
check of a Parquet file, and row iteration with bounded memory (Parquet by record batches,
JSONL by lines). Every refusal is a DatasetError whose message names the line or row."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from protocol import parquet_pages
from protocol.datasets import DatasetError
from protocol.error_codes import ErrorCode
from protocol.schemas import MAX_JSON_DEPTH, JsonTooLarge, check_free_json

MAX_COLUMNS = 1_000
BATCH_ROWS = 10_000
# Decoded bytes of one Parquet record batch. A compressed file may hold far more row bytes than
# its size, so a batch is bounded by bytes, not rows only: by max_row_bytes per row, and by the
# row group's pages (page headers, read before any page is decompressed: pyarrow decompresses a
# whole page at a time, the pages of every column read at once). What reading holds at most:
# MAX_PAGE_BYTES of pages, a batch of BATCH_BYTES in Arrow and its rows as Python objects.
BATCH_BYTES = 32 * 1024 * 1024
MAX_PAGE_BYTES = 128 * 1024 * 1024
# How a file is written with pages of about 1 MiB plus 16 rows (the datasets job writes so too).
SMALL_PAGE_WRITE = {"data_page_size": 1 << 20, "write_batch_size": 16}
SMALL_PAGES = "pyarrow: pq.write_table(table, path, data_page_size=1 << 20, write_batch_size=16)"
READ_BUFFER_BYTES = 1024 * 1024


def check_row(row: Any, where: str, max_row_bytes: int) -> dict[str, Any]:
    """A row is a non-empty JSON object of at most max_row_bytes, finite numbers only, no NUL."""
    if not isinstance(row, dict) or not row:
        raise DatasetError(f"{where}: a row must be a non-empty JSON object")
    try:
        check_free_json(row, max_row_bytes)
    except JsonTooLarge as exc:
        raise DatasetError(f"{where}: {exc}", code=ErrorCode.row_too_large) from None
    except ValueError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    return row


class Columns:
    """Column names in order of first appearance, bounded."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}

    def add(self, row: dict[str, Any], where: str) -> None:
        for key in row:
            if key not in self.names:
                if len(self.names) >= MAX_COLUMNS:
                    raise DatasetError(f"{where}: more than {MAX_COLUMNS:,} columns")
                self.names[key] = None

    def as_list(self) -> list[str]:
        return list(self.names)


class JsonlCheck:
    """Fed the upload's bytes as they arrive: each line UTF-8, one JSON object, at most
    max_row_bytes; blank lines skipped. `finish()` refuses a file without rows."""

    def __init__(self, max_row_bytes: int) -> None:
        self.max_row_bytes = max_row_bytes
        self.buffer = b""
        self.line = 0
        self.rows = 0
        self.columns = Columns()

    def feed(self, chunk: bytes) -> None:
        *lines, self.buffer = (self.buffer + chunk).split(b"\n")
        for raw in lines:
            self._line(raw)
        if len(self.buffer) > self.max_row_bytes:
            raise self._too_long(self.line + 1)

    def finish(self) -> None:
        if self.buffer:
            self._line(self.buffer)
            self.buffer = b""
        if self.rows == 0:
            raise DatasetError("the file holds no rows (a dataset needs at least one)")

    def _too_long(self, number: int) -> DatasetError:
        return DatasetError(
            f"line {number}: longer than {self.max_row_bytes:,} bytes", code=ErrorCode.row_too_large
        )

    def _line(self, raw: bytes) -> None:
        self.line += 1
        if len(raw) > self.max_row_bytes:
            raise self._too_long(self.line)
        if not raw.strip():
            return
        where = f"line {self.line}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(
                f"{where}: not UTF-8 (byte {exc.start} of the line)",
                code=ErrorCode.row_invalid_utf8,
            ) from None
        row = _loads(text, where)
        self.columns.add(check_row(row, where, self.max_row_bytes), where)
        self.rows += 1


def _loads(text: str | bytes, where: str) -> Any:
    """json.loads with every refusal a DatasetError: besides syntax, an integer of more digits
    than Python converts (ValueError) and nesting deeper than the parser's stack (RecursionError)
    would otherwise escape as a 500."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: invalid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{where}: not UTF-8 (byte {exc.start} of the line)", code=ErrorCode.row_invalid_utf8
        ) from None
    except ValueError:
        raise DatasetError(f"{where}: invalid JSON (a number with too many digits)") from None
    except RecursionError:
        raise DatasetError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels") from None


def parquet_shape(path: Path) -> tuple[int, list[str]]:
    """Rows and columns from a Parquet file's footer (no row is read): the row count is what
    the footer claims, checked against the rows read by `parquet_rows_read`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
        rows, columns = meta.metadata.num_rows, list(meta.schema_arrow.names)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"not a readable Parquet file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"the file's schema or a column name is not UTF-8 (byte {exc.start})",
            code=ErrorCode.column_invalid_utf8,
        ) from None
    if rows == 0:
        raise DatasetError("the file holds no rows (a dataset needs at least one)")
    if not columns or len(columns) > MAX_COLUMNS:
        raise DatasetError(f"a Parquet dataset needs 1 to {MAX_COLUMNS:,} columns")
    if any("\x00" in c for c in columns):
        raise DatasetError("a column name may not contain NUL (\\u0000)")
    for column in meta.schema_arrow:
        if not _json_type(column.type):
            raise DatasetError(
                f"column {column.name!r} is {column.type}, not a JSON type: a dataset's columns "
                "hold strings, numbers, booleans, lists and structs of these (no bytes, "
                "timestamps, dates or decimals)"
            )
    return rows, columns


def _json_type(t: Any) -> bool:
    """Whether every value of Arrow type `t` reads as a JSON value (the footer's schema: a bytes
    column, e.g. text that is not UTF-8, is refused at upload, before any row is read)."""
    import pyarrow as pa

    types = pa.types
    if types.is_null(t) or types.is_boolean(t) or types.is_integer(t):
        return True
    if types.is_floating(t):
        return not types.is_float16(t)
    if types.is_string(t) or types.is_large_string(t) or types.is_string_view(t):
        return True
    if types.is_dictionary(t):
        return _json_type(t.value_type)
    if (
        types.is_list(t)
        or types.is_large_list(t)
        or types.is_fixed_size_list(t)
        or types.is_list_view(t)
        or types.is_large_list_view(t)
    ):
        return _json_type(t.value_type)
    if types.is_struct(t):
        return all(_json_type(t.field(i).type) for i in range(t.num_fields))
    if types.is_map(t):
        return _json_type(t.key_type) and _json_type(t.item_type)
    return False


def iter_rows(
    path: Path, fmt: str, max_row_bytes: int, columns: list[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Every row of the file as a checked JSON object, with bounded memory."""
    if fmt == "parquet":
        yield from _parquet_rows(path, max_row_bytes, columns)
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"line {number}"
            yield check_row(_loads(raw, where), where, max_row_bytes)


def parquet_rows_read(path: Path, max_row_bytes: int, footer_rows: int) -> int:
    """Read and check every row of a Parquet file; how many there are. A footer whose row
    count is not the rows read is refused: the stored row count, and the bounds computed from
    it, are the real ones."""
    rows = sum(1 for _row in _parquet_rows(path, max_row_bytes, None))
    if rows != footer_rows:
        raise DatasetError(
            f"the file's footer says {_rows(footer_rows)} but it holds {_rows(rows)}: a file "
            "whose footer disagrees with its rows is refused (write it again)",
            code=ErrorCode.row_count_mismatch,
        )
    return rows


def _rows(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def batch_rows(
    max_row_bytes: int, group_rows: int = 0, group_bytes: int = 0, row_bound: int = 0
) -> int:
    """Rows per Parquet batch: at most BATCH_ROWS; at most BATCH_BYTES of rows of max_row_bytes
    each (a bigger row is refused by check_row), of the row group's decoded bytes
    (`group_bytes` over `group_rows`) and of rows of `row_bound` bytes (what one row can take
    decoded: a page or dictionary entry per column); at least one."""
    rows = min(BATCH_ROWS, BATCH_BYTES // max_row_bytes)
    if group_rows > 0 and group_bytes > 0:
        rows = min(rows, BATCH_BYTES * group_rows // group_bytes)
    if row_bound > 0:
        rows = min(rows, BATCH_BYTES // row_bound)
    return max(1, rows)


def _group_batches(
    path: Path, pf: Any, max_row_bytes: int, columns: list[str] | None
) -> Iterator[Any]:
    """The file's record batches, one row group after another, each sized by batch_rows from
    that row group's pages (only the columns read count); a row group whose pages decoded at
    once would be over MAX_PAGE_BYTES is refused before any is decompressed."""
    metadata = pf.metadata
    wanted = None if columns is None else set(columns)
    budget = [parquet_pages.MAX_PAGES]
    with open(path, "rb") as raw:
        try:
            parquet_pages.check_column_chunks(raw, metadata)
        except parquet_pages.PageError as exc:
            raise DatasetError(str(exc), code=ErrorCode.page_unreadable) from None
    for group in range(metadata.num_row_groups):
        with open(path, "rb") as raw:
            try:
                pages = parquet_pages.row_group_pages(raw, metadata, group, wanted, budget)
            except parquet_pages.PageError as exc:
                raise DatasetError(
                    f"row group {group}: {exc}", code=ErrorCode.page_unreadable
                ) from None
        _check_pages(pages, group)
        yield from pf.iter_batches(
            batch_size=batch_rows(
                max_row_bytes,
                metadata.row_group(group).num_rows,
                sum(p.total for p in pages),
                sum(p.largest_page + p.dictionary_page for p in pages),
            ),
            row_groups=[group],
            columns=columns,
            use_threads=False,
        )


def _check_pages(pages: list[parquet_pages.ChunkPages], group: int) -> None:
    at_once = sum(p.largest_page + p.dictionary_page for p in pages)
    if at_once > MAX_PAGE_BYTES:
        big = max(pages, key=lambda p: p.largest_page + p.dictionary_page)
        raise DatasetError(
            f"row group {group}: its pages take {at_once:,} bytes decoded at once (column "
            f"{big.column!r}: a page of {max(big.largest_page, big.dictionary_page):,}), over "
            f"the {MAX_PAGE_BYTES:,}-byte bound; write the file with smaller pages "
            f"({SMALL_PAGES})",
            code=ErrorCode.page_too_large,
        )


def _parquet_rows(
    path: Path, max_row_bytes: int, columns: list[str] | None
) -> Iterator[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    index = 0
    try:
        pf = pq.ParquetFile(path, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)
        for batch in _group_batches(path, pf, max_row_bytes, columns):
            for row in _python_rows(batch, index):
                yield check_row(_json_values(row, index), f"row {index}", max_row_bytes)
                index += 1
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"row {index}: the Parquet file cannot be read ({exc})") from None
    except UnicodeDecodeError as exc:  # a column name, as the footer's schema is decoded
        raise DatasetError(
            f"row {index}: a column name is not UTF-8 (byte {exc.start})",
            code=ErrorCode.column_invalid_utf8,
        ) from None


def _python_rows(batch: Any, first: int) -> list[dict[str, Any]]:
    """The batch as Python rows; text that is not UTF-8 is refused naming its row and column
    (pyarrow does not check a string column's bytes when it reads them)."""
    try:
        rows: list[dict[str, Any]] = batch.to_pylist()
    except UnicodeDecodeError:
        raise _not_utf8(batch, first) from None
    return rows


def _not_utf8(batch: Any, first: int) -> DatasetError:
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        for offset in range(len(column)):
            try:
                column[offset].as_py()
            except UnicodeDecodeError as exc:
                return DatasetError(
                    f"row {first + offset}: column {name!r} holds text that is not UTF-8 "
                    f"(byte {exc.start} of the value)",
                    code=ErrorCode.row_invalid_utf8,
                )
    return DatasetError(
        f"rows from {first}: text that is not UTF-8", code=ErrorCode.row_invalid_utf8
    )


def _json_values(row: dict[str, Any], index: int) -> dict[str, Any]:
    """Parquet values must be JSON values (strings, numbers, lists, structs): a timestamp or
    bytes column is refused with its name."""
    try:
        json.dumps(row)
    except TypeError:
        for key, value in row.items():
            try:
                json.dumps(value)
            except TypeError:
                kind = type(value).__name__
                raise DatasetError(
                    f"row {index}: column {key!r} holds a {kind}, not a JSON value"
                ) from None
    return row
