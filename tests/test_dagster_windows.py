"""What the Dagster UI shows of arrival windows and checks, in-process on a real bucket: a
window is a partition once files arrived in it (no thousand empty hours to backfill), its
metadata counts every batch of it, a range backfill reports each window's own files, and the
`reprocess_files` job runs the checks like a batch run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dagster import AddDynamicPartitionsRequest, AssetKey, DagsterEventType, DagsterInstance
from dagster_support import (
    WINDOWS,
    SensorDriver,
    backfill_request,
    check_evaluations,
    execute,
    latest_metadata,
)
from index_support import csv_bytes, liger_rows

import definitions
from pipelines.intake.ledger import FileEntry, Ledger, window_of

RECORDS = AssetKey("records")


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def one_row_csv(line: int) -> bytes:
    header, rows = liger_rows([line])
    return csv_bytes(header, rows)


def windows(instance: DagsterInstance) -> list[str]:
    records = definitions.defs.get_repository_def().asset_graph.get(RECORDS)
    assert records.partitions_def is not None
    return list(records.partitions_def.get_partition_keys(dynamic_partitions_store=instance))


def test_a_new_home_has_no_window_and_a_drop_adds_only_its_own(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """A new home has no partition at all, so neither "Missing" nor "All" can launch thousands
    of empty hours; the sensor's tick asks for the window of what arrived, before its run."""
    assert windows(instance) == []
    dropped = s3_store.put_bytes("incoming/one.csv", one_row_csv(2212))

    tick = SensorDriver(instance).tick()

    window = window_of(dropped.last_modified)
    asked = [r for r in tick.dynamic_partitions_requests or []]
    assert len(asked) == 1 and isinstance(asked[0], AddDynamicPartitionsRequest)
    assert list(asked[0].partition_keys) == [window]
    assert windows(instance) == [window]
    assert [r.partition_key for r in tick.run_requests or []] == [window]


def test_a_windows_metadata_counts_every_batch_of_it(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """Two batches in one hour: the window's latest materialization counts both, not the last
    batch alone."""
    driver = SensorDriver(instance)
    first = s3_store.put_bytes("incoming/first.csv", one_row_csv(2212))
    for request in driver.tick().run_requests or []:
        assert execute(instance, request).success
    second = s3_store.put_bytes("incoming/second.csv", one_row_csv(1843))
    (request,) = driver.tick().run_requests or []
    if window_of(first.last_modified) != window_of(second.last_modified):
        pytest.skip("the two drops straddled an hour")

    assert execute(instance, request).success

    meta = latest_metadata(instance, "records", request.partition_key)
    assert meta["files"] == 2 and meta["files_indexed"] == 2 and meta["batches"] == 2
    assert meta["this_run_files"] == 1 and meta["runs"] == 2
    assert {r.data["file"] for r in meta["per_file"].records} == {first.key, second.key}


def test_a_range_backfill_reports_each_windows_own_files(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill of two windows is one run; each window's materialization says what that
    window holds: an hour with no file of the ledger claims none of the other's."""
    empty = "2026-01-01-00:00"  # a window with no file (added first: ranges go in added order)
    instance.add_dynamic_partitions(WINDOWS, [empty])
    driver = SensorDriver(instance)
    dropped = [s3_store.put_bytes(f"incoming/{n}.csv", one_row_csv(2212 + n)) for n in range(3)]
    requests = driver.tick().run_requests or []
    for request in requests:
        assert execute(instance, request).success
    window = window_of(dropped[-1].last_modified)
    if {window_of(d.last_modified) for d in dropped} != {window}:
        pytest.skip("the drops straddled an hour")

    chosen: list[set[str]] = []
    select = Ledger.select

    def spied(ledger: Ledger, **choice: Any) -> list[FileEntry]:
        chosen.append(set(choice["windows"]))
        return select(ledger, **choice)

    monkeypatch.setattr(Ledger, "select", spied)
    run = execute(instance, backfill_request(empty, window))

    assert run.success
    assert chosen == [{empty, window}]  # the ledger's partitions of these windows, no other
    assert latest_metadata(instance, "records", empty)["files"] == 0
    own = latest_metadata(instance, "records", window)
    assert own["files"] == 3 and own["this_run_files"] == 3 and own["files_indexed"] == 3
    # The run's checks, and each window's own.
    evaluations = [
        e.event_specific_data
        for e in run.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
        and e.event_specific_data.asset_key == RECORDS
    ]
    assert {e.partition for e in evaluations if e.check_name == "every_file_processed"} == {
        None,
        empty,
        window,
    }


def test_the_reprocess_job_runs_the_checks_of_each_window_and_reports_the_index(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """`kindex backfill` launches `reprocess_files`: it reports each window it touched with its
    checks (carrying the window), and the index it published with the index's checks."""
    dropped = s3_store.put_bytes("incoming/again.csv", one_row_csv(2212))
    for request in SensorDriver(instance).tick().run_requests or []:
        assert execute(instance, request).success
    window = window_of(dropped.last_modified)
    job = definitions.defs.get_job_def("reprocess_files")

    run = job.execute_in_process(
        instance=instance,
        run_config={"ops": {"reprocess": {"config": {"files": ["incoming/*"]}}}},
    )

    assert run.success
    checks = check_evaluations(run)
    for name in ("every_file_processed", "no_quarantined_rows", "unique_external_ids"):
        assert checks[name].passed and checks[name].partition == window, name
    assert checks["records_match_schemas"].passed
    assert checks["row_counts_match_snapshots"].passed and checks["no_failing_files"].passed
    materialized = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
    ).records
    keys = [r.asset_key for r in materialized]
    assert keys.count(RECORDS) == 1 and keys.count(AssetKey("index")) == 1
    meta = latest_metadata(instance, "records", window)
    assert meta["files"] == 1 and meta["this_run_files"] == 1
    assert latest_metadata(instance, "index")["published_by"] == "reprocess_files"


def test_a_windows_chart_shows_the_extremes_of_many_series() -> None:
    """Per kernel, pass and GPU a window holds hundreds of series: the chart draws the slowest
    and the fastest (the `speedups` table keeps them all)."""
    from assets.files import CHART_MAX_BARS, chart_series

    by_series = {f"k{n} forward on G: p vs b": [0.5 + n / 10] for n in range(CHART_MAX_BARS + 10)}

    shown, title = chart_series(by_series, "2026-12-07-10:00")

    half = CHART_MAX_BARS // 2
    names = sorted(by_series, key=lambda s: by_series[s][0])
    assert set(shown) == {*names[:half], *names[-half:]}
    assert f"of {len(by_series)} series" in title
    few = dict(list(by_series.items())[:3])
    assert chart_series(few, "w")[0] == few
