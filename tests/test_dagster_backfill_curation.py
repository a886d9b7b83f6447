"""After the curation grows (a new GPU), backfilling a file (its arrival window from the UI, or
the `reprocess_files` job by glob) turns its uncurated runs into curated ones, and the index
follows: the Dagster assets for real, in-process, on a real SeaweedFS bucket."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance
from dagster_support import SensorDriver, backfill_request, execute, latest_metadata
from index_support import NEW_GPU, add_new_gpu, curation, query
from liger_support import HEADER, csv_lines

import definitions
from pipelines.settings import Settings

__all__ = ["curation"]  # the fixture, imported for pytest


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def backfill(instance: DagsterInstance, window: str, how: str) -> None:
    if how == "window":  # a backfill of the arrival window from the UI
        run = execute(instance, backfill_request(window))
    else:  # `kindex backfill 'incoming/*'`
        job = definitions.defs.get_job_def("reprocess_files")
        run = job.execute_in_process(
            instance=instance,
            run_config={"ops": {"reprocess": {"config": {"files": ["incoming/*"]}}}},
        )
    assert run.success


def rows_of(settings: Settings, view: str) -> list[tuple[Any, ...]]:
    return query(
        settings, f"select gpu, architecture, source_line from {view} order by source_line"
    )


@pytest.mark.parametrize("how", ["window", "reprocess_files"])
def test_backfill_after_a_new_gpu_turns_uncurated_runs_into_curated_ones(
    s3_store: Any, instance: DagsterInstance, curation: Path, how: str
) -> None:
    known, unknown = csv_lines([2212, 1843])
    new_row = unknown.replace("NVIDIA B200", NEW_GPU)
    s3_store.put_bytes("incoming/new-gpu.csv", f"{HEADER}\n{known}\n{new_row}\n".encode())
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []
    assert execute(instance, request).success
    settings = Settings.from_env()
    # A curation gap is no quarantine: the row is a run of an uncurated GPU, nothing guessed.
    assert query(settings, "select count(*) from quarantine") == [(0,)]
    rows = query(settings, "select gpu, architecture, source_line from runs order by source_line")
    assert rows == [("NVIDIA B200", "sm_100", 2), (NEW_GPU, "unspecified", 3)]
    assert query(settings, "select state, runs, quarantined from files") == [("indexed", 2, 0)]
    (uncurated,) = query(settings, f"select run_digest from runs where gpu = '{NEW_GPU}'")

    add_new_gpu(curation)
    backfill(instance, str(request.partition_key), how)

    # The backfill published the index: nothing else to run. The file's current record set
    # (its lineage) holds the curated run of line 3.
    assert query(settings, "select count(*) from quarantine") == [(0,)]
    current = """select r.gpu, r.architecture, l.source_line from lineage l
                 join runs r using (run_digest) order by l.source_line"""
    assert query(settings, current) == [("NVIDIA B200", "sm_100", 2), (NEW_GPU, "sm_75", 3)]
    # The uncurated run left the index: runs and its views hold the curated run only.
    assert rows_of(settings, "runs") == [("NVIDIA B200", "sm_100", 2), (NEW_GPU, "sm_75", 3)]
    assert rows_of(settings, "latest_runs") == rows_of(settings, "runs")
    for view in ("runs", "latest_runs", "speedups"):
        digests = query(settings, f"select run_digest from {view}")
        assert uncurated not in digests, view
    assert query(settings, "select state, runs, quarantined, attempts from files") == [
        ("indexed", 2, 0, 2)
    ]
    meta = latest_metadata(instance, "records", request.partition_key)
    assert meta["files"] == 1 and meta["runs"] == 2 and meta["quarantined_rows"] == 0
    assert not driver.tick().run_requests  # the backfill is not mistaken for a new drop


def test_unchanged_curation_reuses_the_record_set(
    s3_store: Any, instance: DagsterInstance, curation: Path
) -> None:
    (row,) = csv_lines([2212])
    s3_store.put_bytes("incoming/one.csv", f"{HEADER}\n{row}\n".encode())
    driver = SensorDriver(instance)
    (request,) = driver.tick().run_requests or []
    assert execute(instance, request).success
    before = sorted(o.key for o in s3_store.list("records/"))
    backfill(instance, str(request.partition_key), "window")
    assert sorted(o.key for o in s3_store.list("records/")) == before
    assert query(Settings.from_env(), "select count(*) from runs") == [(1,)]
    shutil.rmtree(curation)  # later tests read the packaged curation again
