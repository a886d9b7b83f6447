"""Several Liger files' record sets built on every core (`LigerCsvSource.record_sets`, a
ProcessPoolExecutor over the files) are exactly each file's row path, duplicates and bad rows
included, in the files' order; also from a forkserver when other threads run (a Dagster run).
`kindex normalize` of a large file in chunks of lines writes what one process writes."""

from __future__ import annotations

import io
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from index_support import LIGER_CSV, csv_bytes, liger_rows

from pipelines import forked
from pipelines.index.record_objects import RecordSetBuilder
from pipelines.sources import LigerCsvSource, SourceContext, SourceObject
from pipelines.sources.liger import normalize
from pipelines.sources.liger.columnar import count_outcomes, normalized_batches, write_json_lines
from pipelines.sources.liger.normalize import normalize_bytes, parser_version

DIGESTS = ["sha256:" + digit * 64 for digit in "abc"]


def serial_tables(data: bytes, digest: str) -> tuple[int, dict[str, Any]]:
    builder = RecordSetBuilder(digest, parser_version())
    for outcome in normalize_bytes(data):
        builder.add(outcome)
    return builder.rows, builder.tables()


def messy_csv() -> bytes:
    """The shared CSV's first 900 rows, then: rows repeated verbatim (duplicate externalIds,
    near their first copy and far from it), a row with a bad number, a short row."""
    header, rows = liger_rows(range(2, 902))
    bad = list(rows[5])
    bad[header.index("y_value_50")] = "fast"
    extra = [rows[1], rows[850], bad, rows[2][:3], rows[0]]
    return csv_bytes(header, rows[:400] + extra + rows[400:])


def assert_record_sets_are_the_row_path(files: list[bytes], tmp_path: Path) -> None:
    objects = [SourceObject(d, data) for d, data in zip(DIGESTS, files, strict=False)]
    contents = LigerCsvSource().record_sets(objects, SourceContext(), tmp_path)
    assert len(contents) == len(objects)
    for content, source in zip(contents, objects, strict=True):
        rows, tables = serial_tables(source.data, source.snapshot_digest)
        assert content.rows == rows
        assert content.lineage_in_runs
        for name, table in tables.items():
            assert content.tables[name].equals(table), name


def test_record_sets_on_every_core_equal_the_row_path(tmp_path: Path) -> None:
    files = [LIGER_CSV.read_bytes(), messy_csv(), csv_bytes(*liger_rows(range(2, 12)))]
    assert_record_sets_are_the_row_path(files, tmp_path)
    _, tables = serial_tables(files[1], DIGESTS[1])
    reasons = tables["quarantine"].column("reason").to_pylist()
    assert reasons.count("duplicate_external_id") == 3


@pytest.mark.parametrize("files", [1, 2])
def test_record_sets_from_a_forkserver_when_other_threads_run(files: int, tmp_path: Path) -> None:
    """Inside a Dagster run other threads are alive, and workers must not be forked from
    them: they come from a forkserver; one file is read in this process."""
    done = threading.Event()
    other = threading.Thread(target=done.wait, name="like-a-dagster-thread")
    other.start()
    try:
        context = forked.worker_context("pipelines.sources.liger.normalize")
        assert context.get_start_method() == "forkserver"
        assert_record_sets_are_the_row_path([messy_csv()] * files, tmp_path)
    finally:
        done.set()
        other.join()


def serial_lines(data: bytes) -> tuple[bytes, Counter[str]]:
    out, counts = io.BytesIO(), Counter[str]()
    for batch in normalized_batches(io.BytesIO(data)):
        write_json_lines(batch, out)
        count_outcomes(batch, counts)
    return out.getvalue(), counts


def with_a_record_across_lines(data: bytes) -> bytes:
    """`data` with a quoted line break in a row past its first chunks: read here, not in
    chunks, from that chunk on."""
    lines = data.splitlines(keepends=True)
    assert b'"{""' in lines[700]
    lines[700] = lines[700].replace(b'"{""', b'"{\n""', 1)
    return b"".join(lines)


@pytest.mark.parametrize(
    "data",
    [LIGER_CSV.read_bytes(), messy_csv(), with_a_record_across_lines(messy_csv())],
    ids=["shared", "messy", "across-lines"],
)
def test_normalize_in_chunks_writes_the_serial_lines(
    data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kindex normalize` of a large file, a chunk of lines per process: the same lines and
    counts as one process reading it, duplicates across chunks quarantined in order."""
    monkeypatch.setattr(normalize, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(normalize, "CHUNK_LINES", 150)
    monkeypatch.setattr(normalize, "usable_cpus", lambda: 2)
    path = tmp_path / "file.csv"
    path.write_bytes(data)
    expected, expected_counts = serial_lines(data)
    out = io.BytesIO()
    done: list[int] = []
    assert normalize.normalize_file(path, out, done.append) == expected_counts
    assert out.getvalue() == expected
    assert normalize.normalize_file(path, None) == expected_counts
    assert done[-1] == len(data)
