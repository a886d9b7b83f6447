"""The shared Liger CSV through records and the index: counts, seeds, re-ingest, `kindex query`."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import HomeCopy, SharedCsvHome, building_home, drop_bucket, restored_home
from index_support import (
    DATA,
    LIGER_CSV,
    csv_bytes,
    drop_and_process,
    fingerprints,
    index_settings,
    ingest_bytes,
    liger_rows,
    query,
    s3_requests,
)

from pipelines.cli import main
from pipelines.index.layout import IndexLayout
from pipelines.index.local import load_current, open_index
from pipelines.index.publish import publish_index
from pipelines.index.tables import TABLES, VIEWS
from pipelines.ingest import ingest_paths
from pipelines.records.canonical import manifest_digest
from pipelines.settings import Settings
from pipelines.storage.embedded import EmbeddedS3
from pipelines.storage.s3 import S3Store

__all__ = ["index_settings"]


def seed_records(path: Path) -> dict[str, dict[str, Any]]:
    """A seed file: a title line, then one JSON object of manifests (run, protocol, ...)."""
    text = path.read_text(encoding="utf-8")
    return json.loads(text[text.index("{") :])


@pytest.fixture
def ingested(shared_csv: SharedCsvHome) -> Any:
    """The shared CSV's ingest (built once for the session, restored for each test)."""
    return shared_csv.summary


@pytest.fixture
def shared_settings(shared_csv: SharedCsvHome) -> Settings:
    return shared_csv.settings


def test_the_shared_csv_indexes_every_row(ingested: Any, shared_settings: Settings) -> None:
    assert ingested.rows == 2448
    assert ingested.runs_by_metric == {"latency": 1649, "memory": 799}
    assert query(shared_settings, "SELECT count(*), count(DISTINCT run_digest) FROM runs") == [
        (2448, 2448)
    ]
    assert query(shared_settings, "SELECT count(*) FROM lineage") == [(2448,)]
    assert query(shared_settings, "SELECT count(*) FROM quarantine") == [(0,)]
    [(key, line)] = query(
        shared_settings, "SELECT DISTINCT source_key, min(source_line) FROM runs GROUP BY ALL"
    )
    assert (key, line) == ("incoming/all_benchmark_data.csv", 2)


def test_seed_runs_and_their_references_are_indexed(
    ingested: Any, shared_settings: Settings
) -> None:
    lines = set()
    for seed_file in sorted((DATA / "seeds").glob("*.txt")):
        seed = seed_records(seed_file)
        run = seed["run"]
        spec = run["spec"]
        rows = query(
            shared_settings,
            "SELECT implementation_digest, workload_digest, protocol_digest, environment_digest,"
            f" external_id, source_line FROM runs WHERE run_digest = '{manifest_digest(run)}'",
        )
        assert rows == [
            (
                spec["implementationDigest"],
                spec["workloadDigest"],
                spec["protocolDigest"],
                spec["environmentDigest"],
                spec["sourceNative"]["externalId"],
                rows[0][5] if rows else None,
            )
        ]
        lines.add(rows[0][5])
        for kind, table in (("protocol", "protocols"), ("environment", "environments")):
            digest = manifest_digest(seed[kind])
            assert digest == spec[f"{kind}Digest"]
            assert query(
                shared_settings, f"SELECT count(*) FROM {table} WHERE digest = '{digest}'"
            ) == [(1,)]
        for column, table in (
            ("workloadDigest", "workloads"),
            ("implementationDigest", "implementations"),
        ):
            assert query(
                shared_settings, f"SELECT count(*) FROM {table} WHERE digest = '{spec[column]}'"
            ) == [(1,)]
    assert lines == {2212, 1843}


def test_reingest_adds_nothing_and_changes_no_table(
    ingested: Any, shared_csv: SharedCsvHome
) -> None:
    shared_settings = shared_csv.settings
    before = fingerprints(shared_settings)
    assert set(before) == set(TABLES + VIEWS)
    records_before = sorted(o.key for o in shared_csv.store.list("records/"))
    again = ingest_paths([LIGER_CSV], shared_settings, progress=False, store=shared_csv.store)
    assert again.files[0].reused
    assert not again.index.published
    assert fingerprints(shared_settings) == before
    assert sorted(o.key for o in shared_csv.store.list("records/")) == records_before
    # The same bytes under another name: one more read, the same snapshot, no new record.
    copy = Path(shared_settings.home) / "copy.csv"
    copy.write_bytes(LIGER_CSV.read_bytes())
    ingest_paths([copy], shared_settings, progress=False, store=shared_csv.store)
    after = fingerprints(shared_settings)
    assert {k: v for k, v in after.items() if k != "snapshots"} == {
        k: v for k, v in before.items() if k != "snapshots"
    }
    assert query(
        shared_settings, "SELECT count(*), count(DISTINCT snapshot_digest) FROM snapshots"
    ) == [(2, 1)]


def test_views_answer_the_questions_people_ask(ingested: Any, shared_settings: Settings) -> None:
    speedups = query(
        shared_settings,
        "SELECT provider, baseline_provider, speedup FROM speedups "
        "WHERE kernel = 'jsd' AND gpu = 'NVIDIA B200' AND provider = 'liger'",
    )
    assert speedups and all(b != "liger" and s > 0 for _, b, s in speedups)
    # A regression needs the spread to separate: new p20 above old p80.
    assert query(
        shared_settings,
        "SELECT count(*) FROM version_changes WHERE regressed AND NOT (new_p20 > old_p80)",
    ) == [(0,)]
    assert query(
        shared_settings, "SELECT count(*) FROM latest_runs WHERE superseded_by IS NOT NULL"
    ) == [(0,)]
    assert query(shared_settings, "SELECT count(*), sum(runs) FROM cohorts") == query(
        shared_settings,
        "SELECT count(DISTINCT (operation_digest, workload_digest, protocol_digest,"
        " environment_digest, metric)), count(*) FROM runs",
    )


def test_cohorts_do_not_depend_on_the_order_runs_are_scanned(
    ingested: Any, shared_settings: Settings
) -> None:
    """Some cohorts hold runs of several kernels (benchmarks sharing one OperationSpec): the
    cohort names the same one whichever order the files list the runs in (one publish of many
    files, or many publishes, lay them out differently)."""
    con = open_index(shared_settings)
    try:
        assert con.execute(
            "SELECT count(*) FROM (SELECT cohort_id FROM runs JOIN cohorts USING "
            "(operation_digest, workload_digest, protocol_digest, environment_digest, metric) "
            "GROUP BY cohort_id HAVING count(DISTINCT runs.kernel) > 1)"
        ).fetchone() != (0,), "no cohort of several kernels: the test shows nothing"
        definition = con.execute(
            "SELECT sql FROM duckdb_views() WHERE view_name = 'cohorts'"
        ).fetchone()
        assert definition is not None
        con.execute("SET threads = 1")  # a scan in the table's order
        answers = []
        for order in ("run_digest", "run_digest DESC"):
            con.execute(f"CREATE OR REPLACE TEMP TABLE ordered AS FROM runs ORDER BY {order}")
            select = definition[0].split(" AS ", 1)[1].replace("FROM runs", "FROM ordered")
            answers.append(con.execute(f"{select.rstrip(';')} ORDER BY cohort_id").fetchall())
    finally:
        con.close()
    assert answers[0] == answers[1]


def test_query_command_prints_json_and_rejects_bad_sql(
    ingested: Any, shared_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "query",
                "SELECT metric, count(*) AS n FROM runs GROUP BY 1 ORDER BY 1",
                "--format",
                "json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out) == [
        {"metric": "latency", "n": 1649},
        {"metric": "memory", "n": 799},
    ]
    assert main(["query", "SELECT count(*) AS n FROM runs", "--format", "csv"]) == 0
    assert capsys.readouterr().out == "n\n2448\n"
    assert main(["query", "SELEC nonsense FROM runs"]) == 1
    assert "Parser Error" in capsys.readouterr().err
    assert main(["query", "DELETE FROM snapshots"]) == 1  # read-only
    capsys.readouterr()


def stored_rows(store: Any, settings: Any, table: str) -> int:
    keys = load_current(store, settings).files[table]
    return sum(pq.read_metadata(io.BytesIO(store.get_bytes(key))).num_rows for key in keys)


@dataclass(frozen=True, slots=True)
class TwoFiles:
    """first.csv (200 rows of the shared CSV) then second.csv (those and 100 more) ingested,
    with what the index held between the two."""

    saved: HomeCopy
    first_segments: list[str]
    first_lineage_files_rows: int
    first_lineage: list[tuple[Any, ...]]


@pytest.fixture(scope="module")
def built_two_files(
    embedded_s3: EmbeddedS3, s3_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TwoFiles]:
    """The two files ingested once for the module (two tests read them)."""
    folder = tmp_path_factory.mktemp("two-files")
    header, rows = liger_rows(range(2, 302))
    with building_home(embedded_s3, s3_client, folder) as (store, settings):
        ingest_bytes(store, settings, [("incoming/first.csv", csv_bytes(header, rows[:200]))])
        first_segments = load_current(store, settings).files["run_segments"]
        first_lineage_files_rows = stored_rows(store, settings, "lineage_files")
        first_lineage = query(settings, "SELECT count(*) FROM lineage")
        ingest_bytes(store, settings, [("incoming/second.csv", csv_bytes(header, rows))])
        saved = HomeCopy.saved(s3_client, store.bucket, folder / "home", folder)
    yield TwoFiles(saved, first_segments, first_lineage_files_rows, first_lineage)
    drop_bucket(s3_client, saved.bucket)


@pytest.fixture
def two_files(
    built_two_files: TwoFiles,
    embedded_s3: EmbeddedS3,
    s3_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[S3Store, Settings, TwoFiles]:
    """The two files' home as it was built (the environment points at it)."""
    store, settings = restored_home(built_two_files.saved, embedded_s3, s3_client, monkeypatch)
    return store, settings, built_two_files


def test_a_second_file_adds_only_its_new_runs(
    two_files: tuple[S3Store, Settings, TwoFiles],
) -> None:
    """A second file holding a first file's runs and more: only its new runs are written, to a
    data file in the table's folder of the warehouse, with where each was first seen and its
    state; the first file's rows stay where they are (none of their state changed). Each
    record's source_key is where it was first seen."""
    s3_store, index_settings, built = two_files
    layout = IndexLayout.of(index_settings)
    first = built.first_segments
    segments = load_current(s3_store, index_settings).files["run_segments"]
    tables = f"{layout.index_prefix}{s3_store.bucket}/run_segments/data/"
    assert segments and all(s.startswith(tables) for s in segments), segments
    rows_in = {s: pq.read_table(io.BytesIO(s3_store.get_bytes(s))).num_rows for s in segments}
    assert set(first) <= set(segments)
    assert sum(rows_in[s] for s in first) == 200
    assert sum(rows_in[s] for s in segments if s not in first) == 100
    assert query(
        index_settings,
        "SELECT source_key, count(*), min(source_line), max(source_line) FROM runs "
        "GROUP BY source_key ORDER BY source_key",
    ) == [("incoming/first.csv", 200, 2, 201), ("incoming/second.csv", 100, 202, 301)]
    sources = query(index_settings, "SELECT DISTINCT source_key FROM workloads ORDER BY 1")
    assert sources == [("incoming/first.csv",), ("incoming/second.csv",)]


def test_lineage_files_hold_only_the_lineage_rows_that_runs_do_not(
    two_files: tuple[S3Store, Settings, TwoFiles],
) -> None:
    """A run's own row is its first lineage row: a file whose runs are all new stores no lineage
    of its own, and a file that repeats runs stores the rows of those. The lineage view holds
    every (file, line, run) all the same."""
    s3_store, index_settings, built = two_files
    assert built.first_lineage_files_rows == 0  # after first.csv alone
    assert built.first_lineage == [(200,)]
    assert stored_rows(s3_store, index_settings, "lineage_files") == 200
    assert query(
        index_settings,
        "SELECT source_key, count(*), count(DISTINCT run_digest), min(source_line), "
        "max(source_line) FROM lineage GROUP BY ALL ORDER BY 1",
    ) == [("incoming/first.csv", 200, 200, 2, 201), ("incoming/second.csv", 300, 300, 2, 301)]
    # Both files' lines give the same runs, line for line.
    assert query(
        index_settings,
        "SELECT count(*) FROM lineage a JOIN lineage b USING (source_line, run_digest) "
        "WHERE a.source_key = 'incoming/first.csv' AND b.source_key = 'incoming/second.csv'",
    ) == [(200,)]


def test_an_index_of_another_layout_is_rebuilt_and_not_read_before(
    s3_store: Any, index_settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """An index written in another layout (an older kindex stored every lineage row) would be
    read wrong by this one: readers refuse it in one line, and the next publish rebuilds it from
    the record sets."""
    from pipelines.index.catalog import LAYOUT, LAYOUT_PROPERTY, VERSIONS_TABLE, IndexCatalog
    from pipelines.index.publish import unpublished_record_sets

    header, rows = liger_rows(range(2, 102))
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", csv_bytes(header, rows[:60]))])
    catalog = IndexCatalog.beside(s3_store, index_settings)
    versions = catalog.table(VERSIONS_TABLE)
    with versions.transaction() as older:
        older.remove_properties(LAYOUT_PROPERTY)
    assert main(["query", "SELECT count(*) FROM lineage", "--sync"]) == 1
    assert "another version of kindex" in capsys.readouterr().err
    assert len(unpublished_record_sets(s3_store, index_settings)) == 1
    ingest_bytes(s3_store, index_settings, [("incoming/b.csv", csv_bytes(header, rows[40:]))])
    current = load_current(s3_store, index_settings)
    assert current.version.seq == 1 and current.version.parent is None
    assert catalog.table(VERSIONS_TABLE, refresh=True).properties[LAYOUT_PROPERTY] == LAYOUT
    assert query(index_settings, "SELECT count(*), count(DISTINCT source_key) FROM runs") == [
        (100, 2)
    ]
    assert query(index_settings, "SELECT count(*) FROM lineage") == [(120,)]


def test_an_index_whose_catalog_is_lost_is_rebuilt_from_the_record_sets(
    s3_store: Any, index_settings: Any
) -> None:
    """The record sets in the bucket are the truth: a home whose catalog is gone (or an index of
    the manifest format that came before Iceberg) gets every record set back at the next
    publish."""
    header, rows = liger_rows(range(2, 102))
    ingest_bytes(s3_store, index_settings, [("incoming/a.csv", csv_bytes(header, rows[:50]))])
    (Path(index_settings.home) / "catalog.db").unlink()
    ingest_bytes(s3_store, index_settings, [("incoming/b.csv", csv_bytes(header, rows[50:]))])
    current = load_current(s3_store, index_settings)
    assert current.version.seq == 1 and current.version.parent is None
    assert query(index_settings, "SELECT count(*), count(DISTINCT source_key) FROM runs") == [
        (100, 2)
    ]


def test_a_publish_reads_what_its_home_wrote_from_its_cache(
    s3_store: Any, index_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sets files and record objects a home wrote are read back from its cache, not the bucket;
    another home (another host) fetches them from the bucket and builds the same index."""
    header, rows = liger_rows(range(2, 62))
    for name, part in [("a", rows[:20]), ("b", rows[20:40]), ("c", rows[40:])]:
        drop_and_process(s3_store, index_settings, f"incoming/{name}.csv", csv_bytes(header, part))
    sent = s3_requests(monkeypatch)

    publish_index(s3_store, index_settings)

    record_objects = [k for a, k in sent if a == "get" and k.startswith("records/")]
    assert record_objects == []
    monkeypatch.setenv("KINDEX_HOME", str(tmp_path / "other-host"))
    other = Settings.from_env()
    sent.clear()

    publish_index(s3_store, other)

    fetched = sorted(k for a, k in sent if a == "get" and k.startswith("records/"))
    sets_files = [k for k in fetched if k.endswith("/sets.json")]
    assert len(sets_files) == 3  # each file's summary and read are in its batch's sets file
    assert not [k for k in fetched if k.endswith("/summary.json") or "/reads/" in k]
    assert fingerprints(other) == fingerprints(index_settings)


def test_a_file_whose_records_fail_still_lands(
    s3_store: Any, index_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When building a file's records fails, the file is in the bucket all the same, the error
    is the normalizer's, named with the file, and the other files of the ingest are indexed."""
    import pipelines.sources
    from pipelines.intake.incoming import incoming_key
    from pipelines.intake.ledger import FileState

    header, rows = liger_rows(range(2, 12))
    path = tmp_path / "breaks.csv"
    path.write_bytes(csv_bytes(header, rows))
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x00not a format\xff" * 8)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the normalizer broke")

    monkeypatch.setattr(pipelines.sources, "record_sets", broken)  # the Liger source's
    summary = ingest_paths([path, other], index_settings, progress=False, store=s3_store)
    assert [(f.key, f.state) for f in summary.failed] == [("incoming/breaks.csv", FileState.FAILED)]
    assert "the normalizer broke" in str(summary.failed[0].reason)
    assert [f.source_key for f in summary.files] == ["incoming/other.bin"]
    assert s3_store.get_bytes(incoming_key(index_settings, path)) == path.read_bytes()


def test_a_record_set_in_milliseconds_is_written_again_not_added_as_it_is(
    s3_store: Any, index_settings: Any
) -> None:
    """A record set an older kindex wrote holds millisecond timestamps, which Iceberg would read
    as microseconds (1000x off): its runs are written again, in the table's unit, not added as
    they are."""
    header, rows = liger_rows(range(2, 52))
    data = csv_bytes(header, rows)
    records = drop_and_process(s3_store, index_settings, "incoming/older.csv", data)
    layout = IndexLayout.of(index_settings)
    observed = []
    for key in records.record_set.file_keys("runs"):
        runs = pq.read_table(io.BytesIO(s3_store.get_bytes(key)))
        at = runs.schema.get_field_index("observed_at")
        observed += runs.column(at).to_pylist()
        older = runs.set_column(
            at, "observed_at", runs.column(at).cast(pa.timestamp("ms", tz="UTC"))
        )
        buffer = io.BytesIO()
        pq.write_table(older, buffer)
        s3_store.put_bytes(key, buffer.getvalue())
        layout.cached_path(key).unlink()
    publish_index(s3_store, index_settings)
    segments = load_current(s3_store, index_settings).files["run_segments"]
    tables = f"{layout.index_prefix}{s3_store.bucket}/run_segments/data/"
    assert segments and all(s.startswith(tables) for s in segments), segments
    assert query(index_settings, "SELECT min(observed_at), max(observed_at) FROM runs") == [
        (min(observed), max(observed))
    ]
