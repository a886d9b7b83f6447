"""The run worker that stays up (assets/run_worker.py) and the launcher that hands it runs
(assets/launcher.py): a run it is given runs to success in a fork of it, with the pid the lost
runs sensor watches; a launch without a worker falls back to Dagster's default way."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assets.run_worker import MAX_SOCKET_PATH, request_run, socket_path
from pipelines.commands.up import dagster_instance_yaml

JOB_MODULE = """
from dagster import in_process_executor, job, op

@op
def touch() -> None:
    import os, pathlib
    pathlib.Path(os.environ["TOUCHED"]).write_text(str(os.getpid()))

@job(executor_def=in_process_executor)  # as kindex's definitions: the step in the run's process
def touch_job() -> None:
    touch()
"""


def test_a_socket_path_too_long_is_none(tmp_path: Path) -> None:
    assert socket_path(tmp_path) == tmp_path / "run-worker.sock"
    assert socket_path(tmp_path / ("d" * MAX_SOCKET_PATH)) is None


@pytest.mark.slow  # a worker process of its own, importing dagster, and a run
def test_the_worker_runs_a_run_in_a_fork_of_itself(tmp_path: Path) -> None:
    from dagster import DagsterInstance, DagsterRunStatus, reconstructable

    from assets.lost_runs import worker_pids

    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_instance_yaml(tmp_path), encoding="utf-8")
    (tmp_path / "touch_module.py").write_text(JOB_MODULE, encoding="utf-8")
    touched = tmp_path / "touched"
    env = {**os.environ, "DAGSTER_HOME": str(home), "TOUCHED": str(touched)}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    worker = subprocess.Popen(
        [sys.executable, "-m", "assets.run_worker", "touch_module"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert worker.stdout is not None
        assert b"ready" in worker.stdout.readline(), "the worker did not start"
        sys.path.insert(0, str(tmp_path))
        try:
            import touch_module

            recon = reconstructable(touch_module.touch_job)
        finally:
            sys.path.remove(str(tmp_path))
        with DagsterInstance.from_config(str(home)) as instance:
            run = instance.create_run_for_job(
                job_def=touch_module.touch_job, job_code_origin=recon.get_python_origin()
            )
            path = socket_path(home)
            assert path is not None
            pid = request_run(path, run.run_id)
            assert pid != worker.pid
            deadline = time.monotonic() + 60
            while True:
                done = instance.get_run_by_id(run.run_id)
                assert done is not None
                if done.is_finished:
                    break
                assert time.monotonic() < deadline, "the run did not finish"
                time.sleep(0.2)
            assert done.status == DagsterRunStatus.SUCCESS
            assert touched.read_text() == str(pid)  # in the fork, not a process of its own
            assert worker_pids(instance, run.run_id) == [pid]
            with pytest.raises(OSError, match="did not start"):
                request_run(path, "")  # no run named: refused, and the worker stays
            assert worker.poll() is None
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert not (home / "run-worker.sock").exists()


def test_a_request_without_a_worker_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        request_run(tmp_path / "run-worker.sock", "some-run")
