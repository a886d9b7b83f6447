"""The file ledger against a real bucket and catalog: each version's newest row, backoff, the
choices backfills make, and a home without a ledger (kindex before it, or a ledger lost) moved
onto one by itself, with nothing processed again and the index unchanged."""

from __future__ import annotations

import os
import random
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context
from index_support import LIGER_CSV, csv_bytes, drop_and_process, fingerprints, liger_rows, query
from index_support import index_settings as index_settings  # the fixture

from assets.reconcile import reconcile_sensor
from assets.resources import KindexResource
from pipelines.index.catalog import MANIFEST_MERGE_PROPERTIES, TABLE_PROPERTIES
from pipelines.index.publish import publish_index
from pipelines.intake.ledger import (
    FIRST_BACKOFF,
    LEDGER_COMPACTION,
    LEDGER_SCHEMA,
    LEDGER_TABLE,
    RECENT,
    FileEntry,
    FileState,
    Ledger,
    open_filter,
    seen_filter,
    select_filter,
    version_of,
    window_of,
    window_start,
)
from pipelines.storage.base import ObjectInfo

AT = datetime(2026, 12, 1, 12, 30, 15, tzinfo=UTC)


def info(key: str, etag: str = "e" * 32, at: datetime = AT) -> ObjectInfo:
    return ObjectInfo(key, etag, 10, at)


def test_a_window_is_the_hour_of_arrival() -> None:
    assert window_of(AT) == "2026-12-01-12:00"
    assert window_start("2026-12-01-12:00") == AT.replace(minute=0, second=0)
    later = AT + timedelta(minutes=40)
    assert window_of(later) == "2026-12-01-13:00"


def test_backoff_grows_with_attempts_and_has_jitter() -> None:
    entry = FileEntry.pending("b", info("incoming/a.csv"))
    rng = random.Random(7)
    waits = []
    for _ in range(4):
        entry = entry.failed("boom", AT, rng)
        assert entry.next_attempt_at is not None and entry.updated_at == AT  # from the failure
        waits.append(entry.next_attempt_at - AT)
    assert [entry.attempts, entry.state, entry.reason] == [4, FileState.FAILED, "boom"]
    assert FIRST_BACKOFF * 0.8 <= waits[0] <= FIRST_BACKOFF * 1.2
    assert all(later > earlier for earlier, later in zip(waits, waits[1:], strict=False))


def test_each_version_shows_its_newest_row(s3_store: Any, index_settings: Any) -> None:
    ledger = Ledger.of(s3_store, index_settings)
    a, b = info("incoming/a.csv"), info("incoming/b.csv", "f" * 32)
    again = info("incoming/a.csv", at=AT + timedelta(seconds=5))  # A uploaded again: a version
    ledger.append([FileEntry.pending(s3_store.bucket, x, "b1") for x in (a, b)])
    first = ledger.of_batch("b1")
    ledger.append([replace(first[0], state=FileState.INDEXED, runs=3, attempts=1)])
    ledger.append([first[1].failed("S3 went away", datetime.now(UTC))])
    ledger.append([FileEntry.pending(s3_store.bucket, again, "b2")])

    current = {(e.key, e.last_modified): e for e in ledger.current()}
    assert current["incoming/a.csv", AT].state is FileState.INDEXED
    assert current["incoming/a.csv", AT].runs == 3
    assert current["incoming/b.csv", AT].state is FileState.FAILED
    assert current["incoming/a.csv", again.last_modified].state is FileState.PENDING
    # Due: the failed one once its backoff passed; the pending one once stale.
    soon = datetime.now(UTC) + timedelta(hours=7)
    due = ledger.due(soon, stale_before=soon)
    assert {(e.key, e.state) for e in due} == {
        ("incoming/b.csv", FileState.FAILED),
        ("incoming/a.csv", FileState.PENDING),
    }
    assert ledger.due(datetime.now(UTC) - timedelta(hours=1), AT - timedelta(days=1)) == []
    # Backfills choose a key's newest version, by glob, by quarantine, by window.
    assert [e.last_modified for e in ledger.select(patterns=["incoming/a*"])] == [
        again.last_modified
    ]
    assert ledger.select(quarantined=True) == []
    assert {e.key for e in ledger.select(windows=(window_of(AT), window_of(AT)))} == {
        "incoming/a.csv",
        "incoming/b.csv",
    }


@pytest.mark.slow  # an older home's upgrade: in the full run
def test_a_home_without_a_ledger_moves_onto_one_by_itself(
    s3_store: Any, index_settings: Any
) -> None:
    """A home indexed before the ledger (per-file partitions): the reconcile sensor's first
    tick rebuilds the ledger from the bucket, requests nothing that was processed, and the
    index stays as it was; a file dropped since, never processed, gets a run."""
    header, rows = liger_rows(range(2, 12))
    drop_and_process(s3_store, index_settings, "incoming/liger.csv", LIGER_CSV.read_bytes())
    drop_and_process(s3_store, index_settings, "incoming/small.csv", csv_bytes(header, rows))
    drop_and_process(s3_store, index_settings, "incoming/junk.bin", os.urandom(512))
    ledger = Ledger.of(s3_store, index_settings)
    # Processing commits ledger rows now: the home before the ledger had none.
    ledger.catalog.catalog.drop_table((ledger.catalog.namespace, LEDGER_TABLE))
    publish_index(s3_store, index_settings)
    before = fingerprints(index_settings)
    s3_store.put_bytes("incoming/late.csv", csv_bytes(header, rows[:3]))  # never processed
    assert not ledger.exists()

    with DagsterInstance.ephemeral() as instance:
        context = build_sensor_context(instance=instance, resources={"kindex": KindexResource()})
        result = reconcile_sensor(context)

    assert isinstance(result, SensorResult)
    states = {e.key: e for e in ledger.current()}
    assert states["incoming/liger.csv"].state is FileState.INDEXED
    assert states["incoming/liger.csv"].runs == 2448
    assert states["incoming/small.csv"].state is FileState.INDEXED
    assert states["incoming/junk.bin"].state is FileState.QUARANTINED
    assert states["incoming/late.csv"].state is FileState.PENDING
    requests = result.run_requests or []
    assert len(requests) == 1 and requests[0].tags["kindex/files"] == "1"
    publish_index(s3_store, index_settings)
    assert fingerprints(index_settings) == before
    assert query(index_settings, "select state, count(*) from files group by 1 order by 1") == [
        ("indexed", 2),
        ("pending", 1),
        ("quarantined", 1),
    ]


def test_a_lost_ledger_is_rebuilt_from_the_bucket(s3_store: Any, index_settings: Any) -> None:
    header, rows = liger_rows(range(2, 8))
    drop_and_process(s3_store, index_settings, "incoming/a.csv", csv_bytes(header, rows))
    publish_index(s3_store, index_settings)
    ledger = Ledger.of(s3_store, index_settings)
    with DagsterInstance.ephemeral() as instance:
        context = build_sensor_context(instance=instance, resources={"kindex": KindexResource()})
        reconcile_sensor(context)
        kept = [(e.key, e.state, e.runs) for e in ledger.current()]
        ledger.catalog.catalog.drop_table((ledger.catalog.namespace, LEDGER_TABLE))
        assert not ledger.exists()
        reconcile_sensor(
            build_sensor_context(instance=instance, resources={"kindex": KindexResource()})
        )
    assert (
        [(e.key, e.state, e.runs) for e in ledger.current()]
        == kept
        == [("incoming/a.csv", FileState.INDEXED, 6)]
    )


@pytest.mark.parametrize("state", [FileState.INDEXED])
def test_the_files_view_is_in_a_bare_duckdb_too(
    s3_store: Any, index_settings: Any, state: FileState
) -> None:
    from pipelines.index.remote import connect_remote

    ledger = Ledger.of(s3_store, index_settings)
    ledger.append(
        [replace(FileEntry.pending(s3_store.bucket, info("incoming/x.csv")), state=state)]
    )
    publish_index(s3_store, index_settings)
    con = connect_remote(index_settings)
    try:
        assert con.execute("select key, state from files").fetchall() == [
            ("incoming/x.csv", "indexed")
        ]
    finally:
        con.close()


def test_appends_are_compacted_and_every_row_stays(s3_store: Any, index_settings: Any) -> None:

    ledger = Ledger.of(s3_store, index_settings)
    for n in range(LEDGER_COMPACTION.above_files + 4):  # a data file each
        ledger.append([FileEntry.pending(s3_store.bucket, info(f"incoming/{n}.csv"))])
    snapshot = ledger.catalog.table(LEDGER_TABLE, refresh=True).current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert int(snapshot.summary["total-data-files"]) <= LEDGER_COMPACTION.above_files
    assert len(ledger.current()) == LEDGER_COMPACTION.above_files + 4


def test_the_ledger_keeps_one_manifest_whatever_its_commits(
    s3_store: Any, index_settings: Any
) -> None:
    """Each append merges the manifests (a scan reads one manifest list and one or two
    manifests, not one per commit since the table began); the rows each commit added stay
    told apart (what a publish reads since its point)."""
    from pipelines.index.committed import committed_since

    ledger = Ledger.of(s3_store, index_settings)
    now = datetime.now(UTC).replace(microsecond=0)
    for n in range(12):  # three windows, a commit each
        at = now - timedelta(hours=n % 3)
        entry = FileEntry.pending(s3_store.bucket, info(f"incoming/{n}.csv", at=at))
        ledger.append([replace(entry, sets_file=f"records/batches/b{n:02d}/sets")])
        if n == 5:
            point = ledger.head()
    table = ledger.catalog.table(LEDGER_TABLE, refresh=True)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert len(snapshot.manifests(table.io)) <= 2  # merged (a compaction's own, besides)
    assert len(ledger.current()) == 12
    since = committed_since(ledger.catalog, point)
    assert since.point == ledger.head() and not since.whole
    assert since.sets_files == [f"records/batches/b{n:02d}/sets" for n in range(6, 12)]


def test_a_tables_manifests_are_merged_into_one_keeping_every_row(
    s3_store: Any, index_settings: Any
) -> None:
    """A table appended fast (a manifest per commit, as the index's tables are, or as a ledger
    of an older kindex was) gets one manifest from `merge_manifests` past
    MERGE_ABOVE_MANIFESTS, its rows and its head's version summary kept."""
    from pipelines.index.catalog import MERGE_ABOVE_MANIFESTS

    catalog = Ledger.of(s3_store, index_settings).catalog
    catalog.catalog.create_namespace_if_not_exists(catalog.namespace)
    older = {k: v for k, v in TABLE_PROPERTIES.items() if k not in MANIFEST_MERGE_PROPERTIES}
    table = catalog.catalog.create_table(
        (catalog.namespace, LEDGER_TABLE), schema=LEDGER_SCHEMA, properties=older
    )
    entries = [FileEntry.pending(s3_store.bucket, info(f"incoming/{n}.csv")) for n in range(6)]
    for n, entry in enumerate(entries):
        row = {**asdict(entry), "state": str(entry.state), "arrival_window": "w", "updated_at": AT}
        table.append(
            pa.Table.from_pylist([row], schema=LEDGER_SCHEMA),
            snapshot_properties={"kindex.mark": str(n)},
        )
        catalog.table(LEDGER_TABLE, refresh=True)  # what a writer of the table holds
        if n + 1 <= MERGE_ABOVE_MANIFESTS:
            assert not catalog.merge_manifests(LEDGER_TABLE)
    assert catalog.merge_manifests(LEDGER_TABLE)
    table = catalog.table(LEDGER_TABLE, refresh=True)
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    assert len(head.manifests(table.io)) == 1
    assert head.summary["kindex.mark"] == "5"
    assert {k: table.properties.get(k) for k in MANIFEST_MERGE_PROPERTIES} == (
        MANIFEST_MERGE_PROPERTIES
    )
    assert sorted(table.scan().to_arrow().column("key").to_pylist()) == sorted(
        e.key for e in entries
    )


# -- partitions: what a tick and the ledger sensor read ------------------------------------------


def test_a_ticks_question_reads_only_the_partitions_of_what_it_found(
    s3_store: Any, index_settings: Any
) -> None:
    """A ledger of 12 windows over 12 days, each in commits of its own: a tick asking about
    versions of this hour plans the files of this hour's partition only, and still knows an old
    version when asked about it; an old key uploaded again is a new version."""
    ledger = Ledger.of(s3_store, index_settings)
    now = datetime.now(UTC).replace(microsecond=0)
    for day in range(12, 0, -1):
        at = now - timedelta(days=day)
        ledger.append([FileEntry.pending(s3_store.bucket, info(f"incoming/{day}.csv", at=at))])
        [entry] = ledger.known_versions([f"incoming/{day}.csv"]).values()
        ledger.append([replace(entry, state=FileState.INDEXED, attempts=1)])
    fresh = info("incoming/new.csv", at=now)
    ledger.append([FileEntry.pending(s3_store.bucket, fresh, "b-fresh")])
    assert ledger.planned_files() >= 13  # a file per window, at least
    # A batch run reads its window's partition only.
    assert [e.key for e in ledger.of_batch("b-fresh", window_of(now))] == ["incoming/new.csv"]
    assert ledger.of_batch("b-fresh", window_of(now)) == ledger.of_batch("b-fresh")
    # A backfill of a window (the UI's, `kindex backfill --window`) reads its partition only;
    # a glob's literal prefix skips the files whose keys cannot match; a choice that names no
    # window (quarantined) still reads every partition.
    five = window_of(now - timedelta(days=5))
    assert ledger.planned_files(select_filter(windows=[five])) <= 2  # its two appends
    assert [e.key for e in ledger.select(windows=[five])] == ["incoming/5.csv"]
    assert ledger.select(windows=[five], patterns=["incoming/6*"]) == []
    everything = ledger.planned_files()
    assert ledger.planned_files(select_filter(["incoming/1*"])) < everything
    assert {e.key for e in ledger.select(patterns=["incoming/1*"])} == {
        f"incoming/{n}.csv" for n in (1, 10, 11, 12)
    }
    assert ledger.planned_files(select_filter(["incoming/*.csv", "*1*"])) == everything
    assert ledger.planned_files(select_filter([], None)) == everything

    asked = [fresh, info("incoming/other.csv", at=now)]
    assert ledger.planned_files(seen_filter(version_of(v) for v in asked)) == 1
    assert set(ledger.seen(asked)) == {version_of(fresh)}
    old = info("incoming/5.csv", at=now - timedelta(days=5))
    assert ledger.seen([old])[version_of(old)].state is FileState.INDEXED
    again = info("incoming/5.csv", "a" * 32, at=now)  # the old key, uploaded again
    assert ledger.seen([again]) == {}
    assert ledger.planned_files(seen_filter([version_of(again)])) <= 1  # its key: none


def test_a_version_open_for_long_is_still_due_and_done_ones_are_no_longer_read(
    s3_store: Any, index_settings: Any
) -> None:
    """A file failing for 10 days (its backoff passed now) lies in a partition older than any
    recent window: `due` finds it, reading from its window on. Once it is done, the ledger
    sensor's reads start at two days ago, however long the history behind."""
    ledger = Ledger.of(s3_store, index_settings)
    now = datetime.now(UTC).replace(microsecond=0)
    old = FileEntry.pending(
        s3_store.bucket, info("incoming/stuck.csv", at=now - timedelta(days=10))
    )
    ledger.append([old.failed("S3 went away", now - timedelta(hours=7))])
    for day in range(9, 0, -1):  # done files in the windows between
        at = now - timedelta(days=day)
        done = FileEntry.pending(s3_store.bucket, info(f"incoming/{day}.csv", at=at))
        ledger.append([replace(done, state=FileState.INDEXED, attempts=1)])
    assert ledger.open_since() == window_of(old.last_modified)

    [due] = ledger.due(now, stale_before=now - timedelta(minutes=5))
    assert (due.key, due.state, due.attempts) == ("incoming/stuck.csv", FileState.FAILED, 1)
    assert ledger.waiting()
    ledger.append([replace(due, state=FileState.INDEXED, attempts=2, updated_at=None)])
    assert ledger.open_since() == window_of(old.last_modified)  # raised by the next look only
    assert ledger.due(now, stale_before=now) == []
    assert not ledger.waiting()
    floor = window_of(datetime.now(UTC) - 2 * RECENT)
    assert ledger.open_since() == floor
    assert ledger.planned_files(open_filter(floor)) <= 3  # of 10 windows with files
    assert ledger.planned_files() >= 10


def test_an_unpartitioned_ledger_is_migrated_once(s3_store: Any, index_settings: Any) -> None:
    """A ledger an older kindex wrote (one unpartitioned table): the next append rewrites its
    rows into partitions in one commit, records its oldest open version's window, and keeps
    every row; a second look changes nothing."""
    ledger = Ledger.of(s3_store, index_settings)
    catalog = ledger.catalog
    catalog.catalog.create_namespace_if_not_exists(catalog.namespace)
    older = {k: v for k, v in TABLE_PROPERTIES.items() if k not in MANIFEST_MERGE_PROPERTIES}
    table = catalog.catalog.create_table(
        (catalog.namespace, LEDGER_TABLE), schema=LEDGER_SCHEMA, properties=older
    )
    now = datetime.now(UTC).replace(microsecond=0)
    stuck = FileEntry.pending(
        s3_store.bucket, info("incoming/stuck.csv", at=now - timedelta(days=6))
    )
    rows = [
        {**asdict(e), "state": str(e.state), "arrival_window": e.arrival_window, "updated_at": now}
        for e in [
            replace(stuck, state=FileState.FAILED, attempts=2, next_attempt_at=now),
            FileEntry.pending(s3_store.bucket, info("incoming/a.csv", at=now - timedelta(days=3))),
            FileEntry.pending(s3_store.bucket, info("incoming/b.csv", at=now)),
        ]
    ]
    for row in rows:  # three commits of the old layout
        table.append(pa.Table.from_pylist([row], schema=LEDGER_SCHEMA))
    assert table.spec().is_unpartitioned()

    ledger.append([FileEntry.pending(s3_store.bucket, info("incoming/c.csv", at=now))])
    migrated = catalog.table(LEDGER_TABLE, refresh=True)
    assert not migrated.spec().is_unpartitioned()
    # Its appends merge their manifests from now on.
    assert {
        k: migrated.properties.get(k) for k in MANIFEST_MERGE_PROPERTIES
    } == MANIFEST_MERGE_PROPERTIES
    assert [f.name for f in migrated.spec().fields] == ["arrival_window"]
    assert {e.key for e in ledger.current()} == {
        "incoming/stuck.csv",
        "incoming/a.csv",
        "incoming/b.csv",
        "incoming/c.csv",
    }
    assert ledger.open_since() == window_of(stuck.last_modified)
    assert [e.key for e in ledger.due(now, stale_before=now - timedelta(days=1))] == [
        "incoming/stuck.csv"
    ]
    snapshots = len(migrated.snapshots())
    assert not ledger.migrate()
    assert len(catalog.table(LEDGER_TABLE, refresh=True).snapshots()) == snapshots


def test_the_ledgers_snapshots_are_expired_and_its_files_compacted_per_partition(
    s3_store: Any, index_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.intake import ledger as ledger_module

    monkeypatch.setattr(ledger_module, "EXPIRE_ABOVE_SNAPSHOTS", 6)
    monkeypatch.setattr(ledger_module, "EXPIRE_EVERY_COMMITS", 1)
    monkeypatch.setattr(ledger_module, "KEEP_NEWEST_SNAPSHOTS", 2)
    ledger = Ledger.of(s3_store, index_settings)
    now = datetime.now(UTC).replace(microsecond=0)
    earlier = now - timedelta(hours=3)
    for n in range(LEDGER_COMPACTION.above_files + 3):  # two windows, a file each per append
        ledger.append(
            [
                FileEntry.pending(s3_store.bucket, info(f"incoming/{n}.csv", at=now)),
                FileEntry.pending(s3_store.bucket, info(f"incoming/e{n}.csv", at=earlier)),
            ]
        )
    table = ledger.catalog.table(LEDGER_TABLE, refresh=True)
    windows = [f.file.partition[0] for f in table.scan().plan_files()]
    assert set(windows) == {window_of(now), window_of(earlier)}
    assert all(windows.count(w) <= LEDGER_COMPACTION.above_files for w in set(windows))
    assert len(table.snapshots()) <= 6 + 2  # expired past the bound (no index: none pinned)
    assert len(ledger.current()) == 2 * (LEDGER_COMPACTION.above_files + 3)
