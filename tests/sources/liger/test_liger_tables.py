"""The batched record tables (pipelines/sources/liger/tables.py) equal the row path's: every
outcome of
`normalize_bytes` fed to RecordSetBuilder in order, table for table and row for row. On the
shared CSV, on repeated rows, and on generated files mixing good rows with damaged ones."""

from __future__ import annotations

import io

import pyarrow as pa
from hypothesis import given
from liger_oracle import row_outcomes
from liger_support import HEADER, LIGER_CSV, csv_lines
from test_liger_columnar import batch_sizes, generated_examples, generated_files

from pipelines.records.record_objects import RecordSetBuilder
from pipelines.sources.liger.columnar import normalized_batches
from pipelines.sources.liger.model import PARSER_VERSION, Normalizer
from pipelines.sources.liger.tables import batch_tables, record_tables

NORMALIZER = Normalizer()
DIGEST = "sha256:" + "cd" * 32


def row_path(data: bytes) -> dict[str, pa.Table]:
    builder = RecordSetBuilder(DIGEST, PARSER_VERSION)
    for outcome in row_outcomes(data, NORMALIZER):
        builder.add(outcome)
    return builder.tables()


def assert_same_tables(data: bytes, rows: int, expected: dict[str, pa.Table] | None = None) -> None:
    expected = expected or row_path(data)
    got = record_tables(io.BytesIO(data), DIGEST, PARSER_VERSION, NORMALIZER, rows)[1]
    assert set(got) == set(expected)
    for name, table in expected.items():
        assert got[name].equals(table), (name, rows)


def test_shared_csv_same_tables_for_several_batch_sizes() -> None:
    data = LIGER_CSV.read_bytes()
    expected = row_path(data)
    for rows in (7, 1000, 4096):
        assert_same_tables(data, rows, expected)
    # Batches of one row: the file's first rows (every row its own batch costs a batch's setup).
    assert_same_tables(b"".join(data.splitlines(keepends=True)[:120]), 1)


def test_every_row_of_the_shared_csv_is_a_run_row() -> None:
    data = LIGER_CSV.read_bytes()
    for batch in normalized_batches(io.BytesIO(data), NORMALIZER, 1000):
        assert not batch.others
        tables = batch_tables(batch, DIGEST, PARSER_VERSION)
        assert tables["runs"].num_rows == tables["lineage"].num_rows == batch.size


def test_repeated_rows_same_tables() -> None:
    """Rows repeated across and within batches: duplicates quarantined, manifests once."""
    lines = csv_lines(list(range(2, 300)))
    data = ("\n".join([HEADER, *lines, *lines[:50], *lines[10:20]]) + "\n").encode()
    assert_same_tables(data, 64)


@generated_examples
@given(data=generated_files, batch_rows=batch_sizes)
def test_generated_files_same_tables(data: bytes, batch_rows: int) -> None:
    assert_same_tables(data, batch_rows)
