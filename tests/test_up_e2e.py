"""`kindex up` end to end with real processes: SeaweedFS, the Dagster webserver and daemon.

A file put into the bucket becomes 2448 runs in the index with no click; `kindex query` answers
while Dagster writes; a backfill launched through GraphQL succeeds; SIGTERM stops every process
`kindex up` started."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from bundle_support import billion_laughs
from process_support import STOP_TIMEOUT, KindexUp, descendants, wait_gone
from process_support import kindex_up as kindex_up  # the fixture
from test_embedded_s3 import SMALL_LIGER_ROWS, concurrent_ingests, small_liger_csv
from test_worker import numpy_statistics, writer_with_two_runs

from pipelines.storage.embedded import running_server
from pipelines.worker import capture_environment

ROOT = Path(__file__).resolve().parents[1]
LIGER_CSV = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
LIGER_RUNS = 2448
INDEX_TIMEOUT = 600.0  # slow, shared machines: generous, never asserted as a speed

pytestmark = pytest.mark.slow


def check_worker_bundle_lands(kindex_up: KindexUp, tmp_path: Path) -> None:
    """A GPU worker's bundle dropped next to a hostile file: the bundle's runs reach the index
    with their software versions and numpy-equal statistics; the hostile file is quarantined."""
    writer, all_samples = writer_with_two_runs()
    bundle = tmp_path / "worker-results.yaml"
    writer.write(str(bundle))
    hostile = tmp_path / "laughs.yaml"
    hostile.write_bytes(billion_laughs())
    put = kindex_up.kindex("put", str(bundle), str(hostile))
    assert put.returncode == 0, put.stderr
    columns = "samples, median, mean, p05, p95, minimum, maximum, mad, ci95_low, ci95_high"
    sql = f"SELECT {columns}, software FROM runs WHERE origin = 'measured' ORDER BY median"
    deadline = time.monotonic() + INDEX_TIMEOUT
    while True:
        result = kindex_up.kindex("query", sql, "--format", "json")
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)
        if len(rows) == len(all_samples):
            break
        assert time.monotonic() < deadline, f"worker runs never indexed: {rows}"
        time.sleep(1)
    names = columns.split(", ")
    for row, samples in zip(rows, all_samples, strict=True):
        assert tuple(row[name] for name in names) == numpy_statistics(samples)
        assert json.loads(row["software"]) == capture_environment()["spec"]["software"]
    quarantine = kindex_up.kindex(
        "query", "SELECT source_key, reason FROM quarantine", "--format", "csv"
    )
    assert "incoming/laughs.yaml,too_many_aliases" in quarantine.stdout
    assert kindex_up.count_runs() == LIGER_RUNS + len(all_samples)


FORMATS = ROOT / "tests" / "data" / "formats"
HARNESS_SQL = (
    "SELECT count(*) AS n FROM lineage JOIN first_reads USING (snapshot_digest) "
    "WHERE source NOT IN ('liger-csv', 'worker-bundle')"
)


def csv_count(kindex_up: KindexUp, sql: str) -> int:
    result = kindex_up.kindex("query", sql, "--format", "csv")
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[1])


def wait_until(kindex_up: KindexUp, sql: str, expected: int, what: str) -> None:
    deadline = time.monotonic() + INDEX_TIMEOUT
    while (found := csv_count(kindex_up, sql)) != expected:
        assert time.monotonic() < deadline, f"{what}: {found}, not {expected}"
        time.sleep(1)


def harness_run_lines(kindex_up: KindexUp, files: list[Path]) -> int:
    """The records of the harness samples that are runs, as a dry run of them all together
    (`kindex normalize`, definitions resolved among them) finds them: the lineage rows the index
    must reach. Rows, not runs: a format that records no time (v3) takes the object's received
    time, so the same record in two files is two runs or one."""
    result = kindex_up.kindex("normalize", *map(str, files))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return sum(
        1
        for line in lines
        if line["status"] == "ok" and line["records"][0]["kind"] == "BenchmarkRun"
    )


def check_harness_files_land(kindex_up: KindexUp) -> None:
    """Every sample of every harness format, dropped under `kindex up`: FlashInfer traces first,
    which wait (visibly) for their definition; then the rest, the definition among them, after
    which every run is indexed and nothing waits."""
    traces = FORMATS / "flashinfer-trace" / "gemm_n128_k2048.traces.jsonl"
    put = kindex_up.kindex("put", str(traces))
    assert put.returncode == 0, put.stderr
    awaiting = "SELECT count(*) AS n FROM quarantine WHERE reason = 'awaiting_definition'"
    wait_until(kindex_up, awaiting, 25, "traces awaiting their definition")
    others = sorted(p for p in FORMATS.glob("*/*.json*") if p != traces)
    put = kindex_up.kindex("put", *map(str, others))
    assert put.returncode == 0, put.stderr
    expected = harness_run_lines(kindex_up, [traces, *others])
    wait_until(kindex_up, HARNESS_SQL, expected, "harness runs indexed")
    wait_until(kindex_up, awaiting, 0, "traces still awaiting")


def test_put_to_query_backfill_and_stop(kindex_up: KindexUp, tmp_path: Path) -> None:
    kindex_up.start()

    put = kindex_up.kindex("put", str(LIGER_CSV))
    assert put.returncode == 0, put.stderr
    dropped_at = time.monotonic()
    counts: list[int] = []
    deadline = dropped_at + INDEX_TIMEOUT
    while LIGER_RUNS not in counts:
        assert time.monotonic() < deadline, f"index never reached {LIGER_RUNS}: {counts[-5:]}"
        counts.append(kindex_up.count_runs())
        time.sleep(1)
    print(f"\nput to {LIGER_RUNS} runs in the index: {time.monotonic() - dropped_at:.1f} s")
    assert set(counts) <= {0, LIGER_RUNS}  # never a partial index

    kindex_up.backfill("incoming/*")
    assert kindex_up.count_runs() == LIGER_RUNS
    # The UI's backfill of the file's arrival window: the same file again, the same index.
    (window,) = kindex_up.query_column("select distinct arrival_window from files")
    kindex_up.backfill_window(window)
    assert kindex_up.count_runs() == LIGER_RUNS
    states = kindex_up.query_column("select state from files")
    assert states == ["indexed"], states

    check_worker_bundle_lands(kindex_up, tmp_path)
    check_harness_files_land(kindex_up)

    assert kindex_up.process is not None
    started = descendants(kindex_up.process.pid)
    assert len(started) >= 3  # SeaweedFS, webserver, daemon (and their code servers)
    kindex_up.process.send_signal(signal.SIGTERM)
    assert kindex_up.process.wait(timeout=STOP_TIMEOUT) == 0
    wait_gone(started, STOP_TIMEOUT, "after SIGTERM")


def test_up_shares_its_s3_server_and_restarts_it_when_killed(
    kindex_up: KindexUp, tmp_path: Path
) -> None:
    kindex_up.start()
    assert kindex_up.process is not None
    up_file = kindex_up.home / "up.json"
    assert json.loads(up_file.read_text()) == {
        "url": f"http://127.0.0.1:{kindex_up.port}",
        "pid": kindex_up.process.pid,
    }
    server = running_server(kindex_up.home)
    assert server is not None

    # Commands attach to up's server (in a bucket of their own, which no sensor watches).
    side = kindex_up.env | {"KINDEX_BUCKET": "side"}
    for round_ in range(10):
        files = [small_liger_csv(tmp_path / f"r{round_}-{n}.csv", 2 + 100 * n) for n in (0, 1)]
        results = concurrent_ingests(side, files)
        assert [code for code, _ in results] == [0, 0], (round_, results)
    assert running_server(kindex_up.home) == server  # never stopped, never a second one

    os.kill(server.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    deadline = killed_at + 120
    while "is back on" not in kindex_up.text():
        assert kindex_up.process.poll() is None, kindex_up.text()
        assert time.monotonic() < deadline, kindex_up.text()
        time.sleep(0.2)
    restart_seconds = time.monotonic() - killed_at
    assert f"the embedded S3 server (pid {server.pid}) died" in kindex_up.text()
    restarted = running_server(kindex_up.home)
    assert restarted is not None and restarted.port == server.port
    assert restarted.pid != server.pid

    # The sensors and runs reconnect by themselves: a file put now reaches the index.
    put = kindex_up.kindex("put", str(small_liger_csv(tmp_path / "after.csv", 2)))
    assert put.returncode == 0, put.stderr
    put_at = time.monotonic()
    while kindex_up.count_runs() != SMALL_LIGER_ROWS:
        assert time.monotonic() < put_at + INDEX_TIMEOUT, "not indexed after the restart"
        time.sleep(2)
    print(
        f"\nS3 server back {restart_seconds:.1f} s after kill -9; a file put then was indexed "
        f"in {time.monotonic() - put_at:.1f} s"
    )

    kindex_up.process.send_signal(signal.SIGTERM)
    assert kindex_up.process.wait(timeout=STOP_TIMEOUT) == 0
    assert not up_file.exists()
    assert running_server(kindex_up.home) is None  # its last user stopped it
