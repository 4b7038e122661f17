"""The decoded size of a Parquet file's pages, read from the page headers before any page is
decompressed. pyarrow decompresses a whole page to read one of its values, and one page may hold
every row of its row group (a writer closes a page only between write batches, 1,024 rows by
default): the footer's totals cannot bound that, the page headers can. pyarrow checks that each
page decompresses to exactly its header's `uncompressed_page_size`, so the sizes read here are
the memory pyarrow will use for the pages.

The headers are Thrift compact structs (parquet.thrift `PageHeader`); pyarrow does not expose
them, so this module reads the three leading fields and skips the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO

MAX_HEADER_BYTES = 64 * 1024
MAX_PAGES = 1_000_000
_MAX_DEPTH = 16
_DICTIONARY_PAGE = 2


class PageError(ValueError):
    """A page header that cannot be read, or more pages than MAX_PAGES."""


@dataclass(frozen=True)
class ChunkPages:
    """One column chunk: its largest data page and its dictionary page, decoded bytes."""

    column: str
    largest_page: int
    dictionary_page: int
    total: int


class _Reader:
    """Thrift compact protocol over a byte string, enough to skip any value."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError("the page header is cut short")
        value = self.data[self.at]
        self.at += 1
        return value

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("a varint of the page header is too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError("the page header is cut short")
        self.at += n

    def skip(self, kind: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise ValueError("the page header is nested too deeply")
        if kind in (1, 2):  # bool, in a field header
            return
        if kind == 3:
            self.skip_bytes(1)
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.skip_bytes(8)
        elif kind == 8:
            self.skip_bytes(self.varint())
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self._skip_element(head & 0x0F, depth + 1)
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self._skip_element(types >> 4, depth + 1)
                    self._skip_element(types & 0x0F, depth + 1)
        elif kind == 12:
            self.struct(depth + 1, {})
        else:
            raise ValueError(f"the page header holds an unknown Thrift type {kind}")

    def _skip_element(self, kind: int, depth: int) -> None:
        if kind in (1, 2):  # a bool in a container is one byte
            self.skip_bytes(1)
        else:
            self.skip(kind, depth)

    def struct(self, depth: int, wanted: dict[int, int]) -> dict[int, int]:
        """Read a struct; the i32 fields whose ids are keys of `wanted` are stored in it."""
        field = 0
        while True:
            head = self.byte()
            if head == 0:
                return wanted
            delta, kind = head >> 4, head & 0x0F
            field = field + delta if delta else self.zigzag()
            if field in wanted and kind == 5:
                wanted[field] = self.zigzag()
            else:
                self.skip(kind, depth)


def _page_header(data: bytes) -> tuple[int, int, int, int]:
    """(page type, uncompressed size, compressed size, header length) of the header at the
    start of `data`."""
    reader = _Reader(data)
    fields = reader.struct(0, {1: -1, 2: -1, 3: -1})
    if min(fields.values()) < 0:
        raise ValueError("the page header lacks its type or sizes")
    return fields[1], fields[2], fields[3], reader.at


def chunk_pages(f: BinaryIO, chunk: Any, column: str, budget: list[int]) -> ChunkPages:
    """Walk the pages of one column chunk (footer metadata `chunk`) as pyarrow will read them:
    from its first page, through its total_compressed_size. `budget` is the pages left to walk
    in the file (one element, decremented). Raises PageError."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
        start = min(start, chunk.dictionary_page_offset)
    end = start + chunk.total_compressed_size
    largest = dictionary = total = 0
    at = start
    while at < end:
        budget[0] -= 1
        if budget[0] < 0:
            raise PageError(f"the file has more than {MAX_PAGES:,} pages")
        f.seek(at)
        try:
            kind, size, compressed, length = _page_header(f.read(min(MAX_HEADER_BYTES, end - at)))
        except ValueError as exc:
            raise PageError(
                f"column {column!r}: a page header at byte {at:,} cannot be read ({exc})"
            ) from None
        total += size
        if kind == _DICTIONARY_PAGE:
            dictionary = max(dictionary, size)
        else:
            largest = max(largest, size)
        at += length + max(compressed, 0)
    return ChunkPages(column, largest, dictionary, total)


def row_group_pages(
    f: BinaryIO, metadata: Any, group: int, columns: set[str] | None, budget: list[int]
) -> list[ChunkPages]:
    """The pages of each column chunk of the row group (of `columns` only, when given)."""
    meta = metadata.row_group(group)
    out = []
    for c in range(meta.num_columns):
        chunk = meta.column(c)
        name = chunk.path_in_schema
        # "a.b" is column a's leaf b or a column named so: counted either way
        if columns is None or any(name == c or name.startswith(f"{c}.") for c in columns):
            out.append(chunk_pages(f, chunk, name, budget))
    return out


# ColumnChunkMetaData: pyarrow's binding has no C++ error translation, so a column chunk whose
# metadata the C++ constructor refuses ends the whole process (std::terminate) as soon as
# `row_group(g).column(c)` (or to_dict) is read. What that constructor refuses is checked here
# from the footer's own bytes first: encrypted column metadata, size statistics whose level
# histograms do not fit the column's levels, unencoded byte-array sizes on another type.
_BYTE_ARRAY = "BYTE_ARRAY"
_LIST, _STRUCT = 9, 12


def check_column_chunks(f: BinaryIO, metadata: Any) -> None:
    """Raise PageError for a column chunk whose metadata pyarrow cannot read without ending the
    process (see above); call before any `row_group(g).column(c)`."""
    schema = metadata.schema
    leaves = [schema.column(i) for i in range(len(schema))]
    reader = _Reader(_footer(f))
    try:
        for field, kind in _fields(reader):
            if field == 4 and kind == _LIST:
                for group in range(_list_size(reader, _STRUCT)):
                    _check_row_group(reader, group, leaves)
            else:
                reader.skip(kind, 1)
    except PageError:
        raise
    except ValueError as exc:  # the reader's words are about page headers
        reason = str(exc).replace("the page header", "the footer")
        raise PageError(f"the file's footer cannot be read ({reason})") from None


def _footer(f: BinaryIO) -> bytes:
    f.seek(0, 2)
    size = f.tell()
    if size < 12:
        raise PageError("the file is too short to hold a Parquet footer")
    f.seek(size - 8)
    tail = f.read(8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or not 0 < length <= size - 12:
        raise PageError("the file's footer cannot be read")
    f.seek(size - 8 - length)
    return f.read(length)


def _fields(reader: _Reader) -> Any:
    """(field id, type) of each field of the struct at the reader; the caller reads or skips
    each value before asking for the next field."""
    field = 0
    while True:
        head = reader.byte()
        if head == 0:
            return
        delta, kind = head >> 4, head & 0x0F
        field = field + delta if delta else reader.zigzag()
        yield field, kind


def _list_size(reader: _Reader, element: int) -> int:
    head = reader.byte()
    size = head >> 4 if head >> 4 != 15 else reader.varint()
    if head & 0x0F != element:
        raise PageError("the file's footer cannot be read (an unexpected list type)")
    return size


def _check_row_group(reader: _Reader, group: int, leaves: list[Any]) -> None:
    for field, kind in _fields(reader):
        if field == 1 and kind == _LIST:
            count = _list_size(reader, _STRUCT)
            if count != len(leaves):
                raise PageError(
                    f"row group {group} has {count} column chunks, the schema {len(leaves)}"
                )
            for c in range(count):
                _check_chunk(reader, f"row group {group}, column {leaves[c].path!r}", leaves[c])
        else:
            reader.skip(kind, 2)


def _check_chunk(reader: _Reader, where: str, leaf: Any) -> None:
    for field, kind in _fields(reader):
        if field in (8, 9):
            raise PageError(f"{where}: encrypted column metadata is not supported")
        if field == 3 and kind == _STRUCT:
            for meta_field, meta_kind in _fields(reader):
                if meta_field == 16 and meta_kind == _STRUCT:
                    _check_size_statistics(reader, where, leaf)
                else:
                    reader.skip(meta_kind, 4)
        else:
            reader.skip(kind, 3)


def _check_size_statistics(reader: _Reader, where: str, leaf: Any) -> None:
    levels = {2: leaf.max_repetition_level, 3: leaf.max_definition_level}
    for field, kind in _fields(reader):
        if field == 1 and leaf.physical_type != _BYTE_ARRAY:
            raise PageError(f"{where}: size statistics of byte-array sizes on a non-byte-array")
        if field in levels and kind == _LIST:
            head = reader.byte()
            size = head >> 4 if head >> 4 != 15 else reader.varint()
            if size and size != levels[field] + 1:
                raise PageError(
                    f"{where}: its size statistics hold a level histogram of {size} entries, "
                    f"where the column's levels take {levels[field] + 1}"
                )
            for _ in range(size):
                reader._skip_element(head & 0x0F, 6)
        else:
            reader.skip(kind, 5)
