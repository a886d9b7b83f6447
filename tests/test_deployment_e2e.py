"""deploy/dagster.yaml run for real: PostgreSQL storage, the queued run coordinator with runs in
parallel, the code location served over gRPC (as the Helm values serve it), the daemon and the
webserver, all on 127.0.0.1 and kindex's S3 (the session's SeaweedFS).

Two Liger files dropped into incoming/ both reach the index; their runs went through the queue
and ran at the same time; storage is in PostgreSQL; every process stops on its signal."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus
from deployment_support import PostgresServer, grpc_server_serving, postgres_bin_dir
from process_support import (
    HOST,
    Processes,
    free_port,
    graphql,
    port_is_free,
    sensor_ticked,
    tick_in_progress,
    wait_for,
)
from test_engines import POLARS_COUNTS, run_python

from assets.reconcile import reconcile_sensor
from pipelines.index.catalog import s3_access
from pipelines.index.engines import engine_snippet
from pipelines.index.faults import DIR_ENV, PAUSE_ENV, RECORD_FILES_WRITTEN
from pipelines.index.local import open_index, sync_local
from pipelines.settings import Settings
from pipelines.storage.s3 import S3Store

ROOT = Path(__file__).resolve().parents[1]
DAGSTER_YAML = ROOT / "deploy" / "dagster.yaml"
LIGER_CSV = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
ROWS_PER_FILE = 30
LOCATION = "kindex"
FILES_TAG = "kindex/files"  # set on the incoming-files sensor's runs (assets/sensors.py)
# Deadlines only: a loaded 2-core machine can be slow; nothing here is a speed assertion.
START_TIMEOUT = 180.0
RUN_TIMEOUT = 240.0
# What the QueuedRunCoordinator logs for a run: queued on submission, then dequeued (STARTING).
QUEUE_EVENTS = [DagsterEventType.RUN_ENQUEUED, DagsterEventType.RUN_STARTING]
QUEUED = DagsterRunStatus.QUEUED

pytestmark = pytest.mark.slow


def dagster_bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def require_postgres() -> Path:
    found = postgres_bin_dir()
    if found is None:
        reason = (
            "PostgreSQL server binaries (initdb, postgres) not found: apt-get install postgresql"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)  # CI installs them (.ci/run): missing there is a failure
        pytest.skip(reason)
    return found


def liger_cuts(count: int) -> list[bytes]:
    """`count` files of ROWS_PER_FILE different rows each, with the Liger header."""
    header, *rows = LIGER_CSV.read_bytes().splitlines(keepends=True)
    return [
        header + b"".join(rows[i * ROWS_PER_FILE : (i + 1) * ROWS_PER_FILE]) for i in range(count)
    ]


def webserver_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/server_info", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


LOCATIONS_QUERY = """{ workspaceOrError { ... on Workspace { locationEntries {
  name loadStatus displayMetadata { key value }
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
RUNS_QUERY = "{ runsOrError { ... on Runs { results { runId status } } } }"


def location_loaded(port: int) -> dict[str, str] | None:
    """The kindex location's display metadata once the webserver has loaded it."""
    entries = graphql(port, LOCATIONS_QUERY)["workspaceOrError"]["locationEntries"]
    for entry in entries:
        if entry["name"] == LOCATION and entry["loadStatus"] == "LOADED":
            error = entry["locationOrLoadError"]
            assert error["__typename"] == "RepositoryLocation", error
            return {item["key"]: item["value"] for item in entry["displayMetadata"]}
    return None


def indexed_runs(store: S3Store, reader: Settings) -> dict[str, int]:
    """Runs per source file in the index published to the bucket, read from another home."""
    sync_local(store, reader)
    with open_index(reader) as con:
        rows = con.sql("SELECT source_key, count(*) FROM runs GROUP BY ALL").fetchall()
    return {str(key): int(n) for key, n in rows}


def check_polars_reads_the_shared_catalog(store: S3Store, reader: Settings, cwd: Path) -> None:
    """Another engine beside DuckDB on the deployment's PostgreSQL catalog: the program `kindex
    connect --engine polars` prints (pyiceberg's SQL catalog on PostgreSQL) sees the same runs
    and the same sum of `median` as DuckDB's index of the same version."""
    sync_local(store, reader)
    with open_index(reader) as con:
        row = con.sql("SELECT count(*), sum(median) FROM run_segments").fetchone()
    assert row is not None and row[0] > 0
    access = s3_access(reader, store.endpoint_url, store.credentials)
    program = engine_snippet("polars", reader, access)
    assert "postgresql+psycopg2://" in program
    read = run_python(program + POLARS_COUNTS, dict(os.environ), cwd)
    assert read["run_segments"] == {"rows": row[0], "median": row[1]}


def ids(runs: list[Any]) -> set[str]:
    return {run.run_id for run in runs}


def test_deployment_end_to_end(
    s3_store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = require_postgres()
    logs = tmp_path / "logs"
    logs.mkdir()
    processes = Processes(logs)
    postgres = PostgresServer(bin_dir, processes)
    grpc_port, web_port = free_port(), free_port()
    ports = [postgres.port, grpc_port, web_port]

    # The instance is deploy/dagster.yaml itself, not a copy.
    dagster_home = tmp_path / "dagster-home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").symlink_to(DAGSTER_YAML)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n"
        f"  - grpc_server: {{host: {HOST}, port: {grpc_port}, location_name: {LOCATION}}}\n"
    )
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    for name, value in postgres.env.items():
        monkeypatch.setenv(name, value)
    # The index's Iceberg catalog lives in the same PostgreSQL, shared by every process and the
    # reader's home.
    monkeypatch.setenv(
        "KINDEX_CATALOG_URI",
        f"postgresql+psycopg2://{postgres.username}:{postgres.password}@{HOST}:{postgres.port}/"
        f"{postgres.database}",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}
    env.update(postgres.env, DAGSTER_HOME=str(dagster_home), PYTHONUNBUFFERED="1")
    # Every file run waits after writing its records until the test lets it go: two runs
    # waiting at once is proof that the coordinator ran them in parallel.
    env.update({PAUSE_ENV: RECORD_FILES_WRITTEN, DIR_ENV: str(fault_dir)})

    settings = Settings.from_env()
    reader = settings.replace(home=tmp_path / "reader")
    files = {
        f"{settings.incoming_prefix}liger-{i}.csv": data for i, data in enumerate(liger_cuts(2))
    }
    instance: DagsterInstance | None = None
    timings = {"start": time.monotonic()}
    try:
        # The code location as the Helm chart runs it: `dagster api grpc -m definitions`.
        processes.start(
            "code-server",
            [dagster_bin("dagster"), "api", "grpc", "-m", "definitions", "-h", HOST, "-p"]
            + [str(grpc_port)],
            env,
            cwd=ROOT,
        )
        postgres.start(START_TIMEOUT)
        timings["postgres up"] = time.monotonic()
        # Opening the instance creates Dagster's tables, as `dagster instance migrate` does, once
        # before three processes open it at the same moment (a process fewer on a busy machine).
        instance = DagsterInstance.from_config(str(dagster_home))
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"

        wait_for(
            lambda: grpc_server_serving(grpc_port),
            START_TIMEOUT,
            "code server",
            processes.check_alive,
        )
        timings["code server up"] = time.monotonic()
        processes.start(
            "daemon", [dagster_bin("dagster-daemon"), "run", "-w", str(workspace)], env, cwd=ROOT
        )
        processes.start(
            "webserver",
            [dagster_bin("dagster-webserver"), "-w", str(workspace), "-h", HOST, "-p"]
            + [str(web_port)],
            env,
            cwd=ROOT,
        )
        wait_for(
            lambda: webserver_ready(web_port), START_TIMEOUT, "webserver", processes.check_alive
        )
        shown = wait_for(
            lambda: location_loaded(web_port), START_TIMEOUT, "location", processes.check_alive
        )
        assert shown.get("port") == str(grpc_port), shown  # served by the gRPC code server
        timings["webserver up"] = time.monotonic()
        # The reconcile's first tick lists the bucket to rebuild the missing ledger: the files
        # come after it, so each is one tick's run (two ticks that find one file at once:
        # test_dagster_sensor).
        wait_for(
            lambda: (
                sensor_ticked(instance, reconcile_sensor.name)
                and not tick_in_progress(instance, reconcile_sensor.name)
            ),
            START_TIMEOUT,
            "the reconcile sensor's first tick",
            processes.check_alive,
        )

        def file_runs(status: DagsterRunStatus | None = None) -> list[Any]:
            assert instance is not None
            return [
                run
                for run in instance.get_runs()
                if FILES_TAG in run.tags and (status is None or run.status == status)
            ]

        first, second = files
        s3_store.put_bytes(first, files[first])
        # Once the sensor has made the first file's run, the second file is a tick of its own.
        wait_for(file_runs, RUN_TIMEOUT, "the first file's run", processes.check_alive)
        timings["first run queued"] = time.monotonic()
        s3_store.put_bytes(second, files[second])
        started = wait_for(
            lambda: len(file_runs(DagsterRunStatus.STARTED)) == 2,
            RUN_TIMEOUT,
            "both file runs started at once",
            processes.check_alive,
        )
        assert started
        timings["both runs started"] = time.monotonic()
        (fault_dir / f"{RECORD_FILES_WRITTEN}.resume").touch()

        expected = {key: len(data.splitlines()) - 1 for key, data in files.items()}
        wait_for(
            lambda: indexed_runs(s3_store, reader) == expected,
            RUN_TIMEOUT,
            f"both files indexed ({expected})",
            processes.check_alive,
            interval=1.0,  # each look downloads the index: leave the CPU to the runs
        )
        timings["both indexed"] = time.monotonic()
        check_polars_reads_the_shared_catalog(s3_store, reader, tmp_path)
        timings["read by Polars"] = time.monotonic()

        # Stop the daemon first: nothing new is launched, and what runs is let finish, so no
        # run is cut off. A run still queued stays queued in PostgreSQL for the next daemon.
        daemon_code = processes.stop(["daemon"])["daemon"]
        assert daemon_code is not None, "the daemon did not stop on SIGTERM"

        def runs_settled() -> list[Any] | None:
            assert instance is not None
            runs = list(instance.get_runs())
            return runs if all(run.is_finished or run.status == QUEUED for run in runs) else None

        every_run = wait_for(runs_settled, RUN_TIMEOUT, "runs finished", processes.check_alive)
        runs = file_runs()
        assert len(runs) == 2, [(run.tags.get("kindex/why"), run.tags[FILES_TAG]) for run in runs]
        launched = [run for run in every_run if run.status != QUEUED]
        assert len(launched) >= 2, "both file runs (each publishes the index)"
        assert {run.status for run in launched} == {DagsterRunStatus.SUCCESS}
        for run in every_run:
            logged = [
                entry.dagster_event.event_type
                for entry in instance.all_logs(run.run_id, of_type=set(QUEUE_EVENTS))
                if entry.dagster_event is not None
            ]
            assert logged == (QUEUE_EVENTS[:1] if run.status == QUEUED else QUEUE_EVENTS), (
                run.run_id
            )
        timings["runs finished"] = time.monotonic()

        # Dagster's run, event-log and schedule storage are PostgreSQL's tables.
        with postgres.connect() as connection, connection.cursor() as cursor:
            cursor.execute("SELECT run_id FROM runs")
            stored_runs = {row[0] for row in cursor.fetchall()}
            cursor.execute(
                "SELECT count(*) FROM event_logs WHERE dagster_event_type = %s",
                (DagsterEventType.RUN_ENQUEUED.value,),
            )
            (enqueued,) = cursor.fetchone()
            cursor.execute("SELECT count(*) FROM job_ticks WHERE type = 'SENSOR'")
            (sensor_ticks,) = cursor.fetchone()
        connection.close()
        assert ids(every_run) <= stored_runs
        assert enqueued >= len(every_run)
        assert sensor_ticks > 0

        # The webserver shows the same runs, read from the same storage.
        listed = graphql(web_port, RUNS_QUERY)["runsOrError"]["results"]
        assert ids(every_run) <= {r["runId"] for r in listed}
        assert {r["runId"]: r["status"] for r in listed if r["runId"] in ids(runs)} == {
            run.run_id: "SUCCESS" for run in runs
        }
    finally:
        if instance is not None:
            instance.dispose()
        codes = processes.stop_all(last={"postgres": PostgresServer.STOP_SIGNAL})
        postgres.remove()
        timings["stopped"] = time.monotonic()
        marks = list(timings.items())
        steps = zip(marks, marks[1:], strict=False)
        print("\n" + ", ".join(f"{name} +{t - t0:.1f} s" for (_, t0), (name, t) in steps))
    # Each process stopped on its own signal (SIGTERM; SIGINT for PostgreSQL's fast shutdown).
    assert all(code is not None for code in codes.values()), (
        codes,
        processes.left_below,
        processes.stuck_logs,
    )
    assert codes["postgres"] == 0, processes.log("postgres")[-2000:]
    assert processes.left_running() == []
    assert all(port_is_free(port) for port in ports)
