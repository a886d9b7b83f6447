"""The record tables built on every core (pipelines/sources/liger/relay.py) are exactly the row
path's,
duplicates and bad rows included, and an ingest through them gives the same index."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from index_support import (
    LIGER_CSV,
    csv_bytes,
    fingerprints,
    index_settings,
    ingest_bytes,
    liger_rows,
)

from pipelines import forked
from pipelines import ingest as ingest_module
from pipelines.index.record_objects import LINEAGE_SCHEMA, PartFacts, RecordSetBuilder
from pipelines.sources.liger import relay
from pipelines.sources.liger.normalize import PARSER_VERSION, normalize_bytes

__all__ = ["index_settings"]
DIGEST = "sha256:" + "ab" * 32


def serial_tables(data: bytes) -> tuple[int, dict[str, Any]]:
    builder = RecordSetBuilder(DIGEST, PARSER_VERSION)
    for outcome in normalize_bytes(data):
        builder.add(outcome)
    return builder.rows, builder.tables()


def relay_tables(path: Path, workers: int, in_memory: bool = False) -> tuple[int, dict[str, Any]]:
    """The relay's record set as whole tables: its parts read back, in input order. The
    workers read the file, or (`in_memory`) its bytes as this process holds them."""
    csv = path.read_bytes() if in_memory else path
    parts_dir = path.parent / "parts"
    parts_dir.mkdir()
    content = relay.record_set_file(
        csv, DIGEST, PARSER_VERSION, workers=workers, segment_bytes=40_000, parts_dir=parts_dir
    )
    assert content is not None
    tables = dict(content.tables)
    for name, parts in content.parts.items():
        assert len(parts) == workers  # a part per worker, none empty of its schema
        assert {part.parent for part in parts} == {parts_dir}
        read = [pq.read_table(part) for part in parts]
        tables[name] = pa.concat_tables(read).sort_by("source_line")
    # The lineage is the runs' own lineage columns.
    assert content.lineage_in_runs and "lineage" not in content.tables
    tables["lineage"] = tables["runs"].select(LINEAGE_SCHEMA.names)
    facts = PartFacts.of({name: tables[name] for name in content.parts})
    assert (content.part_facts.rows, content.part_facts.run_preview) == (
        facts.rows,
        facts.run_preview,
    )
    assert content.part_facts.runs_by_metric == facts.runs_by_metric
    return content.rows, tables


def messy_csv() -> bytes:
    """The shared CSV's first 900 rows, then: rows repeated verbatim (duplicate externalIds,
    near their first copy and far from it), a row with a bad number, a short row."""
    header, rows = liger_rows(range(2, 902))
    bad = list(rows[5])
    bad[header.index("y_value_50")] = "fast"
    extra = [rows[1], rows[850], bad, rows[2][:3], rows[0]]
    return csv_bytes(header, rows[:400] + extra + rows[400:])


@pytest.mark.parametrize("data", [LIGER_CSV.read_bytes(), messy_csv()], ids=["shared", "messy"])
@pytest.mark.parametrize(
    ("workers", "in_memory"), [(1, False), (2, False), (3, False), (2, True), (3, True)]
)
def test_tables_on_every_core_equal_the_row_path(
    data: bytes, workers: int, in_memory: bool, tmp_path: Path
) -> None:
    path = tmp_path / "file.csv"
    path.write_bytes(data)
    # Segments of ~150 rows: many of them, and duplicates across them.
    rows, tables = relay_tables(path, workers, in_memory)
    serial_rows, serial = serial_tables(data)
    assert rows == serial_rows
    assert set(tables) == set(serial)
    for name, table in serial.items():
        assert tables[name].equals(table), name
    if data != LIGER_CSV.read_bytes():
        reasons = tables["quarantine"].column("reason").to_pylist()
        assert reasons.count("duplicate_external_id") == 3


def test_an_ingest_through_the_parallel_path_gives_the_same_index(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = messy_csv()
    ingest_bytes(s3_store, index_settings, [("incoming/messy.csv", data)])
    serial = fingerprints(index_settings)
    parallel_settings = index_settings.replace(
        home=index_settings.home.parent / "parallel-home",
        records_prefix="parallel-records/",
        index_prefix="parallel-index/",
    )
    monkeypatch.setattr(relay, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(relay, "SEGMENT_BYTES", 50_000)
    ingest_bytes(s3_store, parallel_settings, [("incoming/messy.csv", data)])
    assert fingerprints(parallel_settings) == serial


@pytest.mark.parametrize("in_memory", [False, True])
def test_tables_from_a_forkserver_when_other_threads_run(
    tmp_path: Path, in_memory: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a Dagster run other threads are alive, and workers must not be forked from
    them: they come from a forkserver (which cannot share this process's memory: bytes held
    here reach it as a temporary file, in shared memory), and the tables are the same."""
    data = messy_csv()
    path = tmp_path / "file.csv"
    path.write_bytes(data)
    shared = tmp_path / "shm"
    shared.mkdir()
    monkeypatch.setattr(relay, "SHARED_MEMORY", shared)
    made: list[tuple[str | None, str | None]] = []
    real_temporary_directory = relay.tempfile.TemporaryDirectory

    def temporary_directory(**kwargs: Any) -> Any:
        made.append((kwargs.get("prefix"), kwargs.get("dir")))
        return real_temporary_directory(**kwargs)

    monkeypatch.setattr(relay.tempfile, "TemporaryDirectory", temporary_directory)
    done = threading.Event()
    other = threading.Thread(target=done.wait, name="like-a-dagster-thread")
    other.start()
    try:
        context = forked.worker_context("pipelines.sources.liger.relay")
        assert context.get_start_method() == "forkserver"
        rows, tables = relay_tables(path, 2, in_memory)
    finally:
        done.set()
        other.join()
    serial_rows, serial = serial_tables(data)
    assert rows == serial_rows
    for name, table in serial.items():
        assert tables[name].equals(table), name
    assert (("kindex-ingest-", str(shared)) in made) == in_memory


def test_tables_spool_to_shared_memory_only_when_it_has_room(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(relay, "SHARED_MEMORY", tmp_path)
    assert relay._spool_dir(1) == str(tmp_path)
    assert relay._spool_dir(1 << 62) is None  # no room: the temporary directory
    monkeypatch.setattr(relay, "SHARED_MEMORY", tmp_path / "absent")
    assert relay._spool_dir(1) is None


def test_a_digest_function_runs_once_the_workers_do_and_none_stops_them(tmp_path: Path) -> None:
    """An ingest hashes the bytes (and checks for their record set) while the workers read
    their first segments; when the record set exists, the workers are stopped."""
    path = tmp_path / "file.csv"
    path.write_bytes(messy_csv())
    running: list[int] = []

    def digest_unless_written() -> str | None:
        running.append(len(multiprocessing.active_children()))
        return None

    parts_dir = tmp_path / "parts"
    parts_dir.mkdir()
    content = relay.record_set_file(
        path, digest_unless_written, PARSER_VERSION, 2, 40_000, parts_dir=parts_dir
    )
    assert content is None
    assert running == [2]
    assert multiprocessing.active_children() == []


def test_reingesting_a_file_through_the_parallel_path_builds_nothing(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(relay, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(relay, "SEGMENT_BYTES", 50_000)
    path = tmp_path / "messy.csv"
    path.write_bytes(messy_csv())
    first = ingest_module.ingest_paths([path], index_settings, progress=False, store=s3_store)
    before = fingerprints(index_settings)
    again = ingest_module.ingest_paths([path], index_settings, progress=False, store=s3_store)
    assert [f.reused for f in first.files] == [False]
    assert [f.reused for f in again.files] == [True]
    assert again.files[0].snapshot_digest == first.files[0].snapshot_digest
    assert fingerprints(index_settings) == before
