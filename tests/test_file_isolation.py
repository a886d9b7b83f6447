"""One file's failure is that file's alone, in a real Dagster run over real S3: the failed file
is a failed partition with its error, every other file of the run is materialized, a broken
chart is a warning, and a transient fault is retried by the step's retry policy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dagster import AssetKey, AssetPartitionStatus, DagsterInstance
from dagster_support import (
    SensorDriver,
    backfill_request,
    check_evaluations,
    execute,
    latest_metadata,
)
from liger_support import HEADER, LIGER_CSV, csv_lines

import assets.files
from assets.partitions import INCOMING_FILES
from pipelines.ingest import SnapshotRecords, process_snapshot

RECORDS = AssetKey("records")


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def drop_files(s3_store: Any, count: int) -> list[str]:
    (row,) = csv_lines([2212])
    keys = [f"incoming/file-{i:02d}.csv" for i in range(count)]
    for i, key in enumerate(keys):  # distinct bytes: one snapshot each
        s3_store.put_bytes(key, f"{HEADER}\n{row}\n".encode() + b"\n" * i)
    return keys


def statuses(instance: DagsterInstance, keys: list[str]) -> dict[str, Any]:
    found = instance.get_status_by_partition(RECORDS, keys, INCOMING_FILES)
    assert found is not None
    return dict(found)


def fail_for(monkeypatch: pytest.MonkeyPatch, key: str, times: int | None = None) -> list[str]:
    """`process_snapshot` raises for one object key (`times` times, or always): a fault kindex
    cannot cause on purpose, like S3 breaking down past the store's own retries."""
    real = assets.files.process_snapshot
    calls: list[str] = []

    def flaky(store: Any, settings: Any, snap: Any, taken: Any = None) -> SnapshotRecords:
        if snap.key == key and (times is None or len(calls) < times):
            calls.append(snap.key)
            raise ConnectionError(f"injected fault reading {key}")
        return real(store, settings, snap, taken)

    monkeypatch.setattr(assets.files, "process_snapshot", flaky)
    return calls


def test_a_failing_file_is_a_failed_partition_and_the_others_land(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = drop_files(s3_store, 12)  # more files than threads: some start after the failure
    fail_for(monkeypatch, keys[0])
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []

    run = execute(instance, request)

    assert not run.success  # the run says a file failed ...
    partitions = sorted(driver.partition_keys())
    by_status = statuses(instance, partitions)
    failed = [p for p in partitions if p.startswith(keys[0] + "@")]
    assert [p for p, s in by_status.items() if s == AssetPartitionStatus.FAILED] == failed
    good = [p for p in partitions if p not in failed]
    assert all(by_status[p] == AssetPartitionStatus.MATERIALIZED for p in good)  # ... alone
    for partition in good:
        assert latest_metadata(instance, "records", partition)["runs"] == 1
    failure = next(e for e in run.all_events if e.is_step_failure and e.step_key == "records")
    assert "injected fault" in str(failure.event_specific_data)
    assert keys[0] in str(failure.event_specific_data)

    # The fault is gone: re-requesting the failed partition lands it.
    monkeypatch.setattr(assets.files, "process_snapshot", process_snapshot)
    (partition,) = failed
    again = execute(instance, backfill_request(partition))
    assert again.success
    assert statuses(instance, [partition])[partition] == AssetPartitionStatus.MATERIALIZED


def test_a_transient_fault_is_retried_by_the_step(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = drop_files(s3_store, 3)
    calls = fail_for(monkeypatch, keys[1], times=1)
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []

    run = execute(instance, request)

    assert run.success, [str(e.event_specific_data) for e in run.all_events if e.is_step_failure]
    assert calls == [keys[1]]
    assert any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in run.all_events)
    partitions = driver.partition_keys()
    assert set(statuses(instance, partitions).values()) == {AssetPartitionStatus.MATERIALIZED}
    # The retry redid only the failed file: every file was materialized exactly once.
    materialized = [
        e.event_specific_data.materialization.partition
        for e in run.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
        and e.event_specific_data.materialization.asset_key == RECORDS
    ]
    assert sorted(materialized) == sorted(partitions)


def test_broken_speedups_are_a_warning_not_a_failure(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = csv_lines([2212, 1843])
    s3_store.put_bytes("incoming/two.csv", (f"{HEADER}\n" + "\n".join(rows) + "\n").encode())

    def broken(runs: Any) -> dict[str, list[float]]:
        raise ValueError("ParseException in a shared mathtext parser")

    monkeypatch.setattr(assets.files, "speedups", broken)
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []

    run = execute(instance, request)

    assert run.success
    (partition,) = driver.partition_keys()
    meta = latest_metadata(instance, "records", partition)
    assert meta["runs"] == 2
    assert "speedups failed: ValueError: ParseException" in str(meta["warnings"])
    assert "speedups" not in meta


def test_a_broken_chart_is_a_warning_and_the_table_stays(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_store.put_bytes("incoming/all.csv", LIGER_CSV.read_bytes())  # large enough for a chart

    def broken(by_series: Any, title: str) -> bytes:
        raise ValueError("ParseException in a shared mathtext parser")

    monkeypatch.setattr(assets.files, "speedup_bars_png", broken)
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []

    run = execute(instance, request)

    assert run.success
    (partition,) = driver.partition_keys()
    meta = latest_metadata(instance, "records", partition)
    assert meta["runs"] == 2448
    assert "speedup chart failed: ValueError: ParseException" in str(meta["warnings"])
    assert "| series | cohorts | speedup |" in str(meta["speedups"])
    assert "speedup_chart" not in meta
    assert check_evaluations(run)["records_match_schemas"].passed
