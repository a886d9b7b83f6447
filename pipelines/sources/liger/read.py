"""Step 1 of the Liger source: read a benchmark CSV tolerantly, one record at a time.

Accepts a UTF-8 BOM, CRLF or LF line ends, quoted fields (even across lines) and header columns
in any order. Streams: memory does not grow with the file. Yields every record with the 1-based
line it starts on (the header is line 1) and its raw text, so nothing is dropped unseen.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pipelines.sources.liger.rules import LAYOUTS, QUANTILES, CsvLayout

# The header of Liger's CSV today; an older layout names other value columns (rules.LAYOUTS:
# `y_value_mean,y_value_std` in 2024) in place of the quantiles'.
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


def layout_columns(layout: CsvLayout) -> tuple[str, ...]:
    """The columns a layout's header has (in today's order; a header may order them any way):
    today's, its value columns in the quantiles' place, its own names for others."""
    at = COLUMNS.index(QUANTILES.columns[0])
    shared = [c for c in COLUMNS if c not in QUANTILES.columns]
    if not layout.versioned:
        shared.remove("liger_version")
    named = dict(layout.renamed)
    shared = [named.get(c, c) for c in shared]
    return (*shared[:at], *layout.statistics.columns, *shared[at:])


# The csv module's own cap on a field's size is not a rule of the source: a field is at most its
# lines, which the reader holds already. What a field may hold is rules.FIELD_LIMIT.
csv.field_size_limit(sys.maxsize)


class NotLigerCsv(ValueError):
    """The object is not a Liger benchmark CSV (empty, binary, or without Liger's header)."""


@dataclass(slots=True)
class CsvRecord:
    line: int
    raw: str
    fields: list[str] | None  # None when the record could not be parsed at all
    error: str | None = None  # reason code when fields is None or the bytes were not UTF-8


@dataclass(slots=True)
class LigerCsv:
    columns: tuple[str, ...]  # as the header names them, in file order
    records: Iterator[CsvRecord]
    layout: CsvLayout  # the layout its header names
    # Set once the lines ran out inside a record (a quoted field still open): a part of a file
    # cut there did not end where a record ends, so the cut was not one the whole file has.
    torn: bool = False

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


def layout_of(columns: tuple[str, ...]) -> CsvLayout:
    """The layout a header names: the first of rules.LAYOUTS whose columns it has all of;
    NotLigerCsv naming what today's layout lacks when none."""
    for layout in LAYOUTS:
        if all(c in columns for c in layout_columns(layout)):
            return layout
    missing = [c for c in COLUMNS if c not in columns]
    raise NotLigerCsv(f"header lacks Liger column(s): {', '.join(missing)}")


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
    layout_of(columns)
    return columns


def open_liger_csv(lines: Iterable[bytes], first_line: int = 2) -> LigerCsv:
    """Read the header from binary lines (a file opened "rb", or bytes split with keepends).
    The lines after it are numbered from `first_line`: a part of a file cut at a record's
    start is read as its header and then that part's lines."""
    iterator = iter(lines)
    columns = _parse_header(next(iterator, b""))
    csv_file = LigerCsv(columns, iter(()), layout_of(columns))
    csv_file.records = _records(iterator, first_line, csv_file)
    return csv_file


def _records(lines: Iterable[bytes], first_line: int, csv_file: LigerCsv) -> Iterator[CsvRecord]:
    bad_lines: set[int] = set()
    consumed: list[str] = []

    def decoded() -> Iterator[str]:
        yield from _decoded_lines(lines, bad_lines, consumed, first_line)
        # The reader asks for a line past the last with text consumed only inside a record.
        csv_file.torn = bool(consumed)

    reader = csv.reader(decoded(), strict=False)
    next_line = first_line
    while True:
        try:
            fields: list[str] | None = next(reader)
            error = None
        except StopIteration:
            return
        except csv.Error as failure:
            fields, error = None, f"unparseable_row: {failure}"
        raw = (consumed[0] if len(consumed) == 1 else "".join(consumed)).rstrip("\r\n")
        consumed.clear()
        start, next_line = next_line, reader.line_num + first_line
        if fields is not None and (not fields or len(fields) == 1 and not raw.strip()):
            continue  # blank line: no data, nothing to lose
        if bad_lines and error is None and any(n in bad_lines for n in range(start, next_line)):
            error = "bad_encoding"
        yield CsvRecord(start, raw, fields, error)
