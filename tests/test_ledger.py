"""The file ledger against a real bucket and catalog: each version's newest row, backoff, the
choices backfills make, and a home without a ledger (kindex before it, or a ledger lost) moved
onto one by itself, with nothing processed again and the index unchanged."""

from __future__ import annotations

import os
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context
from index_support import LIGER_CSV, csv_bytes, drop_and_process, fingerprints, liger_rows, query
from index_support import index_settings as index_settings  # the fixture

from assets.reconcile import reconcile_sensor
from assets.resources import KindexResource
from pipelines.index.publish import publish_index
from pipelines.intake.ledger import (
    FIRST_BACKOFF,
    LEDGER_TABLE,
    FileEntry,
    FileState,
    Ledger,
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
    from pipelines.index.catalog import COMPACT_ABOVE_FILES

    ledger = Ledger.of(s3_store, index_settings)
    for n in range(COMPACT_ABOVE_FILES + 4):  # a data file each
        ledger.append([FileEntry.pending(s3_store.bucket, info(f"incoming/{n}.csv"))])
    snapshot = ledger.catalog.table(LEDGER_TABLE, refresh=True).current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert int(snapshot.summary["total-data-files"]) <= COMPACT_ABOVE_FILES
    assert len(ledger.current()) == COMPACT_ABOVE_FILES + 4
