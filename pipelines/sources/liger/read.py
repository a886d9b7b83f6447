"""Step 1 of the Liger source: read a benchmark CSV tolerantly, one record at a time.

Accepts a UTF-8 BOM, CRLF or LF line ends, quoted fields (even across lines) and header columns
in any order. Streams: memory does not grow with the file. Yields every record with the 1-based
line it starts on (the header is line 1) and its raw text, so nothing is dropped unseen.
"""

from __future__ import annotations

import codecs
import csv
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

COLUMNS = (
    "kernel_name",
    "kernel_provider",
    "kernel_operation_mode",
    "metric_name",
    "metric_unit",
    "x_name",
    "x_label",
    "x_value",
    "y_value_50",
    "y_value_20",
    "y_value_80",
    "extra_benchmark_config_str",
    "gpu_name",
    "timestamp",
    "liger_version",
)

# A real row is ~300 bytes; the limit only keeps one pathological field from exhausting memory.
FIELD_SIZE_LIMIT = 64 * 1024 * 1024


class NotLigerCsv(ValueError):
    """The object is not a Liger benchmark CSV (empty, binary, or without Liger's header)."""


@dataclass(slots=True)
class CsvRecord:
    line: int
    raw: str
    fields: list[str] | None  # None when the record could not be parsed at all
    error: str | None = None  # reason code when fields is None or the bytes were not UTF-8


@dataclass(frozen=True, slots=True)
class LigerCsv:
    columns: tuple[str, ...]  # as the header names them, in file order
    records: Iterator[CsvRecord]

    def index_of(self, column: str) -> int:
        return self.columns.index(column)


def _decoded_lines(
    lines: Iterable[bytes], bad_lines: set[int], consumed: list[str], first_line: int
) -> Iterator[str]:
    """Decode lines, remembering which were not UTF-8 and the text the csv reader consumed."""
    for number, line in enumerate(lines, start=first_line):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            bad_lines.add(number)
            text = line.decode("utf-8", errors="replace")
        consumed.append(text)
        yield text


def _parse_header(first_line: bytes) -> tuple[str, ...]:
    if not first_line.strip():
        raise NotLigerCsv("empty file: expected Liger's CSV header")
    try:
        text = first_line.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise NotLigerCsv("not UTF-8 text (binary data?)") from None
    if "\x00" in text:
        raise NotLigerCsv("not text: contains NUL bytes")
    try:
        header = next(csv.reader([text.rstrip("\r\n")]))
    except csv.Error as error:
        raise NotLigerCsv(f"unreadable header: {error}") from None
    columns = tuple(name.strip() for name in header)
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise NotLigerCsv(f"header lacks Liger column(s): {', '.join(missing)}")
    return columns


def open_liger_csv(lines: Iterable[bytes]) -> LigerCsv:
    """Read the header from binary lines (a file opened "rb", or bytes split with keepends)."""
    iterator = iter(lines)
    columns = _parse_header(next(iterator, b""))
    return LigerCsv(columns, _records(iterator))


def segment_records(
    lines: Iterable[bytes], first_line: int, after: Iterable[bytes]
) -> tuple[list[CsvRecord], list[bytes]]:
    """The records that start in a segment of a file's data lines (the segment starting with a
    record, on line `first_line`). A record still open at the segment's end (a quoted field
    across lines) goes on into `after`, the lines that follow: returns the records and the lines
    of `after` they took, so that whoever reads on knows where the next record starts."""
    consumed: list[str] = []
    taken: list[bytes] = []

    def source() -> Iterator[bytes]:
        yield from lines
        for line in after:
            if not consumed:  # the last record is complete: the rest is not ours
                return
            taken.append(line)
            yield line

    records = list(_records(source(), first_line, consumed))
    return records, taken


def _records(
    lines: Iterable[bytes], first_line: int = 2, consumed: list[str] | None = None
) -> Iterator[CsvRecord]:
    csv.field_size_limit(FIELD_SIZE_LIMIT)
    bad_lines: set[int] = set()
    consumed = [] if consumed is None else consumed
    reader = csv.reader(_decoded_lines(lines, bad_lines, consumed, first_line), strict=False)
    next_line = first_line
    while True:
        try:
            fields: list[str] | None = next(reader)
            error = None
        except StopIteration:
            return
        except csv.Error as failure:
            fields, error = None, f"unparseable_row: {failure}"
        raw = "".join(consumed).rstrip("\r\n")
        consumed.clear()
        start, next_line = next_line, reader.line_num + first_line
        if fields == [] or (fields is not None and not raw.strip()):
            continue  # blank line: no data, nothing to lose
        if bad_lines and error is None and any(n in bad_lines for n in range(start, next_line)):
            error = "bad_encoding"
        yield CsvRecord(start, raw, fields, error)


# --- whole lines, column by column -----------------------------------------------------------
# A line that is one complete RFC 4180 record: each field unquoted without quotes, line breaks or
# NULs, or quoted with its quotes doubled and no line break inside. On such lines Python's csv
# reader and Arrow's CSV parser give the same fields; elsewhere their rules differ (a quote
# inside an unquoted field, text after a closing quote, a line break inside quotes), so such data
# takes the streaming reader above. RE2 syntax (Arrow's match_substring_regex), over a whole text.
_FIELD = r'(?:[^",\r\n\x00]*|"(?:[^"\r\n\x00]|"")*")'
_RECORD = rf"{_FIELD}(?:,{_FIELD})*\r?"
WELL_FORMED_LINES = rf"^(?:{_RECORD}\n)*(?:{_RECORD})?$"


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """The records of whole lines, each one complete record, read by Arrow column by column:
    what the streaming reader gives for these lines, at a fraction of its cost per row. Indexing
    builds the CsvRecord the streaming reader would have given (for rows that need one)."""

    first_line: int  # the file line of the first record
    data: bytes  # the lines
    starts: list[int]  # where each line starts in data, then where the last one ends
    columns: list[pa.Array]  # the fields, one string array per column in header order

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, index: int) -> CsvRecord:
        line = self.data[self.starts[index] : self.starts[index + 1]]
        raw = line.decode("utf-8").rstrip("\r\n")
        return CsvRecord(self.first_line + index, raw, [c[index].as_py() for c in self.columns])


def record_columns(data: bytes, first_line: int, width: int) -> RecordColumns | None:
    """The records of `data` (whole data lines of a file, the first on `first_line`) when every
    line is a well-formed record of `width` fields in UTF-8; None when any is not: a blank line,
    another width, a byte that is not UTF-8, quoting outside RFC 4180, a record across lines."""
    if not data or data.startswith(codecs.BOM_UTF8) or len(data) >= FIELD_SIZE_LIMIT:
        return None  # Arrow would drop a BOM; the csv module caps a field's size
    try:
        text = pa.array([data], pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8
        return None
    if not pc.match_substring_regex(text, WELL_FORMED_LINES)[0].as_py():
        return None
    try:
        table = pa_csv.read_csv(
            pa.BufferReader(data),
            read_options=pa_csv.ReadOptions(
                autogenerate_column_names=True, use_threads=False, block_size=len(data) + 1
            ),
            parse_options=pa_csv.ParseOptions(newlines_in_values=False),
            convert_options=pa_csv.ConvertOptions(
                column_types={f"f{i}": pa.string() for i in range(width)},
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                check_utf8=False,  # the whole text was checked above; fields split at ASCII
            ),
        )
    except pa.ArrowInvalid:  # rows of different widths
        return None
    ends = (np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n")) + 1).tolist()
    if ends[-1:] != [len(data)]:
        ends.append(len(data))  # the file's last line, without a line end
    if table.num_columns != width or table.num_rows != len(ends):  # blank lines are skipped
        return None
    columns = [c.combine_chunks() for c in table.columns]
    return RecordColumns(first_line, data, [0, *ends], columns)
