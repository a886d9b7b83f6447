"""Helpers for the Dagster tests: evaluate the sensor like the daemon does, and run what it asks
for in-process against a temporary instance (real assets, real S3, real index)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetKey,
    DagsterInstance,
    ExecuteInProcessResult,
    RunRequest,
    SensorResult,
    build_sensor_context,
)

import definitions
from assets.resources import KindexResource
from assets.sensors import incoming_files_sensor

INDEX = AssetKey("index")


def backfill_request(window: str, last: str | None = None) -> RunRequest:
    """What a backfill of arrival windows from the UI launches: one run of `records` over them."""
    return RunRequest(
        asset_selection=[AssetKey("records")],
        tags={
            "dagster/asset_partition_range_start": window,
            "dagster/asset_partition_range_end": last or window,
        },
    )


class SensorDriver:
    """Ticks of the incoming-files sensor with the cursor carried between them, as the daemon
    does."""

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
        self.cursor = result.cursor
        return result


def execute(instance: DagsterInstance, request: RunRequest) -> ExecuteInProcessResult:
    """What the daemon launches for one run request, in this process."""
    job = definitions.defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(
        instance=instance,
        asset_selection=list(request.asset_selection or []),
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
    job = definitions.defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, asset_selection=[INDEX])
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
