"""Whole lines read column by column (`read.record_columns`, Arrow's CSV parser) give the records
the streaming reader gives, or None: on generated lines with every quoting rule Python's csv and
Arrow might disagree on; and a batch of them normalizes to the row path's bytes."""

from __future__ import annotations

import csv
import io

from hypothesis import given, settings
from hypothesis import strategies as st
from liger_support import HEADER, LIGER_CSV, csv_lines
from test_liger_bad_inputs import row_with
from test_liger_columnar import DAMAGES, generated_examples, row_path

from pipelines.intake.seen_keys import SeenKeys
from pipelines.sources.liger.columnar import (
    normalize_batch,
    quarantine_duplicates,
    write_json_lines,
)
from pipelines.sources.liger.normalize import Layout, Normalizer
from pipelines.sources.liger.read import open_liger_csv, record_columns, segment_records

NORMALIZER = Normalizer()


def streamed(data: bytes, first_line: int) -> list[object]:
    records, taken = segment_records(list(io.BytesIO(data)), first_line, [])
    assert taken == []
    return list(records)


def by_columns(data: bytes, first_line: int, width: int) -> list[object] | None:
    columns = record_columns(data, first_line, width)
    return None if columns is None else [columns[i] for i in range(len(columns))]


# Characters where the two parsers' rules could part: quotes, separators, line ends, NUL, a BOM,
# spaces, and text that is not ASCII.
ODD_TEXT = st.text(alphabet='ab ",\r\n\x00\ufeff\u00e9\t', max_size=8)


def written(fields: list[str], quoting: int, newline: str) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, quoting=quoting, lineterminator=newline).writerow(fields)
    return buffer.getvalue()


well_formed_lines = st.builds(
    written,
    st.lists(st.text(alphabet='ab ",\u00e9\t', max_size=6), min_size=3, max_size=3),
    st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]),
    st.sampled_from(["\n", "\r\n"]),
)
odd_lines = st.lists(ODD_TEXT, min_size=1, max_size=4).map(lambda parts: ",".join(parts) + "\n")


@settings(max_examples=600, deadline=None)
@given(st.lists(well_formed_lines | odd_lines, min_size=1, max_size=8), st.integers(2, 50))
def test_same_records_as_the_streaming_reader_or_none(lines: list[str], first_line: int) -> None:
    data = "".join(lines).encode()
    got = by_columns(data, first_line, 3)
    if got is not None:
        assert got == streamed(data, first_line)


@settings(max_examples=300, deadline=None)
@given(st.lists(well_formed_lines, min_size=1, max_size=8), st.integers(2, 50))
def test_well_formed_lines_are_read_by_columns(lines: list[str], first_line: int) -> None:
    """Records csv.writer writes (no line break inside a field) are always read by Arrow."""
    data = "".join(lines).encode()
    assert by_columns(data, first_line, 3) == streamed(data, first_line)


def test_what_falls_back_to_the_streaming_reader() -> None:
    for data in [
        b"a,b,c\n\na,b,c\n",  # a blank line
        b"a,b\n",  # another width
        b'a,"b\nc",d\n',  # a record across lines
        b'a,b"c,d\n',  # a quote inside an unquoted field
        b'a,"b"c,d\n',  # text after a closing quote
        b"a,\xff,c\n",  # not UTF-8
        b"\xef\xbb\xbfa,b,c\n",  # a BOM
        b"a,b\x00,c\n",  # a NUL
        b"a,b\rc,d\n",  # a lone carriage return
        b"",
    ]:
        assert record_columns(data, 2, 3) is None, data


def normalized_by_columns(data: bytes) -> bytes:
    """A file's lines as one batch read by columns, normalized and written."""
    header, body = data.split(b"\n", 1)
    layout = Layout.of(open_liger_csv([header + b"\n"]).columns)
    columns = record_columns(body, 2, layout.width)
    assert columns is not None
    batch = normalize_batch(columns, layout, NORMALIZER)
    quarantine_duplicates(batch, columns, SeenKeys())
    out = io.BytesIO()
    write_json_lines(batch, out)
    return out.getvalue()


def test_shared_csv_by_columns_is_the_row_path() -> None:
    data = LIGER_CSV.read_bytes()
    assert normalized_by_columns(data) == row_path(data)


one_line_rows = st.sampled_from(csv_lines(list(range(2, 2450, 37)))) | st.builds(
    lambda damage: row_with(**damage), st.sampled_from(DAMAGES)
)


@generated_examples
@given(st.lists(one_line_rows, min_size=1, max_size=40), st.sampled_from(["\n", "\r\n"]))
def test_generated_rows_by_columns_are_the_row_path(rows: list[str], newline: str) -> None:
    """Good rows, damaged ones (one line each) and repeats: the row path's bytes."""
    data = (newline.join([HEADER, *rows]) + newline).encode()
    assert normalized_by_columns(data) == row_path(data)
