"""The Dagster assets for real: sensor tick, partition runs, index, checks, against a real
SeaweedFS bucket and a temporary Dagster instance, in-process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from dagster import AssetKey, DagsterInstance
from dagster_support import (
    SensorDriver,
    check_evaluations,
    execute,
    latest_metadata,
    materialize_index,
)
from index_support import LIGER_CSV, csv_bytes, liger_rows, query, s3_requests

from assets import files
from pipelines.cli import main as kindex
from pipelines.intake.ledger import window_of
from pipelines.settings import Settings

LIGER_RUNS = 2448


def kernel_csv(kernel: str) -> tuple[bytes, int]:
    """The shared CSV's rows of one kernel (every GPU, provider and pass: speedups and their
    chart), and how many."""
    header, rows = liger_rows(range(2, LIGER_RUNS + 2))
    chosen = [row for row in rows if row[header.index("kernel_name")] == kernel]
    return csv_bytes(header, chosen), len(chosen)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def test_liger_csv_and_garbage_are_one_batch_run_the_index_and_the_ledger(
    s3_store: Any, instance: DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    liger = s3_store.put_bytes("incoming/liger/all_benchmark_data.csv", LIGER_CSV.read_bytes())
    s3_store.put_bytes("incoming/garbage.bin", os.urandom(4096) + b"\0\xff" * 64)
    driver = SensorDriver(instance)

    tick = driver.tick()

    assert len(tick.run_requests or []) == 1  # both files in one run
    request = (tick.run_requests or [])[0]
    assert request.partition_key == window_of(liger.last_modified)

    run = execute(instance, request)

    assert run.success  # the garbage file does not fail the run of the good one
    meta = latest_metadata(instance, "records", request.partition_key)
    assert meta["files"] == 2 and meta["files_indexed"] == 1 and meta["files_quarantined"] == 1
    assert meta["runs"] == LIGER_RUNS and meta["quarantined_rows"] == 1
    # Speedups per kernel, pass, GPU and provider: B200's forward jsd is slower than torch's,
    # which an average over GPUs and passes hid.
    speedup = {r.data["series"]: r.data["speedup"] for r in meta["speedups"].records}
    assert speedup["jsd forward on NVIDIA B200: liger vs torch"] < 1
    assert speedup["jsd backward on NVIDIA B200: liger vs torch"] > 1
    assert "](data:image/png;base64," in str(meta["speedup_chart"])
    assert "warnings" not in meta
    files = {r.data["file"]: r.data for r in meta["per_file"].records}
    garbage = files["incoming/garbage.bin"]
    assert garbage["state"] == "quarantined" and "unrecognized" in garbage["reason"]
    checks = check_evaluations(run)
    assert not checks["no_quarantined_rows"].passed
    assert checks["every_file_processed"].passed
    assert checks["unique_external_ids"].passed
    assert checks["records_match_schemas"].passed
    assert checks["records_match_schemas"].partition == request.partition_key
    # The batch run published the index: nothing else to run for the file to be queryable.
    settings = Settings.from_env()
    assert query(settings, "select count(*) from runs") == [(LIGER_RUNS,)]
    assert query(settings, "select count(*) from quarantine") == [(1,)]
    assert query(settings, "select key, state, runs from files order by key") == [
        ("incoming/garbage.bin", "quarantined", 0),
        ("incoming/liger/all_benchmark_data.csv", "indexed", LIGER_RUNS),
    ]
    index_run = materialize_index(instance)
    assert check_evaluations(index_run)["row_counts_match_snapshots"].passed
    assert check_evaluations(index_run)["every_version_processed"].passed
    # The garbage file keeps the ledger's check failing after any later publish.
    assert not check_evaluations(index_run)["no_failing_files"].passed
    capsys.readouterr()
    assert kindex(["query", "select count(*) as n from runs", "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["n", str(LIGER_RUNS)]


def test_the_index_is_materialized_by_the_batch_run_that_published_it(
    s3_store: Any, instance: DagsterInstance
) -> None:
    """A batch run publishes the index inside `records`: it records the materialization of
    `index`, of each table people query (schema, row count, Iceberg tables, a query line) and
    the index's checks, so the index never reads "never materialized" while it answers."""
    jsd, jsd_runs = kernel_csv("jsd")
    s3_store.put_bytes("incoming/liger.csv", jsd)
    s3_store.put_bytes("incoming/garbage.bin", b"\0\xff" * 64)
    run = execute(instance, (SensorDriver(instance).tick().run_requests or [])[0])
    assert run.success

    index = latest_metadata(instance, "index")
    assert index["published"] is True and index["published_by"] == "ingest_batch"
    assert index["runs"] == jsd_runs and index["new_runs"] == jsd_runs
    assert index["index_version"] not in ("", "None")
    # One version of one file judges no change: the regressions' top movers show their columns
    # and no row (tests/test_regressions.py ranks real ones).
    top = index["top_movers"]
    assert [c.name for c in top.schema.columns][:3] == ["kernel", "provider", "mode"]
    assert top.records == []
    runs = latest_metadata(instance, "runs")
    assert runs["dagster/row_count"] == jsd_runs
    columns = {c.name for c in runs["dagster/column_schema"].columns}
    assert {"kernel", "provider", "mode", "gpu", "median", "source_key"} <= columns
    assert "`run_segments`: s3://" in runs["iceberg_tables"]
    assert runs["query"].startswith('kindex query "select ')
    assert runs["index_version"] == index["index_version"]
    files = latest_metadata(instance, "files")
    assert files["dagster/row_count"] == 2 and "`file_ledger`" in files["iceberg_tables"]
    assert latest_metadata(instance, "quarantine")["dagster/row_count"] == 1
    speedups = latest_metadata(instance, "speedups")
    assert speedups["dagster/row_count"] > 0 and "`run_segments`" in speedups["iceberg_tables"]
    checks = check_evaluations(run)
    assert checks["row_counts_match_snapshots"].passed
    assert checks["every_version_processed"].passed
    assert checks["incoming_drained"].passed
    failing = checks["no_failing_files"]
    assert not failing.passed
    by_reason = failing.metadata["by_reason"].value.records
    assert [(r.data["state"], r.data["files"]) for r in by_reason] == [("quarantined", 1)]


def test_a_second_tick_without_new_objects_requests_nothing(
    s3_store: Any, instance: DagsterInstance
) -> None:
    s3_store.put_bytes("incoming/a.csv", b"not,a\nliger,file\n")
    driver = SensorDriver(instance)
    assert len(driver.tick().run_requests or []) == 1

    again = driver.tick()

    assert not again.run_requests


def test_a_batch_leaves_the_window_speedups_to_the_one_no_batch_waits_behind(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While batch runs wait for a run slot (a burst), a batch run reports its window without
    the speedups and their chart, which read every batch's runs of the window: the batch that
    finds none waiting draws them, so a burst's batches never wait behind a chart."""
    s3_store.put_bytes("incoming/liger/all_benchmark_data.csv", LIGER_CSV.read_bytes())
    request = (SensorDriver(instance).tick().run_requests or [])[0]
    # One batch run held by the queued coordinator (a queued run needs a code location's
    # origin, which an in-process run has none of): what the run asks the instance.
    queued = [1]
    monkeypatch.setattr(files, "batches_waiting", lambda instance: queued[0])

    assert execute(instance, request).success

    meta = latest_metadata(instance, "records", request.partition_key)
    assert meta["speedups_deferred"] == 1
    assert "speedups" not in meta and "speedup_chart" not in meta and "warnings" not in meta
    assert meta["files_indexed"] == 1 and meta["runs"] == LIGER_RUNS  # the rest is reported
    assert query(Settings.from_env(), "select count(*) from runs") == [(LIGER_RUNS,)]

    queued[0] = 0  # the queue drained
    assert execute(instance, request).success

    meta = latest_metadata(instance, "records", request.partition_key)
    assert "speedups_deferred" not in meta
    assert "](data:image/png;base64," in str(meta["speedup_chart"])


def test_index_materializes_with_no_files(s3_store: Any, instance: DagsterInstance) -> None:
    materialize_index(instance)

    assert query(Settings.from_env(), "select count(*) from runs") == [(0,)]
    assert instance.get_latest_materialization_event(AssetKey("index")) is not None


def before_writing(sent: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The requests before the step's first write of records (the publish lists them after)."""
    writes = [n for n, (action, key) in enumerate(sent) if action == "put" and "records/" in key]
    return sent[: writes[0]] if writes else sent


def test_new_bytes_are_processed_without_looking_up_what_cannot_exist_yet(
    s3_store: Any, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose bytes no snapshot held: its step keeps them and writes their records without
    reading them back, or asking for a read record or a record set of them (neither can exist
    before the snapshot). The same bytes under another key are looked up, and reused."""
    data = csv_bytes(*liger_rows(range(2, 42)))
    s3_store.put_bytes("incoming/first.csv", data)
    driver = SensorDriver(instance)
    sent = s3_requests(monkeypatch)

    assert execute(instance, (driver.tick().run_requests or [])[0]).success

    snapshot = next(key for action, key in sent if action == "copy")
    assert ("get", snapshot) not in sent  # the bytes the step read are the bytes it parsed
    assert not [key for action, key in sent if action == "get" and "/reads/" in key]
    assert ("list", "records/") not in before_writing(sent)  # no record set looked for
    assert [key for action, key in sent if action == "put" and key.endswith("/sets.json")]
    sent.clear()
    kept = s3_store.head(snapshot)
    s3_store.put_bytes("incoming/second.csv", data)

    request = (driver.tick().run_requests or [])[0]
    assert execute(instance, request).success

    # found and reused, from the index and the ledger, not a listing: its read is written
    assert not [key for action, key in sent if action == "list" and key.startswith("records/")]
    assert s3_store.head(snapshot) == kept  # a copy only if none is there: it was not replaced
    written = [key for action, key in sent if action == "put" and key.startswith("records/")]
    assert len(written) == 1 and written[0].endswith("/sets.json")
    second = latest_metadata(instance, "records", request.partition_key)
    # The window's metadata counts both batches of it; this run took one file.
    assert second["files"] == 2 and second["batches"] == 2 and second["this_run_files"] == 1
    assert second["runs"] == 2 * 40
