"""A restart of the embedded S3 server is a gap in its change feed, under a real `kindex up`.

Files are dropped with `kindex put` and the server is SIGKILLed as soon as the upload returns:
its filer loses the events it still held in memory, and the log of the server `kindex up`
starts again never shows those files. The sensor's first poll of the new server reports the
gap, it lists what changed since, and every file is indexed within a minute of the restart, not
at the reconcile's next tick 15 minutes later.

The incoming sensor is switched off (as in the UI) from before the drop until the restart: a
tick between the upload's end and the kill would read every event, and leave the gap nothing to
find. Its cursor, kept while it is off, names the killed server."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, RunsFilter
from process_support import KindexUp, sensor_ticked, tick_in_progress
from process_support import kindex_up as kindex_up  # the fixture

from assets.reconcile import reconcile_sensor
from assets.sensors import incoming_files_sensor
from pipelines.storage.embedded import running_server

ROOT = Path(__file__).resolve().parents[1]
LIGER_CSV = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
FILES = 300
ROWS_PER_FILE = 8  # 300 files of distinct rows of the shared CSV (2,448 rows)
INDEXED_WITHIN = 60.0  # what the gap promises, from the restart
RECONCILE_START_TIMEOUT = 180.0
RESTART_TIMEOUT = 120.0
TICK_END_TIMEOUT = 120.0

pytestmark = pytest.mark.slow


def small_files(folder: Path) -> list[Path]:
    """FILES valid Liger CSVs, each the header and ROWS_PER_FILE rows of its own."""
    header, *rows = LIGER_CSV.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(rows) >= FILES * ROWS_PER_FILE
    folder.mkdir()
    paths = []
    for n in range(FILES):
        path = folder / f"gap-{n:03d}.csv"
        path.write_text(header + "".join(rows[n * ROWS_PER_FILE : (n + 1) * ROWS_PER_FILE]))
        paths.append(path)
    return paths


def processed(up: KindexUp) -> dict[str, int]:
    """The `files` view: object versions by state."""
    sql = "select state, count(*) as n from files group by state"
    result = up.kindex("query", sql, "--format", "csv")
    assert result.returncode == 0, result.stderr
    return {state: int(n) for state, n in (line.split(",") for line in result.stdout.split()[1:])}


def test_files_whose_events_died_with_the_server_are_indexed_soon_after_its_restart(
    kindex_up: KindexUp, tmp_path: Path
) -> None:
    files = small_files(tmp_path / "files")
    kindex_up.start()
    assert kindex_up.process is not None
    with DagsterInstance.from_config(str(kindex_up.home / "dagster")) as instance:
        # Its first tick, at start, is behind us: its next is 15 minutes away, so what is found
        # after the restart is the gap's doing.
        deadline = time.monotonic() + RECONCILE_START_TIMEOUT
        while not sensor_ticked(instance, reconcile_sensor.name):
            assert time.monotonic() < deadline, "the reconcile sensor never ticked"
            time.sleep(1)
        server = running_server(kindex_up.home)
        assert server is not None
        kindex_up.switch_sensor(incoming_files_sensor.name, running=False)
        deadline = time.monotonic() + TICK_END_TIMEOUT
        while tick_in_progress(instance, incoming_files_sensor.name):
            assert time.monotonic() < deadline, "the incoming sensor's tick never ended"
            time.sleep(0.5)

        put = kindex_up.kindex("put", *map(str, files), timeout=600)
        assert put.returncode == 0, put.stderr
        os.kill(server.pid, signal.SIGKILL)

        deadline = time.monotonic() + RESTART_TIMEOUT
        while "is back on" not in kindex_up.text():
            assert kindex_up.process.poll() is None, kindex_up.text()
            assert time.monotonic() < deadline, kindex_up.text()
            time.sleep(0.2)
        restarted_at = time.monotonic()
        kindex_up.switch_sensor(incoming_files_sensor.name, running=True)

        states: dict[str, int] = {}
        while sum(states.get(s, 0) for s in ("indexed", "quarantined")) < FILES:
            waited = time.monotonic() - restarted_at
            assert waited < INDEXED_WITHIN, f"{states} {waited:.0f} s after the restart"
            time.sleep(2)
            states = processed(kindex_up)
        indexed_after = time.monotonic() - restarted_at
        assert states == {"indexed": FILES}, states

        gap_runs = instance.get_runs(filters=RunsFilter(tags={"kindex/why": "gap"}))
        found_by_gap = sum(int(run.tags["kindex/files"]) for run in gap_runs)
    assert found_by_gap == FILES, f"{found_by_gap} of {FILES} files found by the gap's tick"
    print(
        f"\nall {FILES} files requested by the tick that saw the gap, and indexed "
        f"{indexed_after:.1f} s after the restart"
    )
