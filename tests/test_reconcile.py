"""Nothing falls through unseen: the bucket-state invariant (pipelines/intake/reconcile.py), the
reconcile sensor that requests the versions the file ledger lacks (and rebuilds a missing
ledger), and the ledger sensor that requests a failing file again with backoff, on real S3 and
Dagster; and the snapshot lookup that replaced a Dagster query bounded at 10,000 records."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, RunRequest, SensorResult, build_sensor_context
from dagster_support import SensorDriver, check_evaluations, execute, materialize_index
from index_support import ingest_bytes, query
from liger_support import HEADER, csv_lines

import assets.sensors
from assets.reconcile import reconcile_sensor
from assets.resources import KindexResource
from assets.sensors import batch_of, ledger_sensor
from pipelines.ingest import process_batch
from pipelines.intake.ledger import (
    LEDGER_TABLE,
    FileEntry,
    FileState,
    Ledger,
    unprocessed_versions,
)
from pipelines.intake.reconcile import reconcile
from pipelines.intake.snapshots import content_digest, list_reads, put_by_snapshot, take_snapshot
from pipelines.settings import Settings
from pipelines.sources import current_parser_versions
from pipelines.storage.base import ObjectInfo
from pipelines.storage.s3 import S3Store

S3_KEY_LIMIT = 1024


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def long_key(length: int = 999) -> str:
    """A valid key of `length` bytes; SeaweedFS takes path segments up to 255 bytes."""
    stem = "incoming/" + ("d" * 199 + "/") * 4
    return stem + "k" * (length - len(stem) - len(".csv")) + ".csv"


def one_row_csv(extra: int = 0) -> bytes:
    (row,) = csv_lines([2212])
    return f"{HEADER}\n{row}\n".encode() + b"\n" * extra


def test_a_first_read_lost_with_its_batch_is_found_and_read_again(
    s3_store: Any, tmp_path: Path
) -> None:
    """`kindex ingest` killed between a file's upload and its batch's sets file: the snapshot is
    kept, but its first read was to be recorded by that sets file. The version shows unread,
    and a batch of it reads it again from its key, once."""
    settings = Settings.from_env()
    data = one_row_csv()
    put_by_snapshot(s3_store, settings, tmp_path / "lost.csv", data, content_digest(data))
    key = "incoming/lost.csv"
    found = reconcile(s3_store, settings, current_parser_versions())
    assert [(m.info.key, m.has_snapshot) for m in found.missing] == [(key, False)]
    assert not list_reads(s3_store, settings, key)

    entry = FileEntry.pending(s3_store.bucket, s3_store.head(key))
    [result] = process_batch(s3_store, settings, [entry], "again").files
    assert result.entry.state is FileState.INDEXED and result.entry.runs == 1
    assert reconcile(s3_store, settings, current_parser_versions()).missing_count == 0
    [read] = list_reads(s3_store, settings, key)  # its read record and its sets file: one read
    assert read.etag == entry.etag


def test_the_invariant_holds_after_processing_a_long_key_garbage_and_a_csv(
    s3_store: Any, instance: DagsterInstance
) -> None:
    key = long_key()
    assert len(key.encode()) == 999
    s3_store.put_bytes(key, one_row_csv())
    s3_store.put_bytes("incoming/short.csv", one_row_csv(1))
    s3_store.put_bytes("incoming/garbage.bin", os.urandom(2048))
    settings = Settings.from_env()

    before = reconcile(s3_store, settings, current_parser_versions())
    assert before.objects == 3 and before.missing_count == 3
    assert not any(m.has_snapshot for m in before.missing)
    take_snapshot(s3_store, settings, "incoming/short.csv")  # read, not processed yet
    halfway = {
        m.info.key: m.has_snapshot
        for m in reconcile(s3_store, settings, current_parser_versions()).missing
    }
    assert halfway == {key: False, "incoming/short.csv": True, "incoming/garbage.bin": False}

    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []
    assert execute(instance, request).success  # the long key fails no one, itself included
    index_run = materialize_index(instance)

    assert reconcile(s3_store, settings, current_parser_versions()).missing_count == 0
    assert check_evaluations(index_run)["every_version_processed"].passed
    assert all(len(o.key.encode()) <= S3_KEY_LIMIT for o in s3_store.list(""))
    assert query(settings, f"select runs from snapshots where source_key = '{key}'") == [(1,)]
    assert query(settings, "select reason from quarantine") == [("unrecognized_format",)]
    states = query(settings, "select state, count(*) from files group by state order by state")
    assert states == [("indexed", 2), ("quarantined", 1)]


def reconcile_tick(instance: DagsterInstance, cursor: str | None) -> SensorResult:
    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"kindex": KindexResource()}
    )
    result = reconcile_sensor(context)
    assert isinstance(result, SensorResult)
    return result


def ledger_tick(instance: DagsterInstance, cursor: str | None) -> SensorResult:
    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"kindex": KindexResource()}
    )
    result = ledger_sensor(context)
    assert isinstance(result, SensorResult)
    return result


def observed_missing(result: SensorResult) -> list[int]:
    return [int(str(e.metadata["missing_versions"].value)) for e in result.asset_events or []]


def batch_keys(ledger: Ledger, request: RunRequest) -> list[str]:
    return [e.key for e in ledger.of_batch(batch_of(request))]


def test_the_sensor_requests_what_fell_through_and_a_failing_file_backs_off(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [time.time()]
    monkeypatch.setattr(assets.sensors, "clock", lambda: now[0])
    ledger = Ledger.of(s3_store, Settings.from_env())
    # Neither file was ever given a run (the incoming sensor never saw them).
    s3_store.put_bytes("incoming/lost.csv", one_row_csv())
    s3_store.put_bytes("incoming/doomed.csv", one_row_csv(1))
    real = S3Store.get_object

    def doomed(store: S3Store, key: str) -> tuple[bytes, ObjectInfo]:
        if key == "incoming/doomed.csv":
            raise RuntimeError("this file fails every time")
        return real(store, key)

    monkeypatch.setattr(S3Store, "get_object", doomed)

    first = reconcile_tick(instance, None)
    (request,) = first.run_requests or []  # both files, one run
    assert sorted(batch_keys(ledger, request)) == ["incoming/doomed.csv", "incoming/lost.csv"]
    assert observed_missing(first) == [2]
    again = reconcile_tick(instance, first.cursor)
    assert not again.run_requests  # pending in the ledger now: not missing twice
    assert observed_missing(again) == [0]
    assert execute(instance, request).success  # the doomed file fails itself alone

    after = reconcile_tick(instance, again.cursor)
    assert not after.run_requests and not observed_missing(after)  # known, failed or not
    states = {e.key: e for e in ledger.current()}
    assert states["incoming/lost.csv"].state is FileState.INDEXED
    failing = states["incoming/doomed.csv"]
    assert failing.state is FileState.FAILED and failing.attempts == 1
    assert "this file fails every time" in str(failing.reason)

    # The ledger sensor requests it again once each backoff passed, each time waiting longer.
    waits = []
    cursor = None
    for attempt in (1, 2):
        assert failing.next_attempt_at is not None and failing.updated_at is not None
        waits.append(failing.next_attempt_at - failing.updated_at)
        waiting = ledger_tick(instance, cursor)
        assert not waiting.run_requests  # its backoff has not passed
        now[0] = failing.next_attempt_at.timestamp() + 1
        retried = ledger_tick(instance, waiting.cursor)
        cursor = retried.cursor
        (retry,) = retried.run_requests or []
        assert retry.run_key != request.run_key  # a new attempt, not a repeat
        assert batch_keys(ledger, retry) == ["incoming/doomed.csv"]
        if attempt == 2:
            monkeypatch.setattr(S3Store, "get_object", real)
        assert execute(instance, retry).success
        (failing,) = ledger.current("key = 'incoming/doomed.csv'")
        request = retry
    assert waits[1] > waits[0]  # exponential, jitter or not (0.8-1.2 of 30 s, then of 60 s)
    assert failing.state is FileState.INDEXED and failing.attempts == 3

    assert not observed_missing(reconcile_tick(instance, after.cursor))  # still 0
    assert not unprocessed_versions(s3_store, Settings.from_env(), ledger)[1]


def test_the_first_tick_rebuilds_a_missing_ledger_from_the_bucket(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """A home from before the ledger: what the published index holds is indexed (nothing
    re-processed), what it lacks is requested."""
    settings = Settings.from_env()
    ingest_bytes(s3_store, settings, [("incoming/done.csv", one_row_csv())])
    s3_store.put_bytes("incoming/new.csv", one_row_csv(1))
    ledger = Ledger.of(s3_store, settings)
    # Processing commits ledger rows now: the home before the ledger had none.
    ledger.catalog.catalog.drop_table((ledger.catalog.namespace, LEDGER_TABLE))
    assert not ledger.exists()

    tick = reconcile_tick(instance, None)

    (request,) = tick.run_requests or []
    assert batch_keys(ledger, request) == ["incoming/new.csv"]
    assert observed_missing(tick) == [1]
    done = {e.key: e for e in ledger.current()}["incoming/done.csv"]
    assert done.state is FileState.INDEXED and done.runs == 1
    assert execute(instance, request).success
    assert {e.state for e in ledger.current()} == {FileState.INDEXED}
    assert query(settings, "select count(*) from snapshots") == [(2,)]
