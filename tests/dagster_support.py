"""Helpers for the Dagster tests: evaluate the sensor like the daemon does, and run what it asks
for in-process against a temporary instance (real assets, real S3, real index)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagster import (
    AddDynamicPartitionsRequest,
    AssetKey,
    DagsterInstance,
    ExecuteInProcessResult,
    RunRequest,
    SensorResult,
    build_sensor_context,
)

import definitions
from assets.partitions import ARRIVAL_WINDOWS
from assets.resources import KindexResource
from assets.sensors import incoming_files_sensor

INDEX = AssetKey("index")
WINDOWS = str(ARRIVAL_WINDOWS.name)


def backfill_request(window: str, last: str | None = None) -> RunRequest:
    """What a backfill of arrival windows from the UI launches: one run of `records` over them."""
    return RunRequest(
        tags={
            "dagster/asset_partition_range_start": window,
            "dagster/asset_partition_range_end": last or window,
        },
    )


def add_partitions(instance: DagsterInstance, result: SensorResult) -> None:
    """What the daemon does with a sensor's partition requests, before its run requests."""
    for request in result.dynamic_partitions_requests or []:
        if isinstance(request, AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(
                request.partitions_def_name, list(request.partition_keys)
            )


class SensorDriver:
    """Ticks of the incoming-files sensor with the cursor carried between them, as the daemon
    does (the windows it asks for become partitions)."""

    def __init__(self, instance: DagsterInstance) -> None:
        self.instance = instance
        self.cursor: str | None = None

    def tick(self) -> SensorResult:
        context = build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            resources={"kindex": KindexResource()},
        )
        result = incoming_files_sensor(context)
        assert isinstance(result, SensorResult)
        add_partitions(self.instance, result)
        self.cursor = result.cursor
        return result


def execute(
    instance: DagsterInstance, request: RunRequest, job_name: str = "ingest_batch"
) -> ExecuteInProcessResult:
    """What the daemon launches for one run request of a job, in this process. The request's
    window is a partition already, as the daemon adds it from the sensor's result before the
    run (tests that call a sensor themselves rely on this)."""
    job = definitions.defs.resolve_job_def(job_name)
    if request.partition_key and not instance.has_dynamic_partition(WINDOWS, request.partition_key):
        instance.add_dynamic_partitions(WINDOWS, [request.partition_key])
    return job.execute_in_process(
        instance=instance,
        partition_key=request.partition_key,
        run_config=request.run_config or None,
        tags=dict(request.tags),
        raise_on_error=False,
    )


def execute_all(instance: DagsterInstance, requests: Sequence[RunRequest]) -> None:
    for request in requests:
        result = execute(instance, request)
        assert result.success, failure_messages(result)


def materialize_index(instance: DagsterInstance) -> ExecuteInProcessResult:
    job = definitions.defs.resolve_job_def("publish_index")
    result = job.execute_in_process(instance=instance)
    assert result.success
    return result


def failure_messages(result: ExecuteInProcessResult) -> str:
    return "\n".join(
        str(event.event_specific_data) for event in result.all_events if event.is_step_failure
    )


def check_evaluations(result: ExecuteInProcessResult) -> dict[str, Any]:
    """The run's asset check evaluations by check name."""
    return {
        event.event_specific_data.check_name: event.event_specific_data
        for event in result.all_events
        if event.event_type_value == "ASSET_CHECK_EVALUATION"
    }


def latest_metadata(
    instance: DagsterInstance, asset: str, partition: str | None = None
) -> dict[str, Any]:
    """The metadata values of the newest materialization of an asset (of one partition)."""
    from dagster import AssetRecordsFilter

    records = instance.fetch_materializations(
        AssetRecordsFilter(
            asset_key=AssetKey(asset), asset_partitions=[partition] if partition else None
        ),
        limit=1,
    ).records
    assert records, f"no materialization of {asset} {partition}"
    materialization = records[0].asset_materialization
    assert materialization is not None
    return {name: value.value for name, value in materialization.metadata.items()}
