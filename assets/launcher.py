"""The run launcher `kindex up` configures: runs start as forks of the run worker that stays up
(assets/run_worker.py), and the default way (the code server spawns a process) where none
answers. A Dagster run launcher named in dagster.yaml, loaded by the daemon and the webserver.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dagster import DagsterRun, DefaultRunLauncher

from assets.run_worker import request_run, socket_path

if TYPE_CHECKING:
    from dagster import DagsterInstance

# The tag that names the pid of a run forked by the run worker.
WORKER_PID_TAG = "kindex/run_worker_pid"


class LaunchContext(Protocol):
    """What this launcher reads of Dagster's launch context."""

    @property
    def dagster_run(self) -> DagsterRun: ...


class WarmRunLauncher(DefaultRunLauncher):
    """Hands each run to the home's run worker; the default launcher's way where it is not up."""

    def _worker_socket(self) -> Path | None:
        home = os.environ.get("DAGSTER_HOME")
        path = socket_path(home) if home else None
        return path if path is not None and path.exists() else None

    def launch_run(self, context: LaunchContext) -> None:
        run = context.dagster_run
        path = self._worker_socket()
        if path is not None:
            try:
                pid = request_run(path, run.run_id)
            except OSError:
                pass  # the worker is gone: the default way
            else:
                self._instance.add_run_tags(run.run_id, {WORKER_PID_TAG: str(pid)})
                return
        super().launch_run(context)  # type: ignore[arg-type]

    def terminate(self, run_id: str) -> bool:
        instance: DagsterInstance = self._instance
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished or WORKER_PID_TAG not in run.tags:
            return bool(super().terminate(run_id))  # type: ignore[no-untyped-call]
        instance.report_run_canceling(run)
        try:
            # Dagster's run command turns SIGINT into a cancelled run (steps interrupted,
            # the run reported CANCELED), as the code server does for its own run processes.
            os.kill(int(run.tags[WORKER_PID_TAG]), signal.SIGINT)
        except ProcessLookupError:
            return False
        return True
