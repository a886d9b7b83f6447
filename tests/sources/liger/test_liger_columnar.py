"""The batched, column-by-column Liger normalizer (pipelines/sources/liger/columnar.py) writes
exactly the
bytes the row-by-row oracle writes (`RowOutcome.json_line` of each of tests/liger_oracle.py's
`row_outcomes`): on the shared CSV, on the bad-CSV corpus and on generated files mixing good rows
with damaged ones."""

from __future__ import annotations

import csv
import io
import math
import os
import random

import numpy as np
import pyarrow as pa
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from liger_oracle import row_outcomes
from liger_support import HEADER, LIGER_CSV, csv_lines
from test_liger_bad_inputs import GOOD_FIELDS, row_with

from pipelines.sources.liger.columnar import (
    ARROW_FLOAT_TEXT,
    _encode,
    _fill,
    _json_strings,
    normalized_batches,
    write_json_lines,
)
from pipelines.sources.liger.model import Normalizer, Template, json_string
from pipelines.sources.liger.rules import RowRejected, _stamp, stamps
from pipelines.sources.seen_keys import SeenKeys

NORMALIZER = Normalizer()


def row_path(data: bytes) -> bytes:
    return b"".join(o.json_line() for o in row_outcomes(data, NORMALIZER))


def batch_path(data: bytes, rows: int) -> bytes:
    out = io.BytesIO()
    for batch in normalized_batches(io.BytesIO(data), NORMALIZER, rows):
        write_json_lines(batch, out)
    return out.getvalue()


def test_shared_csv_same_bytes_for_several_batch_sizes() -> None:
    data = LIGER_CSV.read_bytes()
    expected = row_path(data)
    for rows in (7, 1000, 4096):
        assert batch_path(data, rows) == expected, rows
    # Batches of one row: the file's first rows (every row its own batch costs a batch's setup).
    head = b"".join(data.splitlines(keepends=True)[:120])
    assert batch_path(head, 1) == row_path(head)


def test_file_with_repeated_rows_same_bytes() -> None:
    """Rows repeated across batches: the duplicates are quarantined in both paths."""
    lines = csv_lines(list(range(2, 300)))
    data = ("\n".join([HEADER, *lines, *lines[:50], *lines]) + "\n").encode()
    assert batch_path(data, 64) == row_path(data)


def test_written_to_a_real_file_with_writev(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = LIGER_CSV.read_bytes()
    target = tmp_path / "lines.jsonl"
    with target.open("wb") as out:
        for batch in normalized_batches(io.BytesIO(data), NORMALIZER, 500):
            write_json_lines(batch, out)
    assert target.read_bytes() == row_path(data)


DAMAGES = [
    {"y_value_50": "1e-05"},
    {"y_value_50": " 0.5"},
    {"y_value_20": "0"},
    {"y_value_80": "nan"},
    {"y_value_50": "1e300"},
    {"y_value_50": "12345678901"},
    {"y_value_20": "0.00001234"},
    {"y_value_20": "5"},
    {"y_value_20": "000.5000"},
    {"y_value_50": "9" * 400},  # parses as inf
    {"y_value_80": "0." + "0" * 400 + "1"},  # parses as 0
    {"kernel_name": "no_such_kernel"},
    {"gpu_name": "NVIDIA H300"},
    {"timestamp": "2026-02-30 10:00:00"},
    {"timestamp": "2026-01-01T10:00:00"},
    {"liger_version": ""},
    {"liger_version": "  0.6.1 \t"},
    {"liger_version": 've"r\\s\u00e9\u2028'},
    {"x_value": "1024.5"},
    {"extra_benchmark_config_str": "{"},
    {"metric_name": "memory", "metric_unit": "MB"},
]
good_rows = st.sampled_from(csv_lines(list(range(2, 2450, 37))))
damaged_rows = (
    st.builds(lambda damage: row_with(**damage), st.sampled_from(DAMAGES))
    | st.sampled_from(
        [
            ",".join(GOOD_FIELDS[:-1]),  # a column short
            "",  # a blank line
            "garbage",
            '"an open quote,' + ",".join(GOOD_FIELDS[1:]),  # runs into the next lines
        ]
    )
)

# Files of good and damaged rows, LF or CRLF, and a batch size: for tests that hold a batched
# path to the row path (KINDEX_EXAMPLES=1000 runs more examples than CI does).
generated_files = st.builds(
    lambda rows, newline: (newline.join([HEADER, *rows]) + newline).encode(),
    st.lists(good_rows | damaged_rows, min_size=1, max_size=40),
    st.sampled_from(["\n", "\r\n"]),
)
batch_sizes = st.integers(min_value=1, max_value=16)
generated_examples = settings(
    max_examples=int(os.environ.get("KINDEX_EXAMPLES", "150")), deadline=None
)


@generated_examples
@given(data=generated_files, batch_rows=batch_sizes)
def test_generated_files_same_bytes(data: bytes, batch_rows: int) -> None:
    assert batch_path(data, batch_rows) == row_path(data)


@settings(max_examples=2000, deadline=None)
@given(
    st.floats(
        min_value=ARROW_FLOAT_TEXT[0], max_value=ARROW_FLOAT_TEXT[1], exclude_max=True
    ).filter(lambda v: not v.is_integer())
)
def test_arrow_prints_floats_as_rfc8785_in_its_range(number: float) -> None:
    assert pa.array([number]).cast(pa.string())[0].as_py() == rfc8785.dumps(number).decode()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(min_value=0, max_value=300).map(str), max_size=60), max_size=12)
)
def test_seen_keys_is_a_set_that_remembers_order(batches: list[list[str]]) -> None:
    seen, reference = SeenKeys(), set()
    for texts in batches:
        expected = []
        for text in texts:
            expected.append(text not in reference)
            reference.add(text)
        assert list(seen.first_times(texts)) == expected
    assert len(seen) == len(reference)


def test_parsed_number_texts_agree_with_python() -> None:
    """Arrow parses the plain decimals the batch path takes exactly as float() does."""
    texts = [row[8] for row in csv.reader(io.StringIO(LIGER_CSV.read_text()))][1:]
    texts += ["0.1", "000.5000", "123456789012345678901234567890.5", "0.30000000000000004"]
    parsed = pa.array(texts).cast(pa.float64()).to_pylist()
    assert parsed == [float(t) for t in texts]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=6).flatmap(
        lambda width: st.lists(
            st.tuples(*[st.sampled_from(["a", "b", "", "é", "a,b"])] * width), min_size=1
        )
    )
)
def test_encode_numbers_distinct_rows_in_order_of_first_appearance(
    rows: list[tuple[str, ...]],
) -> None:
    columns = [pa.array(column, pa.string()) for column in zip(*rows, strict=True)]
    values, codes = _encode(columns, lambda key: key)
    assert values == list(dict.fromkeys(rows))
    assert [values[c] for c in codes] == rows


def test_encode_renumbers_before_the_combinations_overflow() -> None:
    """Six columns of ~1,900 distinct values each: their combinations exceed 2**62."""
    draw = random.Random(0).randrange
    rows = [tuple(str(draw(2000)) for _ in range(6)) for _ in range(4000)]
    columns = [pa.array(column, pa.string()) for column in zip(*rows, strict=True)]
    assert math.prod(len(set(column.to_pylist())) for column in columns) > 2**62
    values, codes = _encode(columns, lambda key: key)
    assert values == list(dict.fromkeys(rows))
    assert [values[c] for c in codes] == rows


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet='ab"\\\x00\x1f\u00e9\u2028/', max_size=6), min_size=1))
def test_json_strings_escape_as_json_string(texts: list[str]) -> None:
    got = _json_strings(pa.array(texts, pa.string()), plain=False).to_pylist()
    assert got == [json_string(t) for t in texts]


def _timestamp_texts() -> st.SearchStrategy[str]:
    """Liger's timestamp form around the edges of every field (a month 13, a February 29 of a
    year that has none, a year 0000), with the other separator, other digits and spaces."""
    fields = st.tuples(
        st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25),
        st.integers(0, 60), st.integers(0, 60), st.sampled_from([" ", "T", "_"]),
    )  # fmt: skip
    plain = fields.map(
        lambda f: f"{f[0]:04d}-{f[1]:02d}-{f[2]:02d}{f[6]}{f[3]:02d}:{f[4]:02d}:{f[5]:02d}"
    )
    odd = st.tuples(plain, st.sampled_from(["", " ", "\u0663", "Z", "1"]), st.booleans()).map(
        lambda t: t[1] + t[0] if t[2] else t[0] + t[1]
    )
    return st.one_of(plain, odd, st.text(alphabet="0123456789-: T\u0663", max_size=20))


@settings(max_examples=300, deadline=None)
@given(st.lists(_timestamp_texts(), min_size=1, max_size=30, unique=True))
def test_stamps_read_column_wise_as_parse_timestamp_reads_them(texts: list[str]) -> None:
    def said(stamp: object) -> object:
        return (stamp.reason, stamp.detail) if isinstance(stamp, RowRejected) else stamp

    assert list(map(said, stamps(pa.array(texts, pa.string())))) == [
        said(_stamp(text)) for text in texts
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_fill_joins_templates_whose_holes_come_in_other_orders(codes: list[int]) -> None:
    """Each row is filled as its own template would fill it alone."""
    templates = [
        Template(("<", "|", ">"), ("x", "y")),
        Template(("", "-", "-", ""), ("y", "x", "y")),
        Template(("", "%"), ("z",)),
        Template(("plain",), ()),
    ]
    holes = {name: [f"{name}{row}" for row in range(len(codes))] for name in "xyz"}
    expected = [templates[c].fill({n: holes[n][row] for n in "xyz"}) for row, c in enumerate(codes)]
    arrays = {name: pa.array(values) for name, values in holes.items()}
    assert _fill(np.array(codes), templates, arrays).to_pylist() == expected
