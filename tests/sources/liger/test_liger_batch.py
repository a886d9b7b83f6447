"""Many small Liger files read together (`record_sets`, `files_record_tables`: batches that hold
several files' rows) give each file exactly the record set it gets alone (`record_set`), and
the row path's (RecordSetBuilder over `normalize_bytes`): line numbers, snapshot digests,
duplicates and first manifests are each file's own."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pytest
from index_support import csv_bytes, liger_rows

from pipelines.records.record_objects import RecordSetBuilder, RecordSetContent
from pipelines.sources.liger import normalize
from pipelines.sources.liger.normalize import (
    NotLigerCsv,
    normalize_bytes,
    parser_version,
    record_set,
    record_sets,
)
from pipelines.sources.liger.tables import files_record_tables

VERSION = parser_version()
NOT_LIGER = b"name,value\nalpha,1\n"


def digest(i: int) -> str:
    return f"sha256:{i:064x}"


def small_files() -> list[bytes]:
    """The shared CSV cut into files of varying sizes, and files that test each file's rules."""
    header, rows = liger_rows(range(2, 2450))
    sizes = [1, 20, 3, 20, 47, 20, 8, 20, 120, 2] * 4
    files, at = [], 0
    for size in sizes:
        files.append(csv_bytes(header, rows[at : at + size]))
        at += size
    bad = list(rows[5])
    bad[header.index("y_value_50")] = "fast"
    late = list(rows[7])
    late[header.index("timestamp")] = "2024-02-30 10:00:00"
    files += [
        # duplicates inside a file, near and far from the first copy
        csv_bytes(header, rows[900:920] + rows[900:903] + rows[905:925] + rows[900:901]),
        # the same rows in two files (and the same bytes under two digests below)
        csv_bytes(header, rows[:20]),
        csv_bytes(header, rows[:20]),
        # rows to quarantine: a bad number, a short row, a bad date, a wrong kernel
        csv_bytes(header, [rows[3], bad, rows[4][:3], late, ["nope", *rows[9][1:]], rows[3]]),
        # only a header
        csv_bytes(header, []),
        # a file longer than a batch of the tests' small batches
        csv_bytes(header, rows[1000:1700]),
    ]
    # another column order
    order = list(range(len(header)))
    random.Random(7).shuffle(order)
    files.append(csv_bytes([header[i] for i in order], [[r[i] for i in order] for r in rows[:30]]))
    # a BOM, CRLF line ends and a blank line
    text = csv_bytes(header, rows[40:60]).replace(b"\n", b"\r\n")
    files.append(b"\xef\xbb\xbf" + text.replace(b"\r\n", b"\r\n\r\n", 3))
    return files


def row_path(data: bytes, snapshot_digest: str) -> tuple[int, dict[str, pa.Table]]:
    builder = RecordSetBuilder(snapshot_digest, VERSION)
    for outcome in normalize_bytes(data):
        builder.add(outcome)
    return builder.rows, builder.tables()


def assert_same(got: RecordSetContent, expected: RecordSetContent) -> None:
    assert got.rows == expected.rows
    assert got.lineage_in_runs and expected.lineage_in_runs
    assert set(got.tables) == set(expected.tables)
    for name, table in expected.tables.items():
        assert got.tables[name].equals(table), name


def test_record_sets_of_many_small_files_are_each_files_own() -> None:
    files = small_files()
    pairs = [(data, digest(i)) for i, data in enumerate(files)]
    pairs.append((files[-5], digest(1)))  # the same bytes as another file, another digest
    contents = record_sets(pairs, VERSION)
    assert len(contents) == len(pairs)
    for (data, snapshot), content in zip(pairs, contents, strict=True):
        assert_same(content, record_set(data, snapshot, VERSION))
        rows, tables = row_path(data, snapshot)
        assert content.rows == rows
        for name, table in tables.items():
            assert content.tables[name].equals(table), name
    # the rules each file keeps
    reasons = [c.tables["quarantine"].column("reason").to_pylist() for c in contents]
    assert reasons[40].count("duplicate_external_id") == 3 + 15 + 1
    assert "duplicate_external_id" not in reasons[41] + reasons[42]
    assert contents[41].tables["runs"].num_rows == contents[42].tables["runs"].num_rows == 20
    first, second = (contents[i].tables["manifests"] for i in (41, 42))
    assert first.drop_columns("snapshot_digest").equals(second.drop_columns("snapshot_digest"))
    assert set(second.column("snapshot_digest").to_pylist()) == {digest(42)}
    assert contents[44].rows == 0 and contents[44].tables["runs"].num_rows == 0


@pytest.mark.parametrize("rows", [7, 256])
def test_batches_that_cut_files_and_a_file_that_is_no_liger_csv(rows: int) -> None:
    """Batches that end inside files and hold several; a file that is no Liger CSV raises its
    NotLigerCsv alone, and record_sets raises it."""
    files = small_files()
    files.insert(3, NOT_LIGER)
    streams = [(io.BytesIO(data), digest(i)) for i, data in enumerate(files)]
    read = files_record_tables(streams, VERSION, rows=rows)
    for i, data in enumerate(files):
        if data is NOT_LIGER:
            with pytest.raises(NotLigerCsv):
                read.of(i)
            continue
        got_rows, tables = read.of(i)
        expected = record_set(data, digest(i), VERSION)
        assert_same(RecordSetContent(got_rows, tables, lineage_in_runs=True), expected)
    with pytest.raises(NotLigerCsv):
        record_sets([(data, digest(i)) for i, data in enumerate(files)], VERSION)


def test_runs_of_files_on_every_core_are_each_files_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past PARALLEL_FROM_BYTES, runs of files are read in worker processes: the same sets."""
    monkeypatch.setattr(normalize, "PARALLEL_FROM_BYTES", 0)
    monkeypatch.setattr(normalize, "usable_cpus", lambda: 2)
    pairs = [(data, digest(i)) for i, data in enumerate(small_files())]
    for (data, snapshot), content in zip(pairs, record_sets(pairs, VERSION), strict=True):
        assert_same(content, record_set(data, snapshot, VERSION))
