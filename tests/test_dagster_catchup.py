"""The index catch-up sensor: judged from the bucket, it asks for an index run exactly while
record sets wait outside the published index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dagster import AssetKey, DagsterInstance, SensorResult, build_sensor_context
from dagster_support import SensorDriver, execute, materialize_index
from liger_support import HEADER, csv_lines

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
