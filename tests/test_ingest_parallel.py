"""Several Liger files' record sets built on every core (`LigerCsvSource.record_sets`, a
ProcessPoolExecutor over the files) are exactly each file's row path, duplicates and bad rows
included, in the files' order; also from a forkserver when other threads run (a Dagster run)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from index_support import LIGER_CSV, csv_bytes, liger_rows

from pipelines import forked
from pipelines.records.record_objects import RecordSetBuilder
from pipelines.sources import LigerCsvSource, SourceContext, SourceObject
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
