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
    DEQUEUE_INTERVAL_SECONDS,
    MAX_CONCURRENT_RUNS,
    MAX_RUN_RETRIES,
    SENSOR_THREADS,
    dagster_instance_yaml,
    remove_up_file,
    write_up_file,
)


def test_instance_yaml_is_accepted_by_dagster(tmp_path: Path) -> None:
    from dagster import DagsterInstance, DefaultRunLauncher

    from assets.launcher import WarmRunLauncher

    (tmp_path / "dagster.yaml").write_text(dagster_instance_yaml(tmp_path), encoding="utf-8")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_coordinator.__class__.__name__ == "QueuedRunCoordinator"
        assert instance.run_coordinator.dequeue_interval_seconds == DEQUEUE_INTERVAL_SECONDS
        # Runs forked from the run worker, and a launcher lost_runs_sensor watches (a default
        # launcher's, assets/lost_runs.py).
        assert type(instance.run_launcher) is WarmRunLauncher
        assert isinstance(instance.run_launcher, DefaultRunLauncher)
        assert instance.run_retries_enabled
        assert instance.run_retries_max_retries == MAX_RUN_RETRIES
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_max_resume_run_attempts == 0
        config = instance.get_settings("concurrency")
        assert config["runs"]["max_concurrent_runs"] == MAX_CONCURRENT_RUNS
        assert config["pools"]["default_limit"] == 1
        sensors = instance.get_settings("sensors")
        assert sensors == {"use_threads": True, "num_workers": SENSOR_THREADS}


def test_a_run_whose_worker_died_is_reported_failed(tmp_path: Path) -> None:
    from dagster import DagsterInstance, DagsterRunStatus, build_sensor_context

    from assets.lost_runs import lost_runs, lost_runs_sensor

    (tmp_path / "dagster.yaml").write_text(dagster_instance_yaml(tmp_path), encoding="utf-8")
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        run = instance.create_run_for_job(job_def=_noop_job(), status=DagsterRunStatus.STARTED)
        finished = instance.create_run_for_job(job_def=_noop_job(), status=DagsterRunStatus.SUCCESS)
        assert lost_runs(instance) == []  # no worker recorded yet: not started
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        for each in (run, finished):
            instance.report_engine_event(f"Started process for run (pid: {worker.pid}).", each)
        assert lost_runs(instance) == []
        worker.kill()
        worker.wait()
        assert [(r.run_id, pid) for r, pid in lost_runs(instance)] == [(run.run_id, worker.pid)]
        skipped = lost_runs_sensor(build_sensor_context(instance=instance))
        assert "1 lost runs failed" in str(skipped)
        failed = instance.get_run_by_id(run.run_id)
        assert failed is not None and failed.status == DagsterRunStatus.FAILURE
        done = instance.get_run_by_id(finished.run_id)
        assert done is not None and done.status == DagsterRunStatus.SUCCESS
        assert lost_runs(instance) == []


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
