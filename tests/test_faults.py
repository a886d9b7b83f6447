"""Faults with real processes: the S3 server killed in the middle of an ingest, the `kindex ingest`
process SIGKILLed in the middle of writing records or publishing. After a rerun the index equals
that of an undisturbed ingest of the same files, and a reader polling the bucket and the local
database throughout only ever saw complete versions. Also: retries, and the message a person gets
when the endpoint is unreachable.

A test stops the ingest at an exact step with the pause points of pipelines/index/faults.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from index_support import LIGER_CSV, csv_bytes, fingerprints, liger_rows
from process_support import KindexUp, descendants, free_port, parent_pid, wait_gone

from pipelines.cli import main
from pipelines.index.catalog import IndexCatalog
from pipelines.index.faults import DIR_ENV, INDEX_FILES_WRITTEN, PAUSE_ENV, RECORD_FILES_WRITTEN
from pipelines.index.layout import IndexLayout
from pipelines.index.local import IndexNotFound, load_current, open_index
from pipelines.ingest import ingest_paths
from pipelines.settings import Settings
from pipelines.storage.credentials import S3Credentials
from pipelines.storage.embedded import (
    EmbeddedS3,
    find_free_port_block,
    running_server,
    start_on_free_ports,
)
from pipelines.storage.errors import StorageError, StorageUnreachable
from pipelines.storage.s3 import S3Store

ROOT = Path(__file__).resolve().parents[1]
WAIT_SECONDS = 120.0  # generous: shared, slow CI machines
FIRST_FILE_LINES = range(2, 302)


@dataclass(frozen=True)
class Target:
    """One kindex home and bucket on one S3 server, as a child process would see it."""

    endpoint_url: str
    credentials: Any
    bucket: str
    home: Path

    @property
    def settings(self) -> Settings:
        return Settings(home=self.home, s3_endpoint=self.endpoint_url, bucket=self.bucket)

    def store(self, max_attempts: int = 4) -> S3Store:
        return S3Store(
            self.bucket,
            endpoint_url=self.endpoint_url,
            credentials=self.credentials,
            max_attempts=max_attempts,
        )

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KINDEX_", "AWS_"))}
        return (
            env
            | {
                "KINDEX_HOME": str(self.home),
                "KINDEX_S3_ENDPOINT": self.endpoint_url,
                "KINDEX_BUCKET": self.bucket,
                "AWS_ACCESS_KEY_ID": self.credentials.access_key,
                "AWS_SECRET_ACCESS_KEY": self.credentials.secret_key,
            }
            | extra
        )


def target_on(server: EmbeddedS3, home: Path) -> Target:
    target = Target(server.endpoint_url, server.credentials, f"t-{uuid.uuid4().hex[:12]}", home)
    target.store().ensure_bucket()
    return target


@pytest.fixture(scope="module")
def input_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A first, small file (the index before the fault) and the shared CSV (the one disturbed)."""
    first = tmp_path_factory.mktemp("inputs") / "first.csv"
    first.write_bytes(csv_bytes(*liger_rows(FIRST_FILE_LINES)))
    return [first, LIGER_CSV]


@pytest.fixture(scope="module")
def undisturbed(
    embedded_s3: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory, input_files: list[Path]
) -> dict[str, str]:
    """Fingerprints of every table after ingesting the inputs one after the other, no fault."""
    target = target_on(embedded_s3, tmp_path_factory.mktemp("undisturbed"))
    store = target.store()
    for path in input_files:
        ingest_paths([path], target.settings, progress=False, store=store)
    return fingerprints(target.settings)


def kindex(target: Target, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env=target.env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return process.returncode, out, err


def ingest_ok(target: Target, path: Path) -> str:
    code, out, err = finish(kindex(target, "ingest", "--no-progress", str(path)))
    assert code == 0, err
    return out


def paused_ingest(target: Target, path: Path, point: str, fault_dir: Path) -> subprocess.Popen[str]:
    """`kindex ingest` in a child process, stopped at the pause point `point`."""
    process = kindex(
        target,
        "ingest",
        "--no-progress",
        str(path),
        **{PAUSE_ENV: point, DIR_ENV: str(fault_dir)},
    )
    reached = fault_dir / f"{point}.reached"
    deadline = time.monotonic() + WAIT_SECONDS
    while not reached.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            _, _, err = finish(process)
            pytest.fail(f"ingest never reached {point}: {err}")
        time.sleep(0.05)
    return process


def resume(point: str, fault_dir: Path) -> None:
    (fault_dir / f"{point}.resume").touch()


def _refused(error: OSError) -> bool:
    """Arrow's S3 client could not reach the server (killed, not yet restarted)."""
    return "NETWORK_CONNECTION" in str(error) or "Could not connect" in str(error)


@dataclass
class IndexWatcher:
    """Polls, until stopped, what a reader sees: the bucket's current version (every file it
    names read back and counted against the manifest's counts) and the local database."""

    target: Target
    versions: set[str | None] = field(default_factory=set)
    local_run_counts: set[int] = field(default_factory=set)
    partial: list[str] = field(default_factory=list)
    reads: int = 0
    _rows_by_key: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._store = self.target.store(max_attempts=1)
        self._layout = IndexLayout.of(self.target.settings)
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> IndexWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=WAIT_SECONDS)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._read_bucket()
            except StorageError:  # the server is down for a while in one test: nothing to read
                pass
            except OSError as error:  # pyiceberg reads the metadata through Arrow's S3 client
                if not _refused(error):  # a file a version names is missing, or unreadable
                    self.partial.append(f"bucket unreadable: {error}")
            self._read_local()
            self._stop.wait(0.05)

    def _rows(self, key: str) -> int:
        if key not in self._rows_by_key:  # published files never change
            data = self._store.get_bytes(key)
            self._rows_by_key[key] = pq.read_metadata(io.BytesIO(data)).num_rows
        return self._rows_by_key[key]

    def _read_bucket(self) -> None:
        current = load_current(self._store, self.target.settings)
        files, counts = current.files, current.version.counts
        rows = {name: sum(self._rows(k) for k in keys) for name, keys in files.items()}
        # A run's row is one of its lineage rows: lineage_files holds the others.
        rows["lineage"] = rows["run_segments"] + rows["lineage_files"]
        expected = {
            "run_segments": counts.get("runs", 0),
            "manifest_segments": counts.get("manifests", 0),
            "snapshots": counts.get("reads", 0),
            "lineage": counts.get("lineage", 0),
            "quarantine_files": counts.get("quarantine", 0),
        }
        for name, count in expected.items():
            if rows[name] != count:
                self.partial.append(f"{current.id}: {name} {rows[name]} != {count}")
        self.versions.add(current.id)
        self.reads += 1

    def _read_local(self) -> None:
        try:
            con = open_index(self.target.settings)
        except IndexNotFound:
            return
        try:
            row = con.execute("SELECT count(*) FROM runs").fetchone()
        except duckdb.Error as error:
            self.partial.append(f"local index unreadable: {error}")
            return
        finally:
            con.close()
        assert row is not None
        self.local_run_counts.add(int(row[0]))


def current_version(target: Target) -> str | None:
    version = load_current(target.store(), target.settings).id
    return str(version) if version is not None else None


def run_count(target: Target) -> int:
    con = open_index(target.settings)
    try:
        row = con.execute("SELECT count(*) FROM runs").fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0])


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[EmbeddedS3]:
    """A SeaweedFS of this test's own, which the test kills and restarts."""
    server = start_on_free_ports(tmp_path / "s3-home")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("point", [RECORD_FILES_WRITTEN, INDEX_FILES_WRITTEN])
def test_s3_server_killed_mid_ingest_then_rerun_gives_the_same_index(
    point: str,
    own_server: EmbeddedS3,
    tmp_path: Path,
    input_files: list[Path],
    undisturbed: dict[str, str],
) -> None:
    """Killed with a record set half written, or with every table of a version committed but
    not the version itself (mid-commit)."""
    target = target_on(own_server, tmp_path / "home")
    first, disturbed = input_files
    ingest_ok(target, first)
    old_version, old_runs = current_version(target), run_count(target)
    fault_dir = tmp_path / "fault"
    fault_dir.mkdir()
    with IndexWatcher(target) as watcher:
        process = paused_ingest(target, disturbed, point, fault_dir)
        assert own_server.pid is not None
        os.kill(own_server.pid, signal.SIGKILL)
        own_server.stop()
        resume(point, fault_dir)
        code, _, err = finish(process)
        assert code == 1
        assert f"cannot reach the S3 endpoint {target.endpoint_url}" in err
        assert "Traceback" not in err
        own_server.start()  # the same data directory and ports
        ingest_ok(target, disturbed)
        new_version = current_version(target)
    assert fingerprints(target.settings) == undisturbed
    assert watcher.partial == []
    assert watcher.reads > 0
    assert watcher.versions <= {old_version, new_version}
    assert watcher.local_run_counts <= {old_runs, run_count(target)}


@pytest.mark.slow
@pytest.mark.parametrize("point", [RECORD_FILES_WRITTEN, INDEX_FILES_WRITTEN])
def test_ingest_sigkilled_mid_write_then_rerun_gives_the_same_index(
    point: str,
    embedded_s3: EmbeddedS3,
    tmp_path: Path,
    input_files: list[Path],
    undisturbed: dict[str, str],
) -> None:
    target = target_on(embedded_s3, tmp_path / "home")
    first, disturbed = input_files
    ingest_ok(target, first)
    old_version, old_runs = current_version(target), run_count(target)
    fault_dir = tmp_path / "fault"
    fault_dir.mkdir()
    with IndexWatcher(target) as watcher:
        process = paused_ingest(target, disturbed, point, fault_dir)
        run_segments_head = IndexCatalog.beside(target.store(), target.settings).snapshot_id(
            "run_segments"
        )
        process.send_signal(signal.SIGKILL)
        assert finish(process)[0] == -signal.SIGKILL
        assert current_version(target) == old_version  # nothing of the killed run is visible
        assert run_count(target) == old_runs
        ingest_ok(target, disturbed)
        new_version = current_version(target)
    if point == INDEX_FILES_WRITTEN:  # the killed run had committed its tables, not its version
        pinned = load_current(target.store(), target.settings).version.snapshot_ids
        assert run_segments_head is not None and run_segments_head not in set(pinned.values())
    assert new_version != old_version
    assert fingerprints(target.settings) == undisturbed
    assert watcher.partial == []
    assert watcher.reads > 0
    assert watcher.versions <= {old_version, new_version}
    assert watcher.local_run_counts <= {old_runs, run_count(target)}


def test_an_unreachable_endpoint_is_retried_then_named_in_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"http://127.0.0.1:{find_free_port_block()}"  # nothing listens there
    attempts: list[str] = []
    credentials = S3Credentials("kindex-test", "kindex-test-secret")
    store = S3Store("kindex", endpoint_url=endpoint, credentials=credentials, max_attempts=3)
    store.client.meta.events.register("before-send.s3", lambda **kw: attempts.append("sent"))
    with pytest.raises(StorageUnreachable, match=f"cannot reach the S3 endpoint {endpoint}"):
        store.get_bytes("index/CURRENT")
    # Retried with backoff, then the clear error. (botocore's legacy `max_attempts` counts the
    # retries after the first try, so S3Store(max_attempts=3) sends 4 requests today.)
    assert len(attempts) >= 3

    monkeypatch.setenv("KINDEX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KINDEX_S3_ENDPOINT", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "kindex-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "kindex-test-secret")
    assert main(["ingest", "--no-progress", str(LIGER_CSV)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kindex ingest: cannot reach the S3 endpoint {endpoint}")
    assert "kindex-test-secret" not in err
    assert main(["query", "--sync", "SELECT 1"]) == 1
    assert f"cannot reach the S3 endpoint {endpoint}" in capsys.readouterr().err


# -- crashes under `kindex up`: the index heals with no human action ---------------------------

CONVERGE_SECONDS = 300.0  # the promise: within 5 minutes
TILES_PER_FILE = 4  # ~10k rows: a records step long enough to be killed in the middle


def tiled_liger_csv(path: Path, tiles: range) -> Path:
    """The shared CSV repeated, tile k with every timestamp's seconds set to k: distinct runs
    (re-measurements of the same series), a file big enough that "mid-file" is real."""
    lines = LIGER_CSV.read_text(encoding="utf-8").splitlines(keepends=True)
    header, rows = lines[0], lines[1:]
    stamp = re.compile(r"(\d\d:\d\d:)\d\d,")
    out = [header]
    for k in tiles:
        out += [stamp.sub(lambda m, k=k: f"{m.group(1)}{k:02d},", row, count=1) for row in rows]
    path.write_text("".join(out), encoding="utf-8")
    return path


def run_digests(up: KindexUp) -> str | None:
    """The fingerprint of what `kindex query` shows: the sorted run digests, hashed."""
    result = up.kindex("query", "SELECT run_digest FROM runs ORDER BY 1", "--format", "csv")
    if result.returncode == 2 and "no index" in result.stderr:
        return None
    assert result.returncode == 0, result.stderr
    return hashlib.sha256(result.stdout.encode()).hexdigest()


def undisturbed_digests(home: Path, files: list[Path]) -> list[str]:
    """The fingerprints after in-process `kindex ingest`s of each file in turn, into a home of
    its own: the first file's, the first two's, and so on."""
    reference = KindexUp(home, 0, find_free_port_block())
    digests = []
    for path in files:
        ingest = reference.kindex("ingest", "--no-progress", str(path), timeout=600)
        assert ingest.returncode == 0, ingest.stderr
        digests.append(run_digests(reference))
    assert None not in digests
    return [d for d in digests if d is not None]


def records_worker_pid(up: KindexUp, timeout: float = 600.0) -> int:
    """The pid of the run worker once its `records` step has started (a file is mid-way)."""
    from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

    deadline = time.monotonic() + timeout
    with DagsterInstance.from_config(str(up.home / "dagster")) as instance:
        while time.monotonic() < deadline:
            started = instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
            for record in started:
                pid, in_records = None, False
                for entry in instance.all_logs(record.dagster_run.run_id):
                    if (message := entry.message or "").startswith("Started process for run"):
                        pid = int(message.split("pid: ", 1)[1].split(")", 1)[0])
                    event = entry.dagster_event
                    if (
                        event is not None
                        and event.event_type == DagsterEventType.STEP_START
                        and event.step_key == "records"
                    ):
                        in_records = True
                if pid is not None and in_records:
                    return pid
            time.sleep(0.5)
    raise AssertionError(f"no records step started within {timeout} s:\n{up.text()}")


def converge(up: KindexUp, expected: str, since: float) -> float:
    """Seconds from `since` until `kindex query` shows the expected runs; fails after 5 min."""
    while run_digests(up) != expected:
        waited = time.monotonic() - since
        assert waited < CONVERGE_SECONDS, f"not converged after {waited:.0f} s:\n{up.text()}"
        time.sleep(5)
    return time.monotonic() - since


@pytest.mark.slow
def test_crashes_under_kindex_up_heal_by_themselves(tmp_path: Path) -> None:
    """(a) a run worker SIGKILLed mid-file, (b) the S3 server SIGKILLed mid-run, (c) `kindex up`
    SIGKILLed mid-run and started again: each time, with no other action, the index converges
    to the fingerprint of an undisturbed in-process ingest of the same files."""
    files = [
        tiled_liger_csv(
            tmp_path / f"{name}.csv", range(n * TILES_PER_FILE, (n + 1) * TILES_PER_FILE)
        )
        for n, name in enumerate(("worker-killed", "s3-killed", "up-killed"))
    ]
    expected = undisturbed_digests(tmp_path / "reference-home", files)
    up = KindexUp(tmp_path / "home", free_port(), find_free_port_block())
    timings: dict[str, float] = {}
    try:
        up.start()
        assert up.process is not None

        # (a) the run worker dies in the middle of the file's records step
        assert up.kindex("put", str(files[0])).returncode == 0
        worker = records_worker_pid(up)
        time.sleep(1.0)
        os.kill(worker, signal.SIGKILL)
        timings["a: worker killed -> converged"] = converge(up, expected[0], time.monotonic())

        # (b) the S3 server dies while the next file is processed
        assert up.kindex("put", str(files[1])).returncode == 0
        records_worker_pid(up)
        server = running_server(up.home)
        assert server is not None
        os.kill(server.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        timings["b: S3 killed -> converged"] = converge(up, expected[1], killed_at)
        assert f"the embedded S3 server (pid {server.pid}) died" in up.text()

        # (c) `kindex up` itself dies mid-run; started again, it picks up where things were
        assert up.kindex("put", str(files[2])).returncode == 0
        records_worker_pid(up)
        children = {p for p in descendants(up.process.pid) if parent_pid(p) == up.process.pid}
        server = running_server(up.home)
        up.process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        up.process.wait()
        # Its children die with it (PR_SET_PDEATHSIG), but for the S3 server it leaves.
        webserver_and_daemon = children - ({server.pid} if server else set())
        wait_gone(webserver_and_daemon, 30.0, "after kindex up was killed")
        up.start()
        assert running_server(up.home) == server  # the S3 server it left was reused
        timings["c: up killed -> converged"] = converge(up, expected[2], killed_at)
    finally:
        up.stop()
    print("\n" + "\n".join(f"{name}: {seconds:.0f} s" for name, seconds in timings.items()))
