"""`kindex up` pieces that need no running server: the instance it writes is one Dagster accepts,
with failed runs retried and dead run workers noticed; up.json is written atomically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.commands.up import (
    MAX_CONCURRENT_RUNS,
    MAX_RUN_RETRIES,
    dagster_instance_yaml,
    remove_up_file,
    write_up_file,
)


def test_instance_yaml_is_accepted_by_dagster(tmp_path: Path) -> None:
    from dagster import DagsterInstance

    from assets.run_launcher import WatchedRunLauncher

    (tmp_path / "dagster.yaml").write_text(dagster_instance_yaml(tmp_path), encoding="utf-8")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_coordinator.__class__.__name__ == "QueuedRunCoordinator"
        assert isinstance(instance.run_launcher, WatchedRunLauncher)
        assert instance.run_launcher.supports_check_run_worker_health
        assert instance.run_retries_enabled
        assert instance.run_retries_max_retries == MAX_RUN_RETRIES
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_max_resume_run_attempts == 0
        config = instance.get_settings("concurrency")
        assert config["runs"]["max_concurrent_runs"] == MAX_CONCURRENT_RUNS
        assert config["pools"]["default_limit"] == 1


def test_a_dead_run_worker_is_reported_failed(tmp_path: Path) -> None:
    from dagster import DagsterInstance, DagsterRunStatus

    (tmp_path / "dagster.yaml").write_text(dagster_instance_yaml(tmp_path), encoding="utf-8")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        run = instance.create_run_for_job(job_def=_noop_job(), status=DagsterRunStatus.STARTED)
        launcher = instance.run_launcher
        assert launcher.check_run_worker_health(run).status.value == "RUNNING"  # none recorded
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        instance.report_engine_event(f"Started process for run (pid: {worker.pid}).", run)
        assert launcher.check_run_worker_health(run).status.value == "RUNNING"
        worker.kill()
        worker.wait()
        result = launcher.check_run_worker_health(run)
        assert result.status.value == "FAILED" and str(worker.pid) in str(result.msg)


def _noop_job():  # type: ignore[no-untyped-def]
    from dagster import job, op

    @op
    def noop() -> None:
        pass

    @job
    def noop_job() -> None:
        noop()

    return noop_job


def test_up_file_is_replaced_atomically_and_removed_by_its_writer(tmp_path: Path) -> None:
    path = write_up_file(tmp_path, "http://127.0.0.1:3123")
    assert json.loads(path.read_text()) == {"url": "http://127.0.0.1:3123", "pid": os.getpid()}
    assert [p.name for p in tmp_path.iterdir()] == ["up.json"]  # no temporary file left
    path.write_text(json.dumps({"url": "http://127.0.0.1:1", "pid": os.getpid() + 1}))
    remove_up_file(tmp_path)  # another `kindex up`'s file: kept
    assert path.exists()
    write_up_file(tmp_path, "http://127.0.0.1:3123")
    remove_up_file(tmp_path)
    assert not path.exists()


def test_up_help_names_what_a_user_sets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--help"])
    text = capsys.readouterr().out
    for needed in ("--port", "KINDEX_HOME", "KINDEX_S3_PORT", "KINDEX_S3_ENDPOINT", "Ctrl-C"):
        assert needed in text
    assert "process group" not in text and "PDEATHSIG" not in text
