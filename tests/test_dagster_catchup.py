"""The index catch-up sensor: judged from the bucket, it asks for an index run exactly while
record sets wait outside the published index and no run is in flight (the reconcile sensor
waits for runs in flight too)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    SensorResult,
    build_sensor_context,
)
from dagster_support import SensorDriver, execute, materialize_index
from liger_support import HEADER, csv_lines

from assets.reconcile import reconcile_sensor
from assets.resources import KindexResource
from assets.sensors import index_catchup_sensor


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def catchup(instance: DagsterInstance) -> SensorResult:
    context = build_sensor_context(instance=instance, resources={"kindex": KindexResource()})
    result = index_catchup_sensor(context)
    assert isinstance(result, SensorResult)
    return result


def test_requests_the_index_only_while_record_sets_are_unpublished(
    s3_store: Any, instance: DagsterInstance
) -> None:
    assert not catchup(instance).run_requests  # an empty bucket
    (row,) = csv_lines([2212])
    s3_store.put_bytes("incoming/one.csv", f"{HEADER}\n{row}\n".encode())
    driver = SensorDriver(instance)
    assert execute(instance, (driver.tick().run_requests or [])[0]).success

    first, again = catchup(instance), catchup(instance)
    (request,) = first.run_requests or []
    assert request.asset_selection == [AssetKey("index")]
    assert [r.run_key for r in again.run_requests or []] == [request.run_key]  # deduplicated

    materialize_index(instance)
    assert not catchup(instance).run_requests


def test_the_sensors_that_judge_the_bucket_wait_while_runs_are_in_flight(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """While a burst lands, neither the catch-up nor the reconcile sensor lists the bucket or
    asks for anything: the index is published once the runs are done, not on every tick."""
    (row,) = csv_lines([2212])
    s3_store.put_bytes("incoming/one.csv", f"{HEADER}\n{row}\n".encode())
    driver = SensorDriver(instance)
    assert execute(instance, (driver.tick().run_requests or [])[0]).success
    s3_store.put_bytes("incoming/lost.csv", f"{HEADER}\n{row}\n".encode())  # never requested
    running = DagsterRun(
        job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED
    )
    instance.add_run(running)

    assert not catchup(instance).run_requests
    waiting = reconcile(instance)
    assert not waiting.run_requests and not waiting.asset_events

    instance.delete_run(running.run_id)
    assert catchup(instance).run_requests
    assert reconcile(instance).asset_events  # the missing count is judged again


def reconcile(instance: DagsterInstance) -> SensorResult:
    context = build_sensor_context(instance=instance, resources={"kindex": KindexResource()})
    result = reconcile_sensor(context)
    assert isinstance(result, SensorResult)
    return result
