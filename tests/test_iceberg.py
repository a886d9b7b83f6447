"""The index as Iceberg tables: read by a bare DuckDB from what `kindex connect` prints, time
travel with `kindex query --as-of`, compaction that keeps every row, and two homes ("hosts")
publishing into one bucket and catalog at once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import HomeCopy, SharedCsvHome, building_home, drop_bucket, restored_home
from index_support import (
    DATA,
    csv_bytes,
    fingerprints,
    index_settings,
    ingest_bytes,
    liger_rows,
    query,
)

from pipelines.cli import main
from pipelines.index.catalog import (
    COMPACT_ABOVE_FILES,
    LAYOUT_PROPERTY,
    MERGE_ABOVE_MANIFESTS,
    VERSIONS_TABLE,
    IndexCatalog,
    MissingFieldIds,
    Version,
    files_without_field_ids,
    plan_compaction,
)
from pipelines.index.engines import ENGINES
from pipelines.index.local import load_current
from pipelines.index.remote import connect_remote
from pipelines.index.tables import STORED_TABLES, TABLES, VIEWS
from pipelines.intake.ledger import LEDGER_TABLE, FileEntry, Ledger
from pipelines.records.canonical import manifest_digest
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo
from pipelines.storage.embedded import EmbeddedS3
from pipelines.storage.s3 import S3Store

__all__ = ["index_settings"]

# A fresh interpreter that imports duckdb and nothing of kindex: it runs the statements on
# stdin and prints the counts the test compares.
BARE_DUCKDB = """
import json, sys
import duckdb
text = "\\n".join(line for line in sys.stdin.read().splitlines() if not line.startswith("--"))
statements = [s for s in text.split(";\\n") if s.strip()]
con = duckdb.connect(config={"autoinstall_known_extensions": False,
                             "autoload_known_extensions": False})
for statement in statements:
    con.execute(statement)
names = json.loads(sys.argv[1])
counts = {n: con.execute(f"SELECT count(*) FROM {n}").fetchone()[0] for n in names}
digests = [r[0] for r in con.execute("SELECT run_digest FROM runs").fetchall()]
assert not [m for m in sys.modules if m.startswith(("pipelines", "assets", "pyiceberg"))]
print(json.dumps({"counts": counts, "digests": digests}))
"""


def seed_run_digests() -> set[str]:
    digests = set()
    for path in sorted((DATA / "seeds").glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        digests.add(manifest_digest(json.loads(text[text.index("{") :])["run"]))
    return digests


def test_a_bare_duckdb_runs_what_kindex_connect_prints(
    shared_csv: SharedCsvHome, capsys: pytest.CaptureFixture[str]
) -> None:
    """After an ingest of the shared CSV, a fresh process with only duckdb and its extensions
    sees every run, the seeds' digests and the same counts as `kindex query`; pyiceberg reads
    the same runs table through the catalog."""
    s3_store, index_settings = shared_csv.store, shared_csv.settings
    assert main(["connect"]) == 0
    statements = capsys.readouterr().out
    names = [*TABLES, *VIEWS]
    bare = subprocess.run(
        [sys.executable, "-I", "-c", BARE_DUCKDB, json.dumps(names)],
        input=statements,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert bare.returncode == 0, bare.stderr
    seen = json.loads(bare.stdout)
    expected = {n: query(index_settings, f"SELECT count(*) FROM {n}")[0][0] for n in names}
    assert seen["counts"] == expected and expected["runs"] == 2448
    assert seed_run_digests() <= set(seen["digests"])
    catalog = IndexCatalog.beside(s3_store, index_settings)
    runs = catalog.table("run_segments").scan().to_arrow()
    assert runs.num_rows == 2448
    assert set(runs.column("run_digest").to_pylist()) == set(seen["digests"])


def files_read(con: Any, sql: str) -> int:
    """How many data files the query's iceberg_scan opened (DuckDB's EXPLAIN ANALYZE)."""
    plan = con.execute(f"EXPLAIN ANALYZE {sql}").fetchall()[0][1]
    return sum(int(n) for n in re.findall(r"Total Files Read: (\d+)", plan))


@dataclass(frozen=True, slots=True)
class TwoFiles:
    """A home that ingested a.csv (40 rows of the shared CSV), then b.csv (the same cases run
    again later), with the index version each publish made."""

    saved: HomeCopy
    first: Version
    newest: Version


@pytest.fixture(scope="module")
def built_two_files(
    embedded_s3: EmbeddedS3, s3_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TwoFiles]:
    """The two files ingested once for the module: each test reads a copy of that home (or
    adds to it), instead of ingesting the same files again."""
    folder = tmp_path_factory.mktemp("two-files")
    header, rows = liger_rows(range(2, 42))
    at = header.index("timestamp")
    later = [[*row[:at], "2030-01-01 00:00:00", *row[at + 1 :]] for row in rows]
    with building_home(embedded_s3, s3_client, folder) as (store, settings):
        ingest_bytes(store, settings, [("incoming/a.csv", csv_bytes(header, rows))])
        first = load_current(store, settings).version
        ingest_bytes(store, settings, [("incoming/b.csv", csv_bytes(header, later))])
        newest = load_current(store, settings).version
        saved = HomeCopy.saved(s3_client, store.bucket, folder / "home", folder)
    yield TwoFiles(saved, first, newest)
    drop_bucket(s3_client, saved.bucket)


@pytest.fixture
def two_files(
    built_two_files: TwoFiles,
    embedded_s3: EmbeddedS3,
    s3_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[S3Store, Settings, TwoFiles]:
    """The two files' home as it was built, this test's to read or add to (the environment
    points at it, as `s3_store` and `index_settings` do)."""
    store, settings = restored_home(built_two_files.saved, embedded_s3, s3_client, monkeypatch)
    return store, settings, built_two_files


def test_a_bare_duckdb_skips_the_settled_files_for_the_latest_runs(
    two_files: tuple[S3Store, Settings, TwoFiles],
) -> None:
    """Later runs of the same cases settle the first file's runs into a file of their own: the
    views over latest runs and version heads open only the live file through iceberg_scan (the
    table's partition on `live`), while a scan of all runs opens both."""
    _, index_settings, _ = two_files
    con = connect_remote(index_settings)
    assert con.execute(
        "SELECT count(*) FILTER (WHERE live), count(*) FROM run_segments"
    ).fetchone() == (40, 80)
    assert files_read(con, "SELECT count(*) FROM runs WHERE median > 0") == 2
    assert files_read(con, "SELECT count(*) FROM latest_runs") == 1
    assert files_read(con, "SELECT count(*) FROM version_changes") == 1


def test_query_as_of_the_version_before_the_last_file(
    two_files: tuple[S3Store, Settings, TwoFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, built = two_files
    before = built.first
    sql = "SELECT count(*) AS n, count(DISTINCT source_key) AS keys FROM runs"

    def counts(*extra: str) -> str:
        assert main(["query", sql, "--format", "csv", *extra]) == 0
        return capsys.readouterr().out

    assert counts() == "n,keys\n80,2\n"
    assert before.version and before.published_at
    assert counts("--as-of", before.version) == "n,keys\n40,1\n"
    assert counts("--as-of", str(before.snapshot_ids["run_segments"])) == "n,keys\n40,1\n"
    assert counts("--as-of", before.published_at.isoformat()) == "n,keys\n40,1\n"
    assert counts() == "n,keys\n80,2\n"  # the current version is still the local default
    assert main(["query", sql, "--as-of", "2001-01-01T00:00:00Z"]) == 1
    assert "no version was published by then" in capsys.readouterr().err


def every_table(catalog: IndexCatalog) -> list[str]:
    return [*STORED_TABLES, VERSIONS_TABLE, LEDGER_TABLE]


def ledger_entries(bucket: str, count: int, offset: int = 0) -> list[FileEntry]:
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    return [
        FileEntry.pending(bucket, ObjectInfo(f"incoming/f{n}.csv", f"{n:032x}", 10, at), "b")
        for n in range(offset, offset + count)
    ]


def test_every_data_file_of_every_table_carries_its_field_ids(
    two_files: tuple[S3Store, Settings, TwoFiles],
) -> None:
    """Two publishes (a record set's manifests file joining the table as it is, the files the
    publish writes, the run files it rewrites) and a ledger appended to past its compaction:
    every data file that any manifest of any table names carries the table's field IDs."""
    s3_store, index_settings, _ = two_files
    ledger = Ledger.of(s3_store, index_settings)
    for n in range(COMPACT_ABOVE_FILES + 2):
        ledger.append(ledger_entries(s3_store.bucket, 1, n))
    catalog = IndexCatalog.beside(s3_store, index_settings)
    written = set()
    for name in every_table(catalog):
        table = catalog.table(name, refresh=True)
        if table.current_snapshot() is not None:
            written.add(name)
        assert files_without_field_ids(table) == [], name
    # lineage_files and quarantine_files have no rows here (a Liger file's lineage is its runs).
    assert written >= {"run_segments", "manifest_segments", "snapshots", VERSIONS_TABLE}
    assert LEDGER_TABLE in written
    ledger_files = catalog.table(LEDGER_TABLE).current_snapshot().summary["total-data-files"]
    assert int(ledger_files) < COMPACT_ABOVE_FILES + 2  # compacted
    # Every row kept: those appended here, and the two files' rows their processing committed.
    assert len(ledger.current()) == COMPACT_ABOVE_FILES + 2 + 2


def test_no_table_takes_a_file_without_field_ids(s3_store: Any, index_settings: Any) -> None:
    header, rows = liger_rows(range(2, 12))
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", csv_bytes(header, rows))])
    catalog = IndexCatalog.beside(s3_store, index_settings)
    plain = Path(index_settings.home) / "plain.parquet"
    runs = catalog.table("run_segments").scan().to_arrow()
    pq.write_table(runs.cast(runs.schema.remove_metadata()), plain)  # as kindex wrote them
    assert pq.read_schema(plain).field("run_digest").metadata is None
    location = catalog.upload("run_segments", plain)
    with pytest.raises(MissingFieldIds, match="run_digest"):
        catalog.add_files("run_segments", [location])
    assert catalog.table("run_segments", refresh=True).scan().to_arrow().num_rows == 10


@pytest.mark.slow  # an older home's upgrade: in the full run
def test_an_index_and_ledger_written_without_field_ids_are_rewritten_once(
    s3_store: Any, index_settings: Any
) -> None:
    """An index an older kindex wrote (plain Parquet files registered with add_files, mapped
    by name) is rebuilt by the next publish, and a ledger compacted into a file without field
    IDs is rewritten by its next append: then no manifest of any table names such a file, and
    every row is still there."""
    header, rows = liger_rows(range(2, 42))
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", csv_bytes(header, rows[:20]))])
    ledger = Ledger.of(s3_store, index_settings)
    ledger.append(ledger_entries(s3_store.bucket, 3))
    catalog = IndexCatalog.beside(s3_store, index_settings)
    # What an older kindex left: its layout, and files without field IDs in the tables.
    for name in (*STORED_TABLES, VERSIONS_TABLE, LEDGER_TABLE):
        table = catalog.table(name, refresh=True)
        rows_now = table.scan().to_arrow()
        # A partitioned table (the ledger, by arrival window) takes a file per partition.
        column = table.spec().fields[0].name if not table.spec().is_unpartitioned() else None
        parts = (
            [
                rows_now.filter(pc.equal(rows_now[column], value))
                for value in set(rows_now[column].to_pylist())
            ]
            if column
            else [rows_now]
        )
        locations = []
        for n, part in enumerate(parts):
            plain = Path(index_settings.home) / f"plain-{name}-{n}.parquet"
            pq.write_table(part.cast(part.schema.remove_metadata()), plain)
            locations.append(catalog.upload(name, plain))
        with table.transaction() as transaction:
            transaction.add_files(locations, check_duplicate_files=False)
            transaction.remove_properties("kindex.field-ids")
            if name == VERSIONS_TABLE:
                transaction.set_properties({LAYOUT_PROPERTY: "3"})
        assert sorted(files_without_field_ids(catalog.table(name, refresh=True))) == sorted(
            locations
        )
    assert catalog.outdated()

    ingest_bytes(s3_store, index_settings, [("incoming/b.csv", csv_bytes(header, rows[20:]))])
    ledger.append(ledger_entries(s3_store.bucket, 1, 3))
    catalog = IndexCatalog.beside(s3_store, index_settings)
    for name in every_table(catalog):
        assert files_without_field_ids(catalog.table(name, refresh=True)) == [], name
    assert query(index_settings, "SELECT count(*) FROM runs") == [(40,)]
    # The ledger's rows: a.csv's and the 3 from before (each twice: the copy an older kindex
    # left), then b.csv's and the new one.
    assert catalog.table(LEDGER_TABLE).scan().to_arrow().num_rows == 4 * 2 + 2
    assert len(ledger.current()) == 6


def test_kindex_connect_prints_a_program_per_engine_pinned_to_one_version(
    two_files: tuple[S3Store, Settings, TwoFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each engine's program is Python that pins the version asked for: Polars and Daft each
    table's snapshot id, ClickHouse the version's publish time and each table's metadata file.
    (They run against a real home in tests/test_engines.py, with the engines installed.)"""
    s3_store, index_settings, built = two_files
    first, newest = built.first, built.newest
    catalog = IndexCatalog.beside(s3_store, index_settings)
    metadata = catalog.metadata_locations()["run_segments"].rsplit("/", 1)[1]
    for engine in ENGINES:
        for version, extra in ((newest, []), (first, ["--as-of", str(first.version)])):
            assert main(["connect", "--engine", engine, *extra]) == 0
            program = capsys.readouterr().out
            compile(program, f"kindex connect --engine {engine}", "exec")
            assert f"index version {version.version} (seq {version.seq})" in program
            if engine == "clickhouse":
                assert version.published_at is not None
                at_ms = int(version.published_at.timestamp() * 1000)
                assert f"SET iceberg_timestamp_ms = {at_ms}" in program
                assert metadata in program
            else:
                assert f'"run_segments": {version.snapshot_ids["run_segments"]}' in program


def test_compaction_merges_the_newest_files_geometrically() -> None:
    assert plan_compaction([(1, 100)]) is None
    assert plan_compaction([(1, 1000), (2, 10), (3, 10), (4, 10)]) == 2
    assert plan_compaction([(1, 1000), (2, 30), (3, 10), (4, 10)]) == 2
    assert plan_compaction([(1, 1000), (2, 100), (3, 10)]) is None
    # Sizes merged so stay geometric: a run of equal small files becomes few files.
    files: list[tuple[int, int]] = []
    for seq in range(1, 1001):
        files.append((seq, 10))
        if len(files) > COMPACT_ABOVE_FILES:
            since = plan_compaction(files)
            if since is not None:
                kept = [f for f in files if f[0] < since]
                files = [*kept, (since, sum(size for s, size in files if s >= since))]
    assert len(files) <= 2 * COMPACT_ABOVE_FILES
    assert sum(size for _, size in files) == 10_000


@pytest.mark.slow
def test_small_files_one_by_one_stay_few_files_and_every_row(
    s3_store: Any, index_settings: Any
) -> None:
    """Files ingested one by one: each table's data files stay few, its manifests too (merged
    by compaction: a scan reads a few whatever the publishes), and the compacted index holds
    exactly what one publish of all of them holds."""
    count = 3 * COMPACT_ABOVE_FILES
    header, rows = liger_rows(range(2, 2 + 5 * count))
    files = [
        (f"incoming/f{i:03}.csv", csv_bytes(header, rows[i * 5 : i * 5 + 5])) for i in range(count)
    ]
    for key, data in files:
        ingest_bytes(s3_store, index_settings, [(key, data)])
    current = load_current(s3_store, index_settings)
    assert all(len(keys) <= 2 * COMPACT_ABOVE_FILES for keys in current.files.values())
    catalog = IndexCatalog(index_settings)
    for name in (*STORED_TABLES, VERSIONS_TABLE, LEDGER_TABLE):
        table = catalog.table(name, refresh=True)
        head = table.current_snapshot()
        assert head is None or len(head.manifests(table.io)) <= MERGE_ABOVE_MANIFESTS + 1, name
    compacted = fingerprints(index_settings)
    assert compacted["runs"].startswith(f"{5 * count}:")

    other_store = s3_store.with_bucket(s3_store.bucket + "-b")
    other_store.ensure_bucket()
    other = index_settings.replace(
        home=Path(index_settings.home).parent / "all-at-once", bucket=other_store.bucket
    )
    ingest_bytes(other_store, other, files)
    assert fingerprints(other) == compacted


@pytest.mark.slow
def test_two_hosts_publish_into_one_bucket_and_catalog_at_once(
    s3_store: Any, index_settings: Any, tmp_path: Path
) -> None:
    """Two homes share the bucket and a catalog and publish different files at the same moment,
    round after round. Every run of every file is in the index, and every version a reader saw
    along the way was whole: its runs are exactly those of the files it names."""
    shared = f"sqlite:///{tmp_path / 'shared' / 'catalog.db'}"
    hosts = [
        index_settings.replace(home=tmp_path / f"host-{n}", catalog_uri=shared) for n in (0, 1)
    ]
    header, rows = liger_rows(range(2, 2 + 2 * 20 * 4))
    rounds = 20
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def host(n: int) -> None:
        try:
            for r in range(rounds):
                start = (r * 2 + n) * 4
                barrier.wait(timeout=120)
                data = csv_bytes(header, rows[start : start + 4])
                ingest_bytes(s3_store, hosts[n], [(f"incoming/h{n}-{r:02}.csv", data)])
        except BaseException as error:  # surfaced by the test thread
            errors.append(error)
            barrier.abort()

    seen: list[tuple[int, int, int]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            con = connect_remote(hosts[0])
            try:
                row = con.execute(
                    "SELECT (SELECT count(*) FROM runs), "
                    "(SELECT coalesce(sum(runs), 0) FROM snapshots), "
                    "(SELECT count(*) FROM runs WHERE source_key IS NULL)"
                ).fetchone()
            finally:
                con.close()
            assert row is not None
            seen.append((int(row[0]), int(row[1]), int(row[2])))
            stop.wait(0.2)

    threads = [threading.Thread(target=host, args=(n,)) for n in (0, 1)]
    watcher = threading.Thread(target=reader, daemon=True)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    stop.set()
    watcher.join(timeout=60)
    assert not errors, errors
    final = connect_remote(hosts[1])
    try:
        keys = final.execute("SELECT count(DISTINCT source_key), count(*) FROM runs").fetchone()
    finally:
        final.close()
    assert keys == (2 * rounds, 2 * rounds * 4)
    assert len(seen) > 1
    assert all(runs == named and unnamed == 0 for runs, named, unnamed in seen), seen
