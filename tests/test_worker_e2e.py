"""A worker's bundle through the Dagster path: `kindex put`, the incoming-files sensor, the
partition run and the index asset, in-process against real SeaweedFS (the daemon's part is played
by tests/dagster_support.py). A hostile file in the same tick does not stop it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bundle_support import billion_laughs
from dagster import DagsterInstance
from dagster_support import SensorDriver, execute, materialize_index
from index_support import query
from test_worker import numpy_statistics, writer_with_two_runs

from pipelines.cli import main as kindex
from pipelines.settings import Settings
from pipelines.worker import capture_environment


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def test_writer_bundle_put_while_the_sensor_runs_reaches_the_index(
    s3_store: Any, instance: DagsterInstance, tmp_path: Path
) -> None:
    writer, all_samples = writer_with_two_runs()
    bundle = tmp_path / "worker-results.yaml"
    writer.write(str(bundle))
    hostile = tmp_path / "laughs.yaml"
    hostile.write_bytes(billion_laughs())
    assert kindex(["put", str(bundle), str(hostile)]) == 0
    driver = SensorDriver(instance)

    tick = driver.tick()

    requests = tick.run_requests or []
    assert sum(int(r.tags["kindex/files"]) for r in requests) == 2
    for request in requests:
        assert execute(instance, request).success
    materialize_index(instance)
    settings = Settings.from_env()
    columns = "samples, median, mean, p05, p95, minimum, maximum, mad, ci95_low, ci95_high"
    indexed = query(
        settings,
        f"SELECT {columns}, origin, source_key, software FROM runs ORDER BY median",
    )
    software = capture_environment()["spec"]["software"]
    assert len(indexed) == len(all_samples) == 2
    for row, samples in zip(indexed, all_samples, strict=True):
        assert row[:10] == numpy_statistics(samples)
        assert (row[10], row[11]) == ("measured", "incoming/worker-results.yaml")
        assert json.loads(row[12]) == software
    assert query(settings, "SELECT source_key, reason FROM quarantine") == [
        ("incoming/laughs.yaml", "too_many_aliases")
    ]
