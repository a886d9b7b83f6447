"""One file's failure is that file's alone, in a real Dagster run over real S3: the failed file
is a `failed` row of the file ledger with its reason and a backoff, the run and every other file
of its batch land, the ledger sensor requests the failed file again once its backoff passed, a
fault of the batch as a whole is retried by the step's retry policy, and a broken chart is a
warning."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    RunRequest,
    SensorResult,
    build_sensor_context,
)
from dagster_support import (
    SensorDriver,
    check_evaluations,
    execute,
    failure_messages,
    latest_metadata,
)
from index_support import query
from liger_support import HEADER, LIGER_CSV, csv_lines

import assets.files
import assets.index
import assets.sensors
import pipelines.ingest
from assets.resources import KindexResource
from assets.sensors import batch_of, ledger_sensor
from pipelines.intake.ledger import FIRST_BACKOFF, FileEntry, FileState, Ledger
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo
from pipelines.storage.s3 import S3Store

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


def files(s3_store: Any) -> dict[str, FileEntry]:
    """The ledger's row of each key (one version each here)."""
    return {e.key: e for e in Ledger.of(s3_store, Settings.from_env()).current()}


def fail_for(monkeypatch: pytest.MonkeyPatch, key: str, times: int | None = None) -> list[str]:
    """The store's GET raises for one object key (`times` times, or always): a fault kindex
    cannot cause on purpose, like S3 breaking down past the store's own retries."""
    real = S3Store.get_object
    calls: list[str] = []

    def flaky(store: S3Store, got: str) -> tuple[bytes, ObjectInfo]:
        if got == key and (times is None or len(calls) < times):
            calls.append(got)
            raise ConnectionError(f"injected fault reading {key}")
        return real(store, got)

    monkeypatch.setattr(S3Store, "get_object", flaky)
    return calls


def ledger_tick(instance: DagsterInstance, cursor: str | None = None) -> SensorResult:
    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"kindex": KindexResource()}
    )
    result = ledger_sensor(context)
    assert isinstance(result, SensorResult)
    return result


def batch_keys(s3_store: Any, request: RunRequest) -> list[str]:
    batch = batch_of(request)
    return [e.key for e in Ledger.of(s3_store, Settings.from_env()).of_batch(batch)]


def test_a_failing_file_is_a_failed_ledger_row_and_the_others_land(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = drop_files(s3_store, 12)  # more files than threads: some start after the failure
    calls = fail_for(monkeypatch, keys[0], times=1)  # transient: gone by the next attempt
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []

    run = execute(instance, request)

    assert run.success, failure_messages(run)  # a failed file never fails the run
    assert calls == [keys[0]]
    meta = latest_metadata(instance, "records", request.partition_key)
    assert (meta["files"], meta["files_indexed"], meta["files_failed"]) == (12, 11, 1)
    assert meta["runs"] == 11
    failed_line = next(line for line in str(meta["per_file"]).splitlines() if keys[0] in line)
    assert "failed" in failed_line and "injected fault" in failed_line
    checks = check_evaluations(run)
    assert not checks["every_file_processed"].passed
    assert checks["every_file_processed"].metadata["failed_files"].value == 1
    assert keys[0] in str(checks["every_file_processed"].metadata["failures"].value)
    rows = files(s3_store)
    failed = rows[keys[0]]
    assert failed.state is FileState.FAILED and failed.attempts == 1
    assert "ConnectionError: injected fault" in str(failed.reason)
    assert failed.next_attempt_at is not None and failed.updated_at is not None
    wait = failed.next_attempt_at - failed.updated_at
    assert FIRST_BACKOFF * 0.8 <= wait <= FIRST_BACKOFF * 1.2  # counted from the failure
    assert all(rows[k].state is FileState.INDEXED and rows[k].runs == 1 for k in keys[1:])
    published = "select count(distinct source_key) from snapshots"  # the runs are one, deduplicated
    assert query(Settings.from_env(), published) == [(11,)]

    # The ledger sensor requests the failed file again, alone, once its backoff passed.
    now = [time.time()]
    monkeypatch.setattr(assets.sensors, "clock", lambda: now[0])
    waiting = ledger_tick(instance)
    assert not waiting.run_requests
    now[0] = failed.next_attempt_at.timestamp() + 1
    (retry,) = ledger_tick(instance, waiting.cursor).run_requests or []
    assert batch_keys(s3_store, retry) == [keys[0]]
    assert retry.partition_key == request.partition_key
    assert retry.tags["kindex/why"] == "retry"

    again = execute(instance, retry)

    assert again.success
    landed = files(s3_store)[keys[0]]
    assert landed.state is FileState.INDEXED and landed.attempts == 2 and landed.runs == 1
    assert landed.reason is None and landed.next_attempt_at is None
    assert check_evaluations(again)["every_file_processed"].passed
    assert query(Settings.from_env(), published) == [(12,)]


def test_a_transient_fault_of_the_batch_is_retried_by_the_step(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index's publish fails once (after the batch's ledger commit): the step runs again,
    finds the record sets written and adds no run twice."""
    drop_files(s3_store, 3)
    real = pipelines.ingest.publish_index
    calls: list[int] = []

    def flaky(store: Any, settings: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("injected fault publishing the index")
        return real(store, settings)

    # wherever a publish is called from: the batch's own step, and the index asset
    monkeypatch.setattr(pipelines.ingest, "publish_index", flaky)
    monkeypatch.setattr(assets.index, "publish_the_index", flaky)
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []

    run = execute(instance, request)

    assert run.success, failure_messages(run)
    assert len(calls) == 2
    assert any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in run.all_events)
    materialized = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
    ).records
    # The failed attempt materialized nothing: one of the window (the others are the index it
    # published and the tables people query).
    assert [r.asset_key for r in materialized].count(AssetKey("records")) == 1
    meta = latest_metadata(instance, "records", request.partition_key)
    assert meta["files"] == meta["files_indexed"] == 3
    assert {e.state for e in files(s3_store).values()} == {FileState.INDEXED}
    settings = Settings.from_env()
    # The files' rows are one run (deduplicated); each file is one read, once.
    assert query(settings, "select count(*) from runs") == [(1,)]
    assert query(settings, "select count(*), count(distinct snapshot_digest) from snapshots") == [
        (3, 3)
    ]


def test_broken_speedups_are_a_warning_not_a_failure(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = csv_lines([2212, 2208])  # one cohort: liger's jsd and its torch baseline
    s3_store.put_bytes("incoming/two.csv", (f"{HEADER}\n" + "\n".join(rows) + "\n").encode())

    def broken(rows: Any) -> dict[str, list[float]]:
        raise ValueError("ParseException in a shared mathtext parser")

    monkeypatch.setattr(assets.files, "speedup_series", broken)
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []

    run = execute(instance, request)

    assert run.success
    meta = latest_metadata(instance, "records", request.partition_key)
    assert meta["runs"] == 2 and meta["files_indexed"] == 1
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
    meta = latest_metadata(instance, "records", request.partition_key)
    assert meta["runs"] == 2448
    assert "speedup chart failed: ValueError: ParseException" in str(meta["warnings"])
    assert meta["speedups"].records  # a typed table
    assert "speedup_chart" not in meta
    assert check_evaluations(run)["records_match_schemas"].passed
