"""Nothing falls through unseen: the bucket-state invariant (pipelines/intake/reconcile.py) and the
reconcile sensor that requests missing versions again with backoff, on real S3 and Dagster;
and the snapshot lookup that replaced a Dagster query bounded at 10,000 records."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context
from dagster_support import SensorDriver, check_evaluations, execute, materialize_index
from index_support import query
from liger_support import HEADER, csv_lines

import assets.files
import assets.reconcile
from assets.reconcile import reconcile_sensor
from assets.resources import KindexResource
from pipelines.intake.reconcile import reconcile, snapshots_of_versions
from pipelines.intake.sensor_cursor import ObjectVersionRef
from pipelines.intake.snapshots import take_snapshot
from pipelines.settings import Settings

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


def test_the_invariant_holds_after_processing_a_long_key_garbage_and_a_csv(
    s3_store: Any, instance: DagsterInstance
) -> None:
    key = long_key()
    assert len(key.encode()) == 999
    s3_store.put_bytes(key, one_row_csv())
    s3_store.put_bytes("incoming/short.csv", one_row_csv(1))
    s3_store.put_bytes("incoming/garbage.bin", os.urandom(2048))
    settings = Settings.from_env()

    before = reconcile(s3_store, settings)
    assert before.objects == 3 and before.missing_count == 3
    assert not any(m.has_snapshot for m in before.missing)
    take_snapshot(s3_store, settings, "incoming/short.csv")  # read, not processed yet
    halfway = {m.info.key: m.has_snapshot for m in reconcile(s3_store, settings).missing}
    assert halfway == {key: False, "incoming/short.csv": True, "incoming/garbage.bin": False}

    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []
    assert execute(instance, request).success  # the long key fails no one, itself included
    index_run = materialize_index(instance)

    assert reconcile(s3_store, settings).missing_count == 0
    assert check_evaluations(index_run)["every_version_processed"].passed
    assert all(len(o.key.encode()) <= S3_KEY_LIMIT for o in s3_store.list(""))
    assert query(settings, f"select runs from snapshots where source_key = '{key}'") == [(1,)]
    assert query(settings, "select reason from quarantine") == [("unrecognized_format",)]


def reconcile_tick(instance: DagsterInstance, cursor: str | None) -> SensorResult:
    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"kindex": KindexResource()}
    )
    result = reconcile_sensor(context)
    assert isinstance(result, SensorResult)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def observed_missing(result: SensorResult) -> list[int]:
    return [int(e.metadata["missing_versions"].value) for e in result.asset_events or []]


def test_the_sensor_requests_what_fell_through_and_backs_off_from_a_failing_file(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [time.time()]
    monkeypatch.setattr(assets.reconcile, "clock", lambda: now[0])
    # Neither file was ever given a run (the incoming sensor never saw them).
    s3_store.put_bytes("incoming/lost.csv", one_row_csv())
    s3_store.put_bytes("incoming/doomed.csv", one_row_csv(1))
    real = assets.files.process_snapshot

    def doomed(store: Any, settings: Any, snap: Any, taken: Any = None) -> Any:
        if snap.key == "incoming/doomed.csv":
            raise RuntimeError("this file fails every time")
        return real(store, settings, snap, taken)

    monkeypatch.setattr(assets.files, "process_snapshot", doomed)

    first = reconcile_tick(instance, None)
    assert not first.run_requests  # within the grace period: maybe on its way
    assert observed_missing(first) == [2]

    now[0] += assets.reconcile.GRACE_SECONDS + 1
    second = reconcile_tick(instance, first.cursor)
    (request,) = second.run_requests or []  # both files, one run
    partitions = set(instance.get_dynamic_partitions("incoming_files"))
    assert len(partitions) == 2
    assert {request.tags[f"dagster/asset_partition_range_{end}"] for end in ("start", "end")} == (
        partitions
    )
    assert not observed_missing(second)  # unchanged count: no new event
    execute(instance, request)

    third = reconcile_tick(instance, second.cursor)
    assert observed_missing(third) == [1]  # the lost file landed
    assert not third.run_requests  # the doomed one waits out its backoff
    now[0] += assets.reconcile.MAX_BACKOFF_SECONDS * 1.3
    fourth = reconcile_tick(instance, third.cursor)
    (again,) = fourth.run_requests or []
    assert again.run_key != request.run_key  # a new attempt, not a repeat
    assert "doomed" in again.tags["dagster/asset_partition_range_start"]

    monkeypatch.setattr(assets.files, "process_snapshot", real)
    execute(instance, again)
    assert observed_missing(reconcile_tick(instance, fourth.cursor)) == [0]


def test_snapshot_lookup_of_more_versions_than_dagster_returns_records(s3_store: Any) -> None:
    settings = Settings.from_env()
    dropped = [s3_store.put_bytes(f"incoming/f{i}.csv", one_row_csv(i)) for i in range(3)]
    for info in dropped:
        take_snapshot(s3_store, settings, info.key)
    refs = [ObjectVersionRef(info.key, info.etag[:8]) for info in dropped]
    never_read = [ObjectVersionRef(f"incoming/n{i:05d}.csv", "0123abcd") for i in range(10_050)]

    started = time.monotonic()
    found = snapshots_of_versions(s3_store, settings, [*never_read, *refs])

    assert set(found) == set(refs)
    assert {found[r].key for r in refs} == {info.key for info in dropped}
    print(f"\nlookup of {len(never_read) + 3} versions: {time.monotonic() - started:.2f} s")
