"""`kindex up` pieces that need no running server: the instance it writes is one Dagster accepts."""

from __future__ import annotations

from pathlib import Path

from pipelines.commands.up import MAX_CONCURRENT_RUNS, dagster_instance_yaml


def test_instance_yaml_is_accepted_by_dagster(tmp_path: Path) -> None:
    from dagster._core.instance.config import dagster_instance_config

    (tmp_path / "dagster.yaml").write_text(dagster_instance_yaml(tmp_path), encoding="utf-8")

    config, _ = dagster_instance_config(str(tmp_path))

    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["concurrency"]["runs"]["max_concurrent_runs"] == MAX_CONCURRENT_RUNS
    assert config["concurrency"]["pools"]["default_limit"] == 1
