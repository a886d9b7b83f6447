"""The index catch-up sensor: it looks only once the file ledger moved, and asks for an index run
exactly while record sets wait outside the published index and no run is in flight (a batch run
publishes its own; the catch-up is for one that died in between). The reconcile sensor waits for
runs in flight too."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    SensorResult,
    SkipReason,
    build_sensor_context,
)
from dagster_support import SensorDriver, execute, materialize_index
from index_support import drop_and_process, query
from liger_support import HEADER, csv_lines

from assets.reconcile import reconcile_sensor
from assets.resources import KindexResource
from assets.sensors import batch_of, index_catchup_sensor
from pipelines.ingest import process_batch
from pipelines.intake.ledger import FileState, Ledger
from pipelines.settings import Settings


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def one_row(extra: int = 0) -> bytes:
    (row,) = csv_lines([2212])
    return f"{HEADER}\n{row}\n".encode() + b"\n" * extra


class Catchup:
    """Ticks of the catch-up sensor with its cursor carried, as the daemon does."""

    def __init__(self, instance: DagsterInstance) -> None:
        self.instance = instance
        self.cursor: str | None = None

    def tick(self, cursor: str | None = None) -> SensorResult | SkipReason:
        context = build_sensor_context(
            instance=self.instance,
            cursor=cursor if cursor is not None else self.cursor,
            resources={"kindex": KindexResource()},
        )
        result = index_catchup_sensor(context)
        assert isinstance(result, SensorResult | SkipReason)
        if isinstance(result, SensorResult):
            self.cursor = result.cursor
        return result


def requests(result: SensorResult | SkipReason) -> list[RunRequest]:
    return list(result.run_requests or []) if isinstance(result, SensorResult) else []


def died_before_its_publish(
    s3_store: Any, instance: DagsterInstance, key: str, extra: int = 0
) -> None:
    """A file found by the sensor whose batch wrote its record set and its ledger rows, then
    died before it published the index."""
    s3_store.put_bytes(key, one_row(extra))
    (request,) = SensorDriver(instance).tick().run_requests or []
    batch = batch_of(request)
    settings = Settings.from_env()
    entries = Ledger.of(s3_store, settings).of_batch(batch)
    result = process_batch(s3_store, settings, entries, batch, publish=False)
    assert key in {f.entry.key for f in result.files}
    assert {f.entry.state for f in result.files} == {FileState.INDEXED}


def test_requests_the_index_only_while_record_sets_are_unpublished(
    s3_store: Any, instance: DagsterInstance
) -> None:
    catchup = Catchup(instance)
    assert isinstance(catchup.tick(), SkipReason)  # an empty bucket, no ledger
    s3_store.put_bytes("incoming/one.csv", one_row())
    assert execute(instance, (SensorDriver(instance).tick().run_requests or [])[0]).success

    published = catchup.tick()  # the ledger moved, but the batch run published its files

    assert isinstance(published, SensorResult) and not published.run_requests
    assert isinstance(catchup.tick(), SkipReason)  # nothing moved since

    died_before_its_publish(s3_store, instance, "incoming/two.csv", extra=1)
    before = catchup.cursor
    first = catchup.tick()
    again = catchup.tick(before)  # the same state judged twice (a slow index run)
    (request,) = requests(first)
    assert index_catchup_sensor.job_name == "publish_index"  # the index's own job
    assert [r.run_key for r in requests(again)] == [request.run_key]  # deduplicated

    materialize_index(instance)
    assert query(Settings.from_env(), "select count(*) from snapshots") == [(2,)]
    assert not requests(catchup.tick())  # record sets were waiting: looked once more
    assert isinstance(catchup.tick(), SkipReason)


def test_looks_only_once_the_ledger_moved(s3_store: Any, instance: DagsterInstance) -> None:
    """Record sets reach a publish through the ledger rows that name their sets files, so the
    sensor looks only once the ledger moved: it does not list the bucket on every tick."""
    s3_store.put_bytes("incoming/one.csv", one_row())
    assert execute(instance, (SensorDriver(instance).tick().run_requests or [])[0]).success
    catchup = Catchup(instance)
    assert not requests(catchup.tick())
    assert isinstance(catchup.tick(), SkipReason)  # nothing moved since

    drop_and_process(s3_store, Settings.from_env(), "incoming/two.csv", one_row(1))  # commits

    assert requests(catchup.tick())
    died_before_its_publish(s3_store, instance, "incoming/three.csv", extra=2)  # the ledger moves
    assert requests(catchup.tick())


def test_the_sensors_that_judge_the_bucket_wait_while_runs_are_in_flight(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """While a burst lands, neither the catch-up nor the reconcile sensor lists the bucket or
    asks for anything: the index is published once the runs are done, not on every tick."""
    died_before_its_publish(s3_store, instance, "incoming/one.csv")
    s3_store.put_bytes("incoming/lost.csv", one_row(1))  # never requested
    running = DagsterRun(
        job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED
    )
    instance.add_run(running)

    assert isinstance(Catchup(instance).tick(), SkipReason)
    assert isinstance(reconcile(instance), SkipReason)

    instance.delete_run(running.run_id)
    assert requests(Catchup(instance).tick())
    judged = reconcile(instance)
    assert isinstance(judged, SensorResult)
    assert judged.asset_events  # the missing count is judged again
    (request,) = judged.run_requests or []
    batch = batch_of(request)
    lost = Ledger.of(s3_store, Settings.from_env()).of_batch(batch)
    assert [e.key for e in lost] == ["incoming/lost.csv"]


def reconcile(instance: DagsterInstance) -> SensorResult | SkipReason:
    context = build_sensor_context(instance=instance, resources={"kindex": KindexResource()})
    result = reconcile_sensor(context)
    assert isinstance(result, SensorResult | SkipReason)
    return result
