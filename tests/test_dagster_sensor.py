"""The incoming-files sensor against a real SeaweedFS bucket: nothing dropped is missed (many
files at once, same-second uploads, overwrites, keys sorting before others), deleted keys do not
wedge it, and a tick's files go into few runs (a batch per arrival window, at most
BATCH_FILES files each)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    RunRequest,
)
from dagster_support import (
    SensorDriver,
    check_evaluations,
    execute,
    execute_all,
    failure_messages,
    latest_metadata,
)
from index_support import csv_bytes, liger_rows, query

import assets.sensors
from assets.sensors import batch_of, batch_requests
from pipelines.ingest import BATCH_FILES
from pipelines.intake.ledger import FileEntry, FileState, Ledger, window_of
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo

MANY_FILES = 1000
SAME_SECOND_ATTEMPTS = 10
RECORDS = AssetKey("records")


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def tiny_csv(line: int) -> bytes:
    """A one-row Liger CSV: row `line` of the shared file."""
    header, rows = liger_rows([line])
    return csv_bytes(header, rows)


def ledger_of(store: Any) -> Ledger:
    return Ledger.of(store, Settings.from_env())


def requested(store: Any, requests: Sequence[RunRequest]) -> list[FileEntry]:
    """The ledger's rows of the files these runs process (pending until they run)."""
    ledger = ledger_of(store)
    return [entry for r in requests for entry in ledger.of_batch(batch_of(r))]


def versions(entries: list[FileEntry]) -> set[tuple[str, str]]:
    return {(e.key, e.etag) for e in entries}


def rows_of(store: Any, key: str) -> list[FileEntry]:
    """Each version of a key in the ledger (its newest row), oldest first."""
    return ledger_of(store).current("key = ?", [key])


@pytest.mark.slow  # ~390 s on a shared 2-core machine: 1,000 files through S3 and Dagster
def test_a_thousand_files_dropped_at_once_are_all_processed_in_few_runs(
    s3_store: Any, instance: DagsterInstance
) -> None:
    header, rows = liger_rows(range(2, 2 + MANY_FILES))
    with ThreadPoolExecutor(16) as pool:
        dropped = list(
            pool.map(
                lambda n: s3_store.put_bytes(
                    f"incoming/burst/{n:04d}.csv", csv_bytes(header, [rows[n]])
                ),
                range(MANY_FILES),
            )
        )
    driver = SensorDriver(instance)

    tick = driver.tick()

    requests = tick.run_requests or []
    windows: dict[str, int] = {}
    for info in dropped:
        windows[window_of(info.last_modified)] = windows.get(window_of(info.last_modified), 0) + 1
    # 1 run, not 1,000 (2 when the burst straddles an hour)
    assert len(requests) == sum(-(-n // BATCH_FILES) for n in windows.values())
    assert {r.partition_key for r in requests} == set(windows)
    assert sum(int(r.tags["kindex/files"]) for r in requests) == MANY_FILES
    assert versions(requested(s3_store, requests)) == {(o.key, o.etag) for o in dropped}
    assert not driver.tick().run_requests

    execute_all(instance, requests)

    assert instance.get_materialized_partitions(RECORDS) == set(windows)
    materializations = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=RECORDS), limit=100
    ).records
    assert len(materializations) == len(requests)  # one per run, not one per file
    files = [
        int(str(r.asset_materialization.metadata["files_indexed"].value))  # type: ignore[union-attr]
        for r in materializations
    ]
    assert sum(files) == MANY_FILES
    settings = Settings.from_env()
    assert query(settings, "select state, count(*) from files group by state") == [
        ("indexed", MANY_FILES)
    ]
    indexed = query(settings, "select count(distinct snapshot_digest) from snapshots")
    assert indexed == [(MANY_FILES,)]


def test_a_ticks_files_go_in_a_batch_per_window_of_at_most_max_files(s3_store: Any) -> None:
    """Versions of two arrival windows, more in one than a run takes: a run per window and
    BATCH_FILES files, each file in one batch, all pending in the ledger before any run is
    requested."""
    late = datetime(2026, 3, 1, 10, 59, 59, tzinfo=UTC)
    busy = [
        ObjectInfo(f"incoming/busy/{n:04d}.csv", f"etag{n}", 10, late - timedelta(seconds=n))
        for n in range(BATCH_FILES + 20)
    ]
    quiet = [
        ObjectInfo(f"incoming/quiet/{n}.csv", f"etag{n}", 10, late + timedelta(seconds=1 + n))
        for n in range(3)
    ]
    entries = [FileEntry.pending(s3_store.bucket, o) for o in [*busy, *quiet]]
    ledger = ledger_of(s3_store)

    requests = batch_requests(ledger, entries, "new")

    windows = [r.partition_key for r in requests]
    assert windows == ["2026-03-01-10:00", "2026-03-01-10:00", "2026-03-01-11:00"]
    sizes = [int(r.tags["kindex/files"]) for r in requests]
    assert sizes == [BATCH_FILES, 20, 3]
    assert len({batch_of(r) for r in requests}) == len({r.run_key for r in requests}) == 3
    for request in requests:
        batch = ledger.of_batch(batch_of(request))
        assert len(batch) == int(request.tags["kindex/files"])
        assert {e.arrival_window for e in batch} == {request.partition_key}
        assert {e.state for e in batch} == {FileState.PENDING}
    assert versions(requested(s3_store, requests)) == versions(entries)


def test_versions_two_ticks_found_at_once_are_requested_by_one(
    s3_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The incoming sensor and a reconcile tick both read the ledger before either wrote its
    pending rows: the second to commit leaves the versions the first wrote to the first's runs,
    and requests the rest. A commit that lands between a tick's check and its commit is not
    checked: the version is in both batches, and belongs to the newer row's."""
    when = datetime(2026, 3, 1, 10, 30, tzinfo=UTC)
    found = [ObjectInfo(f"incoming/race/{n}.csv", f"etag{n}", 10, when) for n in range(3)]
    entries = [FileEntry.pending(s3_store.bucket, o) for o in found]
    incoming, reconcile = ledger_of(s3_store), ledger_of(s3_store)
    assert incoming.seen(found) == reconcile.seen(found) == {}

    first = batch_requests(incoming, entries[:2], "new", found=True)
    second = batch_requests(reconcile, entries, "reconcile", found=True)
    assert [int(r.tags["kindex/files"]) for r in [*first, *second]] == [2, 1]
    assert versions(requested(s3_store, first)) == versions(entries[:2])
    assert versions(requested(s3_store, second)) == versions(entries[2:])
    assert [len(rows_of(s3_store, e.key)) for e in entries] == [1, 1, 1]

    # A third tick commits between a fourth's check and its commit.
    late = [ObjectInfo(f"incoming/race/late-{n}.csv", "etag", 10, when) for n in range(2)]
    late_entries = [FileEntry.pending(s3_store.bucket, o) for o in late]
    real_check = Ledger._seen_in
    third: list[RunRequest] = []
    checks: list[int] = []

    def check_then_lose_the_race(self: Ledger, table: Any, wanted: Any) -> Any:
        known = real_check(self, table, wanted)
        checks.append(len(known))
        if len(checks) == 1:  # the fourth's check: the third commits now
            third.extend(batch_requests(incoming, late_entries[:1], "new", found=True))
        return known

    monkeypatch.setattr(Ledger, "_seen_in", check_then_lose_the_race)
    fourth = batch_requests(reconcile, late_entries, "reconcile", found=True)
    assert checks == [0, 0]  # the fourth's check, the third's: no second one
    assert [int(r.tags["kindex/files"]) for r in [*third, *fourth]] == [1, 2]
    # Each version's newest row names one batch: the run of the other passes it over.
    owned = [versions(requested(s3_store, [r])) for r in [*third, *fourth]]
    assert owned[0].isdisjoint(owned[1])
    assert owned[0] | owned[1] == versions(late_entries)


def test_uploads_in_the_watermark_second_are_not_missed(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`second` lands in `first`'s second while the tick that saw `first` writes its ledger rows
    (a tick takes about a second now: the upload is made right after its listing)."""
    driver = SensorDriver(instance)
    real = assets.sensors.new_file_requests
    same_second_seen = False
    for attempt in range(SAME_SECOND_ATTEMPTS):
        uploads: list[ObjectInfo] = []

        def racing(
            kindex: Any, listed: Any, attempt: int = attempt, uploads: list[ObjectInfo] = uploads
        ) -> Any:
            if not uploads:  # the tick listed `first`; `second` lands now
                uploads.append(
                    s3_store.put_bytes(f"incoming/s{attempt}/second.csv", tiny_csv(30 + attempt))
                )
            return real(kindex, listed)

        time.sleep(1 - time.time() % 1)  # the start of a second: room for both uploads
        first = s3_store.put_bytes(f"incoming/s{attempt}/first.csv", tiny_csv(2 + attempt))
        monkeypatch.setattr(assets.sensors, "new_file_requests", racing)
        seen = driver.tick()  # the watermark is now `first`'s second
        monkeypatch.setattr(assets.sensors, "new_file_requests", real)
        (second,) = uploads
        assert versions(requested(s3_store, seen.run_requests or [])) == {(first.key, first.etag)}

        tick = driver.tick()

        assert len(tick.run_requests or []) == 1
        assert versions(requested(s3_store, tick.run_requests or [])) == {(second.key, second.etag)}
        if second.last_modified == first.last_modified:
            same_second_seen = True
            break
    assert same_second_seen, "never managed two uploads in one second; the case was not tested"


def test_an_overwrite_with_new_bytes_is_new_work_and_its_run_reads_the_new_bytes(
    s3_store: Any, instance: DagsterInstance
) -> None:
    driver = SensorDriver(instance)
    old = s3_store.put_bytes("incoming/results.csv", tiny_csv(2))
    execute_all(instance, driver.tick().run_requests or [])

    new = s3_store.put_bytes("incoming/results.csv", tiny_csv(3))
    tick = driver.tick()

    assert new.etag != old.etag
    assert versions(requested(s3_store, tick.run_requests or [])) == {(new.key, new.etag)}
    execute_all(instance, tick.run_requests or [])
    old_row, new_row = rows_of(s3_store, "incoming/results.csv")
    assert (old_row.etag, new_row.etag) == (old.etag, new.etag)
    assert old_row.state is new_row.state is FileState.INDEXED
    assert old_row.snapshot_digest and new_row.snapshot_digest
    assert old_row.snapshot_digest != new_row.snapshot_digest
    settings = Settings.from_env()
    assert query(settings, "select count(*) from runs where not retracted_in_source") == [(1,)]


def test_an_overwrite_before_the_run_marks_the_old_version_gone_not_failed(
    s3_store: Any, instance: DagsterInstance
) -> None:
    driver = SensorDriver(instance)
    old = s3_store.put_bytes("incoming/results.csv", tiny_csv(2))
    first_tick = driver.tick()
    new = s3_store.put_bytes("incoming/results.csv", tiny_csv(3))
    second_tick = driver.tick()
    (first,) = first_tick.run_requests or []

    run = execute(instance, first)  # the version it names is overwritten already

    assert run.success, failure_messages(run)
    meta = latest_metadata(instance, "records", first.partition_key)
    assert meta["files_gone"] == 1 and meta["files_failed"] == 0
    assert check_evaluations(run)["every_file_processed"].passed
    execute_all(instance, second_tick.run_requests or [])
    # The two uploads may share a LastModified second: each version by its ETag.
    by_etag = {row.etag: row for row in rows_of(s3_store, "incoming/results.csv")}
    old_row, new_row = by_etag[old.etag], by_etag[new.etag]
    assert old_row.state is FileState.GONE
    assert "overwritten or deleted" in str(old_row.reason)
    assert new_row.state is FileState.INDEXED
    assert new_row.runs == 1
    assert not ledger_of(s3_store).due(
        datetime.now(UTC) + timedelta(days=1), datetime.now(UTC)
    )  # nothing to retry


def test_a_key_that_sorts_before_the_last_one_is_found(
    s3_store: Any, instance: DagsterInstance
) -> None:
    driver = SensorDriver(instance)
    s3_store.put_bytes("incoming/zz-last.csv", tiny_csv(2))
    driver.tick()

    early = s3_store.put_bytes("incoming/aa-first.csv", tiny_csv(3))
    tick = driver.tick()

    assert versions(requested(s3_store, tick.run_requests or [])) == {(early.key, early.etag)}


def test_deleted_keys_do_not_wedge_the_sensor(s3_store: Any, instance: DagsterInstance) -> None:
    driver = SensorDriver(instance)
    doomed = s3_store.put_bytes("incoming/doomed.csv", tiny_csv(2))
    kept = s3_store.put_bytes("incoming/kept.csv", tiny_csv(3))
    driver.tick()
    s3_store.delete(doomed.key)
    s3_store.delete(kept.key)
    assert not driver.tick().run_requests  # an empty prefix: nothing to do, no error

    later = s3_store.put_bytes("incoming/later.csv", tiny_csv(4))
    tick = driver.tick()

    assert len(tick.run_requests or []) == 1
    assert versions(requested(s3_store, tick.run_requests or [])) == {(later.key, later.etag)}
    execute_all(instance, tick.run_requests or [])
    (row,) = rows_of(s3_store, later.key)
    assert row.state is FileState.INDEXED and row.runs == 1


def test_a_key_back_to_bytes_it_held_before_is_read_again_and_retracts_nothing(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """A, then B (A less two rows), then A again: the second A is a version of its own (a new
    LastModified); the sensor has it read again, and the index then holds no run of A
    retracted."""
    header, rows = liger_rows(range(448, 454))
    a, b = csv_bytes(header, rows), csv_bytes(header, rows[:4])
    settings = Settings.from_env()
    driver = SensorDriver(instance)
    first = s3_store.put_bytes("incoming/results.csv", a)
    execute_all(instance, driver.tick().run_requests or [])
    s3_store.put_bytes("incoming/results.csv", b)
    execute_all(instance, driver.tick().run_requests or [])
    retracted = "SELECT count(*) FROM runs WHERE retracted_in_source"
    assert query(settings, retracted) == [(2,)]  # the batch run published the index

    again = s3_store.put_bytes("incoming/results.csv", a)
    requests = driver.tick().run_requests or []

    assert again.etag == first.etag
    assert [r.partition_key for r in requests] == [window_of(again.last_modified)]
    (pending,) = requested(s3_store, requests)
    assert pending.version == (again.key, again.etag, again.last_modified.replace(microsecond=0))
    assert pending.version != FileEntry.pending(s3_store.bucket, first).version
    execute_all(instance, requests)
    assert query(settings, retracted) == [(0,)]
    assert [r.state for r in rows_of(s3_store, "incoming/results.csv")] == [FileState.INDEXED] * 3
    assert not driver.tick().run_requests


def test_a_ticks_run_is_of_the_records_step_alone_and_materializes_its_window_once(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """Dagster writes a planned event per partition for every asset of a run, one at a time;
    the sensor's runs select `records` only, one arrival window each, so a batch of files costs
    one planned event and one materialization."""
    dropped = [s3_store.put_bytes(f"incoming/pair/{n}.csv", tiny_csv(2 + n)) for n in range(3)]
    windows = {window_of(o.last_modified) for o in dropped}
    driver = SensorDriver(instance)
    requests = driver.tick().run_requests or []
    assert len(requests) == len(windows)  # one, unless the drop straddles an hour
    request = requests[0]

    result = execute(instance, request)

    assert result.success, failure_messages(result)
    planned = instance.get_records_for_run(
        result.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    assert len(planned) == 1  # one per run, not one per file
    materialized = instance.get_records_for_run(
        result.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
    ).records
    # One of its window; the others are the index it published and the tables people query.
    assert [r.asset_key for r in materialized].count(RECORDS) == 1
    assert instance.get_materialized_partitions(RECORDS) == {request.partition_key}
    meta = latest_metadata(instance, "records", request.partition_key)
    assert meta["files"] == meta["files_indexed"] == int(request.tags["kindex/files"])
    for info in dropped:
        if window_of(info.last_modified) == request.partition_key:
            assert info.key in str(meta["per_file"])


def test_files_found_while_batches_wait_for_a_slot_join_a_later_batch(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While batch runs wait for a run slot, a tick reads nothing: the files it would find join
    the files of a later tick in one batch (a run each would pay a run's fixed costs behind the
    queue). It holds them a minute at most: a queue that never drains never stops discovery."""
    now = [time.time()]
    monkeypatch.setattr(assets.sensors, "clock", lambda: now[0])
    queued = [1]  # batch runs the coordinator holds, as the instance would count them
    monkeypatch.setattr(assets.sensors, "batches_waiting", lambda instance: queued[0])
    driver = SensorDriver(instance)
    first = s3_store.put_bytes("incoming/first.csv", tiny_csv(2))

    assert not driver.tick().run_requests  # held: the queue has a batch run
    second = s3_store.put_bytes("incoming/second.csv", tiny_csv(3))
    now[0] += 10
    assert not driver.tick().run_requests

    queued[0] = 0  # the queue drained: one batch of both
    tick = driver.tick()

    assert len(tick.run_requests or []) == 1
    both = {(first.key, first.etag), (second.key, second.etag)}
    assert versions(requested(s3_store, tick.run_requests or [])) == both

    queued[0] = 1  # a queue that does not drain: a file waits a minute at most
    third = s3_store.put_bytes("incoming/third.csv", tiny_csv(4))
    assert not driver.tick().run_requests
    now[0] += assets.sensors.HOLD_WHILE_QUEUED.total_seconds()
    tick = driver.tick()
    assert versions(requested(s3_store, tick.run_requests or [])) == {(third.key, third.etag)}
