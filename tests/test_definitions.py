"""The Dagster definitions load, validate and pass `dg check defs`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DefaultSensorStatus, Definitions, DynamicPartitionsDefinition

ROOT = Path(__file__).resolve().parents[1]

# The asset graph as the UI draws it: each asset's parents, kinds, checks and whether it is
# partitioned by arrival window. A change here is a change people see: update it on purpose.
ASSET_GRAPH = {
    "records": ([], ["parquet", "s3"], True, [
        "every_file_processed", "no_quarantined_rows", "records_match_schemas",
        "unique_external_ids",
    ]),
    "index": (["records"], ["duckdb", "iceberg", "s3"], False, [
        "every_version_processed", "incoming_drained", "no_failing_files",
        "row_counts_match_snapshots",
    ]),
    "runs": (["index"], ["duckdb", "iceberg"], False, []),
    "quarantine": (["index"], ["duckdb", "iceberg"], False, []),
    "latest_runs": (["index"], ["duckdb", "iceberg"], False, []),
    "speedups": (["index"], ["duckdb", "iceberg"], False, []),
    "regressions": (["index"], ["duckdb", "iceberg"], False, []),
    "files": (["records"], ["duckdb", "iceberg"], False, []),
}  # fmt: skip


def test_definitions_load_and_validate() -> None:
    import definitions

    Definitions.validate_loadable(definitions.defs)
    repo = definitions.defs.get_repository_def()
    graph = repo.asset_graph
    index = graph.get(AssetKey("index"))
    assert index.pools == {"kindex_index"}
    records = graph.get(AssetKey("records"))
    # Partitions are the hours that hold files: their number grows with time, never with files.
    assert isinstance(records.partitions_def, DynamicPartitionsDefinition)
    policy = records.backfill_policy
    assert policy is not None and policy.max_partitions_per_run is None  # single run
    for key in ("records", "index"):  # transient faults are retried, with backoff
        retry = definitions.defs.resolve_assets_def(key).op.retry_policy
        assert retry is not None and retry.max_retries >= 2 and retry.backoff is not None
    checks = {k.name for k in graph.asset_check_keys}
    assert checks >= {
        "every_file_processed",
        "no_quarantined_rows",
        "unique_external_ids",
        "records_match_schemas",
        "row_counts_match_snapshots",
        "every_version_processed",
    }
    sensors = {s.name: s for s in repo.sensor_defs}
    assert set(sensors) == {
        "incoming_files_sensor",
        "ledger_sensor",
        "index_catchup_sensor",
        "reconcile_sensor",
        "lost_runs_sensor",
    }
    for sensor in sensors.values():
        assert sensor.default_status == DefaultSensorStatus.RUNNING
    # Named jobs: the sensors' runs are never Dagster's anonymous __ASSET_JOB.
    targets = {s.name: s.job_name for s in repo.sensor_defs if s.has_jobs}
    assert targets == {
        "incoming_files_sensor": "ingest_batch",
        "ledger_sensor": "ingest_batch",
        "reconcile_sensor": "ingest_batch",
        "index_catchup_sensor": "publish_index",
    }
    # The launchpad's job for a glob or a list of keys.
    job = definitions.defs.get_job_def("reprocess_files")
    assert "files" in job.graph.node_named("reprocess").definition.config_schema.config_type.fields


def test_the_asset_graph_is_what_people_see() -> None:
    """A snapshot of the asset graph, and the conventions on every asset: an owner, kinds that
    match what is stored, a description; a code version on the assets kindex computes."""
    import definitions

    graph = definitions.defs.get_repository_def().asset_graph
    checks: dict[str, list[str]] = {}
    for key in graph.asset_check_keys:
        checks.setdefault(key.asset_key.to_user_string(), []).append(key.name)
    seen = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        name = key.to_user_string()
        seen[name] = (
            sorted(p.to_user_string() for p in node.parent_keys),
            sorted(node.kinds),
            node.partitions_def is not None,
            sorted(checks.get(name, [])),
        )
        assert node.owners == ["team:kindex"], name
        assert node.description, name
        if node.is_materializable:
            assert node.code_version, name
    assert seen == ASSET_GRAPH


# A process that loads the whole project (seconds of CPU): the full run's. The default run
# loads and validates the same Definitions in-process (test_definitions_load_and_validate).
@pytest.mark.slow
def test_dg_check_defs_passes() -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dg"), "check", "defs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_the_resource_shows_each_setting_as_an_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every KINDEX_* setting is a field of KindexResource; those set in the environment are
    EnvVars (the UI shows the variable's name), and the settings the assets use follow them."""
    from dagster import EnvVar

    from assets.resources import KindexResource
    from pipelines.settings import SETTING_NAMES

    assert set(KindexResource.model_fields) == {name.lower() for name in SETTING_NAMES}
    monkeypatch.setenv("KINDEX_BUCKET", "team-bucket")
    monkeypatch.setenv("KINDEX_CATALOG_URI", "sqlite:////tmp/kindex-catalog.db")
    monkeypatch.delenv("KINDEX_INDEX_PREFIX", raising=False)
    declared = KindexResource.from_env()
    assert isinstance(declared.bucket, EnvVar) and declared.bucket.env_var_name == "KINDEX_BUCKET"
    assert declared.index_prefix is None
    resource = declared.process_config_and_initialize()  # as a run resolves it
    assert resource.bucket == "team-bucket"
    assert resource.settings.bucket == "team-bucket"
    assert resource.settings.catalog_uri == "sqlite:////tmp/kindex-catalog.db"
