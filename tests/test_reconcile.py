"""Nothing falls through unseen: the bucket-state invariant (pipelines/intake/reconcile.py), the
reconcile sensor that requests the versions the file ledger lacks (and rebuilds a missing
ledger), and the ledger sensor that requests a failing file again with backoff, on real S3 and
Dagster; and the snapshot lookup that replaced a Dagster query bounded at 10,000 records."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from dagster import DagsterInstance, RunRequest, SensorResult, build_sensor_context
from dagster_support import SensorDriver, check_evaluations, execute, materialize_index
from index_support import ingest_bytes, query
from liger_support import HEADER, csv_lines

import assets.sensors
import pipelines.commands.reconcile as reconcile_command
from assets.published import missing_versions_check
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
from pipelines.intake.notifications import ChangePage, ObjectChange
from pipelines.intake.reconcile import FEED_OVERLAP, ReconcileCursor, changed_versions, reconcile
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
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
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
    asked: list[str | None] = []
    of_batch = Ledger.of_batch

    def spied(ledger: Ledger, batch: str, window: str | None = None) -> list[FileEntry]:
        asked.append(window)
        return of_batch(ledger, batch, window)

    monkeypatch.setattr(Ledger, "of_batch", spied)
    assert execute(instance, request).success  # the long key fails no one, itself included
    assert asked == [request.partition_key]  # the run reads its window's partition only
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


# -- a reconcile tick costs what changed ----------------------------------------------------------


class CountedLists:
    """S3Store.list, counted: the prefixes listed and the keys each listing yielded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        original = S3Store.list

        def counted(store: S3Store, prefix: str, start_after: str | None = None) -> Any:
            self.calls.append((prefix, 0))
            index = len(self.calls) - 1
            for info in original(store, prefix, start_after):
                self.calls[index] = (prefix, self.calls[index][1] + 1)
                yield info

        monkeypatch.setattr(S3Store, "list", counted)

    def of(self, prefix: str) -> list[int]:
        return [n for p, n in self.calls if p == prefix]


def reconcile_ticks(
    instance: DagsterInstance, cursor: str | None = None
) -> tuple[SensorResult, str | None]:
    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"kindex": KindexResource()}
    )
    result = reconcile_sensor(context)
    assert isinstance(result, SensorResult)
    return result, result.cursor


def files_requested(result: SensorResult) -> int:
    return sum(int(r.tags["kindex/files"]) for r in result.run_requests or [])


def test_without_inventory_or_filer_a_tick_lists_one_window_of_keys(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where nothing tells what changed, each tick lists the next WALK_KEYS keys (one request),
    wrapping around: a lost file is found within a pass, and no tick lists the bucket."""
    import pipelines.intake.reconcile as reconcile_module

    monkeypatch.setattr(reconcile_module, "WALK_KEYS", 10)
    settings = Settings.from_env()
    Ledger.of(s3_store, settings).create()
    for n in range(25):
        s3_store.put_bytes(f"incoming/f{n:02}.csv", one_row_csv())
    lists = CountedLists(monkeypatch)
    cursor = None
    found = []
    for _ in range(3):
        result, cursor = reconcile_ticks(instance, cursor)
        found.append(files_requested(result))
    assert found == [10, 10, 5]  # each key once per pass, none twice
    assert lists.of("incoming/") == [10, 10, 5]
    result, cursor = reconcile_ticks(instance, cursor)  # the next pass: all known now
    assert files_requested(result) == 0 and lists.of("incoming/")[-1] == 10


def write_inventory(
    store: S3Store, prefix: str, taken_at: datetime, objects: list[ObjectInfo], fmt: str
) -> str:
    """An S3 Inventory report as AWS writes one (docs.aws.amazon.com, "Locating your inventory
    list"): a data file and `<prefix><YYYY-MM-DDTHH-MMZ>/manifest.json` naming it."""
    import gzip
    import io
    import json
    from urllib.parse import quote

    import pyarrow as pa
    import pyarrow.parquet as pq

    stamp = taken_at.strftime("%Y-%m-%dT%H-%MZ")
    if fmt == "CSV":
        lines = [
            f'"{store.bucket}","{quote(o.key)}","{o.size}",'
            f'"{o.last_modified.strftime("%Y-%m-%dT%H:%M:%S.000Z")}","{o.etag}"'
            for o in objects
        ]
        data, schema = (
            gzip.compress("\n".join(lines).encode()),
            "Bucket, Key, Size, LastModifiedDate, ETag",
        )
        key = f"{prefix}data/{stamp}.csv.gz"
    else:
        table = pa.table(
            {
                "bucket": [store.bucket] * len(objects),
                "key": [o.key for o in objects],
                "size": [o.size for o in objects],
                "last_modified_date": pa.array(
                    [o.last_modified for o in objects], pa.timestamp("ms", tz="UTC")
                ),
                "e_tag": [o.etag for o in objects],
            }
        )
        sink = io.BytesIO()
        pq.write_table(table, sink)
        data, schema = sink.getvalue(), "message s3.inventory { }"
        key = f"{prefix}data/{stamp}.parquet"
    store.put_bytes(key, data)
    manifest = {
        "sourceBucket": store.bucket,
        "version": "2016-11-30",
        "creationTimestamp": str(int(taken_at.timestamp() * 1000)),
        "fileFormat": fmt,
        "fileSchema": schema,
        "files": [{"key": key, "size": len(data), "MD5checksum": ""}],
    }
    store.put_bytes(f"{prefix}{stamp}/manifest.json", json.dumps(manifest).encode())
    return key


def test_with_an_inventory_the_reconcile_reads_each_new_report_once_and_lists_nothing(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On AWS, S3 Inventory replaces the listing: a tick reads the newest report when it is
    new, and compares only what was modified since the report before; incoming/ is never
    listed. CSV (keys URL-encoded) and Parquet reports alike."""
    settings = Settings.from_env()
    ledger = Ledger.of(s3_store, settings)
    ledger.create()
    prefix = f"inventory/{s3_store.bucket}/incoming-daily/"
    monkeypatch.setenv("KINDEX_S3_INVENTORY", prefix)
    for name in ("a b.csv", "c.csv"):
        s3_store.put_bytes(f"incoming/{name}", one_row_csv())
    listed = [o for o in s3_store.list("incoming/")]
    ledger.append([FileEntry.pending(s3_store.bucket, listed[1])])  # c.csv: known
    first = datetime.now(UTC) - timedelta(hours=2)
    write_inventory(s3_store, prefix, first, listed, "CSV")
    lists = CountedLists(monkeypatch)

    result, cursor = reconcile_ticks(instance)
    [request] = result.run_requests or []
    assert [e.key for e in ledger.of_batch(batch_of(request))] == ["incoming/a b.csv"]
    result, cursor = reconcile_ticks(instance, cursor)  # the same report: nothing read
    assert files_requested(result) == 0
    assert lists.of("incoming/") == []

    old = ObjectInfo("incoming/old.csv", "0" * 32, 5, first - timedelta(days=3))
    s3_store.put_bytes("incoming/new.csv", one_row_csv(extra=1))
    new = s3_store.head("incoming/new.csv")
    write_inventory(s3_store, prefix, datetime.now(UTC), [*listed, old, new], "Parquet")
    result, cursor = reconcile_ticks(instance, cursor)
    [request] = result.run_requests or []
    # old.csv was modified before the report before began: that report's time was compared.
    assert [e.key for e in ledger.of_batch(batch_of(request))] == ["incoming/new.csv"]
    assert lists.of("incoming/") == []


def test_a_full_reconcile_runs_on_request_and_its_files_are_requested_by_the_ledger_sensor(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    import definitions

    settings = Settings.from_env()
    Ledger.of(s3_store, settings).create()
    for n in range(3):
        s3_store.put_bytes(f"incoming/lost{n}.csv", one_row_csv())
    lists = CountedLists(monkeypatch)
    job = definitions.defs.resolve_job_def("reconcile_bucket")
    run = job.execute_in_process(
        instance=instance,
        run_config=reconcile_command.reconcile_config(full=True),  # what `kindex reconcile` sends
        resources={"kindex": KindexResource()},
    )
    assert run.success
    assert lists.of("incoming/") == [3]
    # The index's check, over the listing: the three were in no ledger row before.
    verdict = check_evaluations(run)["every_version_processed"]
    assert not verdict.passed
    assert verdict.metadata["missing_versions"].value == 3
    assert verdict.metadata["object_versions"].value == 3
    assert verdict.metadata["compared"].value == "a full listing of incoming/"
    ledger = Ledger.of(s3_store, settings)
    assert {e.state for e in ledger.current()} == {FileState.PENDING}
    assert len(ledger.current()) == 3
    later = time.time() + timedelta(minutes=6).total_seconds()
    monkeypatch.setattr(assets.sensors, "clock", lambda: later)
    result = ledger_sensor(
        build_sensor_context(instance=instance, resources={"kindex": KindexResource()})
    )
    assert isinstance(result, SensorResult) and files_requested(result) == 3


def test_a_publishs_check_reads_what_the_sensors_found_and_lists_nothing(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The every_version_processed check at a publish: a version found (pending) fails it until
    its batch is done, with no listing of incoming/ (the full one is `kindex reconcile
    --full`'s); a version no sensor found is not the publish's to see."""
    settings = Settings.from_env()
    ledger = Ledger.of(s3_store, settings)
    s3_store.put_bytes("incoming/found.csv", one_row_csv())
    s3_store.put_bytes("incoming/unseen.csv", one_row_csv(1))
    found = FileEntry.pending(s3_store.bucket, s3_store.head("incoming/found.csv"), "b1")
    ledger.append([found])
    lists = CountedLists(monkeypatch)
    kindex = KindexResource()

    passed, _, metadata = missing_versions_check(kindex)
    assert not passed and metadata["missing_versions"].value == 1
    assert "incoming/found.csv" in metadata["examples"].value
    ledger.append([replace(found, state=FileState.INDEXED, attempts=1, updated_at=None)])
    passed, _, metadata = missing_versions_check(kindex)
    assert passed and metadata["missing_versions"].value == 0
    assert lists.of("incoming/") == []
    # The full check sees the unseen one.
    listing, missing = unprocessed_versions(s3_store, settings, ledger)
    assert [o.key for o in missing] == ["incoming/unseen.csv"] and len(listing) == 2


def test_kindex_reconcile_full_launches_the_reconcile_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.cli import build_parser, main

    assert build_parser().parse_args(["reconcile", "--full"]).full
    assert not build_parser().parse_args(["reconcile"]).full
    monkeypatch.setenv("KINDEX_HOME", str(tmp_path))
    assert main(["reconcile", "--full"]) == 2  # no `kindex up` here, no --url
    assert "no running `kindex up`" in capsys.readouterr().err
    launched: list[tuple[str, bool]] = []

    def launch(url: str, full: bool) -> str:
        launched.append((url, full))
        return "run-1"

    monkeypatch.setattr(reconcile_command, "launch_reconcile", launch)
    assert main(["reconcile", "--full", "--url", "http://127.0.0.1:3111"]) == 0
    assert launched == [("http://127.0.0.1:3111/graphql", True)]
    out = capsys.readouterr()
    assert out.out.strip() == "run-1" and "a full listing of incoming/" in out.err


class PagedFeed:
    """A filer feed whose log is a list of pages (the real one: tests/test_notifications.py)."""

    name = "filer"

    def __init__(self, pages: list[ChangePage]) -> None:
        self.pages = pages
        self.polled: list[str | None] = []

    def since(self, moment: datetime) -> str:
        return f"since {moment.isoformat()}"

    def poll(self, cursor: str | None, limit: int) -> ChangePage:
        self.polled.append(cursor)
        return self.pages.pop(0) if self.pages else ChangePage([], f"{cursor}+")

    def acknowledge(self, page: ChangePage) -> None:
        pass


def test_on_the_embedded_store_a_tick_reads_the_filer_log_since_the_last(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded server's bound: the changes its filer log holds since the last tick (from
    its cursor), never a listing; a gap the log reports is listed once, since the gap."""
    settings = Settings.from_env()
    at = datetime.now(UTC).replace(microsecond=0)
    s3_store.put_bytes("incoming/unnotified.csv", one_row_csv())
    change = ObjectChange("incoming/a.csv", "a" * 32, 3, at, deleted=False)
    gone = ObjectChange("incoming/b.csv", "b" * 32, 3, at, deleted=True)
    feed = PagedFeed([ChangePage([change, gone], "p1"), ChangePage([change], "p2")])
    lists = CountedLists(monkeypatch)
    step = changed_versions(s3_store, settings, ReconcileCursor(), feed=cast(Any, feed), now=at)
    assert [v.key for v in step.versions] == ["incoming/a.csv"]
    assert (step.source, step.cursor.feed, lists.calls) == ("filer", "p2+", [])
    assert feed.polled[0] == f"since {(at - FEED_OVERLAP).isoformat()}"

    feed.pages = [ChangePage([], "p3", gap_since=at - timedelta(minutes=1))]
    step = changed_versions(s3_store, settings, step.cursor, feed=cast(Any, feed), now=at)
    assert feed.polled[-1] == "p2+"
    assert (step.source, [v.key for v in step.versions]) == ("gap", ["incoming/unnotified.csv"])
    assert lists.of("incoming/") == [1]
