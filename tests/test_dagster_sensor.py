"""The incoming-files sensor against a real SeaweedFS bucket: nothing dropped is missed (many
files at once, same-second uploads, overwrites, keys sorting before others), deleted keys do not
wedge it, and a tick's files go into few runs."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, PartitionKeyRange
from dagster_support import (
    SensorDriver,
    execute,
    execute_all,
    failure_messages,
    latest_metadata,
    materialize_index,
)
from index_support import csv_bytes, liger_rows, query

from assets.sensors import MAX_FILES_PER_RUN
from pipelines.intake.sensor_cursor import partition_key_for
from pipelines.settings import Settings

MANY_FILES = 1000
SAME_SECOND_ATTEMPTS = 10


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def tiny_csv(line: int) -> bytes:
    """A one-row Liger CSV: row `line` of the shared file."""
    header, rows = liger_rows([line])
    return csv_bytes(header, rows)


@pytest.mark.slow  # ~150 s on a shared 2-core machine: 1,000 files through S3 and Dagster
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
    assert set(driver.partition_keys()) == {partition_key_for(o) for o in dropped}
    assert len(requests) == -(-MANY_FILES // MAX_FILES_PER_RUN)  # 4 runs, not 1,000
    assert sum(int(r.tags["kindex/files"]) for r in requests) == MANY_FILES
    assert not driver.tick().run_requests

    execute_all(instance, requests)
    materialize_index(instance)

    materialized = instance.get_materialized_partitions(AssetKey("records"))
    assert materialized == set(driver.partition_keys())
    runs = sum(
        int(latest_metadata(instance, "records", key)["runs"]) for key in driver.partition_keys()
    )
    assert runs > 0
    indexed = query(Settings.from_env(), "select count(distinct snapshot_digest) from snapshots")
    assert indexed == [(MANY_FILES,)]


def test_uploads_in_the_watermark_second_are_not_missed(
    s3_store: Any, instance: DagsterInstance
) -> None:
    driver = SensorDriver(instance)
    same_second_seen = False
    for attempt in range(SAME_SECOND_ATTEMPTS):
        first = s3_store.put_bytes(f"incoming/s{attempt}/first.csv", tiny_csv(2 + attempt))
        driver.tick()  # the watermark is now `first`'s second
        second = s3_store.put_bytes(f"incoming/s{attempt}/second.csv", tiny_csv(30 + attempt))

        tick = driver.tick()

        assert partition_key_for(second) in driver.partition_keys()
        assert len(tick.run_requests or []) == 1
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
    assert driver.partition_keys() == [partition_key_for(old), partition_key_for(new)]
    execute_all(instance, tick.run_requests or [])
    old_meta = latest_metadata(instance, "snapshot", partition_key_for(old))
    new_meta = latest_metadata(instance, "snapshot", partition_key_for(new))
    assert old_meta["snapshot_digest"] != new_meta["snapshot_digest"]
    assert new_meta["etag"] == new.etag


def test_an_overwrite_before_the_run_marks_the_old_version_gone_not_failed(
    s3_store: Any, instance: DagsterInstance
) -> None:
    driver = SensorDriver(instance)
    old = s3_store.put_bytes("incoming/results.csv", tiny_csv(2))
    first_tick = driver.tick()
    new = s3_store.put_bytes("incoming/results.csv", tiny_csv(3))
    second_tick = driver.tick()

    execute_all(instance, [*(first_tick.run_requests or []), *(second_tick.run_requests or [])])

    gone = latest_metadata(instance, "snapshot", partition_key_for(old))
    assert "gone" in str(gone["error"])
    assert latest_metadata(instance, "records", partition_key_for(new))["runs"] == 1


def test_a_key_that_sorts_before_the_last_one_is_found(
    s3_store: Any, instance: DagsterInstance
) -> None:
    driver = SensorDriver(instance)
    s3_store.put_bytes("incoming/zz-last.csv", tiny_csv(2))
    driver.tick()

    early = s3_store.put_bytes("incoming/aa-first.csv", tiny_csv(3))

    assert driver.tick().run_requests
    assert partition_key_for(early) in driver.partition_keys()


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

    assert partition_key_for(later) in driver.partition_keys()
    assert len(tick.run_requests or []) == 1
    execute_all(instance, tick.run_requests or [])
    assert latest_metadata(instance, "records", partition_key_for(later))["runs"] == 1


def test_a_key_back_to_bytes_it_held_before_is_read_again_and_retracts_nothing(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """A, then B (A less two rows), then A again: the second A has the first one's partition
    key; the sensor has it read again, and the index then holds no run of A retracted."""
    header, rows = liger_rows(range(448, 454))
    a, b = csv_bytes(header, rows), csv_bytes(header, rows[:4])
    settings = Settings.from_env()
    driver = SensorDriver(instance)
    first = s3_store.put_bytes("incoming/results.csv", a)
    execute_all(instance, driver.tick().run_requests or [])
    s3_store.put_bytes("incoming/results.csv", b)
    execute_all(instance, driver.tick().run_requests or [])
    materialize_index(instance)
    retracted = "SELECT count(*) FROM runs WHERE retracted_in_source"
    assert query(settings, retracted) == [(2,)]

    s3_store.put_bytes("incoming/results.csv", a)
    requests = driver.tick().run_requests or []

    assert [(r.asset_selection, r.partition_key_range) for r in requests] == [
        (
            [AssetKey("records")],
            PartitionKeyRange(partition_key_for(first), partition_key_for(first)),
        )
    ]
    execute_all(instance, requests)
    materialize_index(instance)
    assert query(settings, retracted) == [(0,)]
    assert not driver.tick().run_requests


def test_a_ticks_run_is_of_the_records_step_alone_and_materializes_both_partitions(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """Dagster writes a planned event per file for every asset of a run, one at a time; the
    sensor's runs select `records` only, whose step takes and materializes the snapshots too."""
    dropped = [s3_store.put_bytes(f"incoming/pair/{n}.csv", tiny_csv(2 + n)) for n in range(3)]
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []
    assert request.asset_selection == [AssetKey("records")]

    result = execute(instance, request)

    assert result.success, failure_messages(result)
    keys = {partition_key_for(o) for o in dropped}
    planned = instance.get_records_for_run(
        result.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    assert len(planned) == len(keys)  # one per file, not one per file and asset
    for asset in ("snapshot", "records"):
        assert instance.get_materialized_partitions(AssetKey(asset)) == keys
    for key in keys:
        assert latest_metadata(instance, "snapshot", key)["snapshot_digest"]
