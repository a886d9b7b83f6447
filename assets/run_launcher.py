"""The run launcher `kindex up` configures: Dagster's default one (a process per run, started by
the code server), which also tells run monitoring whether a run's worker process still lives.

Dagster's default launcher cannot: a run whose worker died with the code server that started it
(a killed `kindex up`, a killed daemon) would stay STARTED forever, and run retries would never
see it fail. With this one, run monitoring fails it, and the run is retried.
"""

from __future__ import annotations

from dagster import DagsterEventType, DagsterRun, DefaultRunLauncher

# Dagster exports no public type for a health check's result; its own launchers (Docker,
# Kubernetes, ECS) import these from here too.
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus

from pipelines.forked import pid_alive

WORKER_STARTED = "Started process for run (pid: "


class WatchedRunLauncher(DefaultRunLauncher):
    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        pids = self._worker_pids(run.run_id)
        if not pids:  # not started yet: the start timeout covers that
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no worker process recorded yet")
        if any(pid_alive(pid) for pid in pids):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(
            WorkerStatus.FAILED, f"the run's worker process (pid {pids[-1]}) is gone"
        )

    def _worker_pids(self, run_id: str) -> list[int]:
        """Pids the run's worker processes recorded when they started (a resumed run, one each)."""
        pids = []
        for entry in self._instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
            message = entry.message or ""
            if message.startswith(WORKER_STARTED):
                pids.append(int(message[len(WORKER_STARTED) :].split(")", 1)[0]))
        return pids
