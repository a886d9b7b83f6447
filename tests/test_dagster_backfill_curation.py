"""After the curation grows (a new GPU), backfilling a file turns its quarantine rows into runs,
and the index follows: the Dagster assets for real, in-process, on a real SeaweedFS bucket."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance
from dagster_support import SensorDriver, backfill_request, execute, materialize_index
from index_support import query
from liger_support import HEADER, csv_lines

from pipelines.curation import CURATION_DIR_VARIABLE, CURATION_FILES
from pipelines.settings import Settings

NEW_GPU = "NVIDIA H20"  # a real GPU the curation does not know (yet)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


@pytest.fixture
def curation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A maintainer's copy of the curation, which this process reads from now on."""
    folder = tmp_path / "curation"
    folder.mkdir()
    packaged = resources.files("pipelines.curation")
    for name in CURATION_FILES:
        (folder / name).write_text(packaged.joinpath(name).read_text(encoding="utf-8"))
    monkeypatch.setenv(CURATION_DIR_VARIABLE, str(folder))
    return folder


def test_backfill_after_a_new_gpu_turns_quarantine_into_runs(
    s3_store: Any, instance: DagsterInstance, curation: Path
) -> None:
    known, unknown = csv_lines([2212, 1843])
    h200_row = unknown.replace("NVIDIA B200", NEW_GPU)
    s3_store.put_bytes("incoming/h200.csv", f"{HEADER}\n{known}\n{h200_row}\n".encode())
    driver = SensorDriver(instance)
    tick = driver.tick()
    assert execute(instance, (tick.run_requests or [])[0]).success
    materialize_index(instance)
    settings = Settings.from_env()
    assert query(settings, "select count(*) from runs") == [(1,)]
    assert query(settings, "select reason, source_line from quarantine") == [("unknown_gpu", 3)]

    gpus = curation / "gpus.yaml"
    gpus.write_text(
        gpus.read_text()
        + f"  {NEW_GPU}: {{vendor: nvidia, product: NVIDIA H20, architecture: sm_90,"
        + " title: H20}\n"
    )
    (partition,) = driver.partition_keys()
    assert execute(instance, backfill_request(partition)).success
    materialize_index(instance)

    assert query(settings, "select count(*) from quarantine") == [(0,)]
    rows = query(settings, "select gpu, architecture, source_line from runs order by source_line")
    assert rows == [("NVIDIA B200", "sm_100", 2), (NEW_GPU, "sm_90", 3)]
    assert not driver.tick().run_requests  # the backfill is not mistaken for a new drop


def test_unchanged_curation_reuses_the_record_set(
    s3_store: Any, instance: DagsterInstance, curation: Path
) -> None:
    (row,) = csv_lines([2212])
    s3_store.put_bytes("incoming/one.csv", f"{HEADER}\n{row}\n".encode())
    driver = SensorDriver(instance)
    assert execute(instance, (driver.tick().run_requests or [])[0]).success
    before = sorted(o.key for o in s3_store.list("records/"))
    (partition,) = driver.partition_keys()
    assert execute(instance, backfill_request(partition)).success
    assert sorted(o.key for o in s3_store.list("records/")) == before
    shutil.rmtree(curation)  # later tests read the packaged curation again
