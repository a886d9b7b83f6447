"""Runs whose worker process died are failed, so that run retries redo them.

Dagster's default launcher runs each run in a process that the code server starts (kindex up's
launcher forks it from the run worker, assets/launcher.py), and nothing
notices when that process dies (a killed run worker, or a killed `kindex up` or daemon): the run
stays STARTED forever, run retries never see it fail, and the sensors that wait for runs in
flight wait for good. This sensor finds such runs by the pid each worker logs when it starts and
reports them failed. It acts only under Dagster's default launcher (or kindex up's, derived from
it), whose workers are processes on this host; other launchers (Kubernetes, Docker) watch their
runs themselves.
"""

from __future__ import annotations

from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultRunLauncher,
    DefaultSensorStatus,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from pipelines.forked import pid_alive

# The engine event a run worker logs when it starts: "Started process for run (pid: 1234)."
WORKER_STARTED = "Started process for run (pid: "
LOST_RUNS_INTERVAL_SECONDS = 5


def worker_pids(instance: DagsterInstance, run_id: str) -> list[int]:
    """Pids the run's worker processes logged when they started (a resumed run, one each)."""
    pids = []
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        message = entry.message or ""
        if message.startswith(WORKER_STARTED):
            pids.append(int(message[len(WORKER_STARTED) :].split(")", 1)[0]))
    return pids


def lost_runs(instance: DagsterInstance) -> list[tuple[DagsterRun, int]]:
    """Started runs whose every worker process is gone, each with its last worker's pid. A run
    is re-read once its worker is seen dead: one that finished meanwhile wrote its status
    before its process exited, so it is not taken for lost."""
    lost = []
    for record in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTED])):
        run = record.dagster_run
        pids = worker_pids(instance, run.run_id)
        if not pids or any(pid_alive(pid) for pid in pids):
            continue  # not started yet (the start timeout covers that), or alive
        now = instance.get_run_by_id(run.run_id)
        if now is not None and now.status == DagsterRunStatus.STARTED:
            lost.append((now, pids[-1]))
    return lost


@sensor(
    name="lost_runs_sensor",
    description="Fails runs whose worker process is gone, so that run retries redo them.",
    minimum_interval_seconds=LOST_RUNS_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
)
def lost_runs_sensor(context: SensorEvaluationContext) -> SkipReason:
    instance = context.instance
    if not isinstance(instance.run_launcher, DefaultRunLauncher):  # kindex up's, or Dagster's
        return SkipReason("runs are not processes of this host: their launcher watches them")
    lost = lost_runs(instance)
    for run, pid in lost:
        message = f"the run's worker process (pid {pid}) is gone"
        context.log.warning(f"run {run.run_id}: {message}")
        instance.report_run_failed(run, message)
    return SkipReason(f"{len(lost)} lost runs failed" if lost else "no lost runs")
