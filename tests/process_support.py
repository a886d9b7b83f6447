"""Real processes for the slow tests and benchmarks/burst.py: free ports, polling, the process
tree read from /proc, named children each in a session of its own (`Processes`), and a real
`kindex up` with the `kindex` commands run against it (`KindexUp`, the `kindex_up` fixture)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from dagster import DagsterInstance

from pipelines.forked import pid_alive
from pipelines.storage.embedded import find_free_port_block, running_server, stop_pid

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
POLL_SECONDS = 0.5
# How long a process may take to stop on its signal: a code server lets a sensor tick it is
# evaluating finish first, which takes a while on a loaded machine.
STOP_GRACE_SECONDS = 60.0
STARTUP_TIMEOUT = 300.0  # slow, shared machines: generous, never asserted as a speed
STOP_TIMEOUT = 30.0
BACKFILL_TIMEOUT = 500.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
        return True


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    check: Callable[[], None] = lambda: None,
    interval: float = POLL_SECONDS,
) -> Any:
    """Poll `condition` until it returns something truthy; `check` raises when waiting is
    pointless (a process died). Deadlines are generous: the machine may be loaded."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


alive = pid_alive  # running, and not a zombie


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return "?"


def parent_pid(pid: int) -> int | None:
    """The parent of `pid` from /proc, None once it is gone."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(*pids: int) -> set[int]:
    """Every live process below `pids` (children, grandchildren, ...), from one pass over
    /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (parent := parent_pid(int(entry.name))) is not None:
            children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def wait_gone(pids: set[int], timeout: float, what: str) -> None:
    """Assert that every one of `pids` exits within `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := {pid for pid in pids if alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running {what}: {left}"


def default_stop_signals() -> None:
    """In a child, before it runs: SIGINT and SIGTERM as a supervisor (systemd, Kubernetes)
    leaves them. A test run started from a shell with `&` ignores SIGINT, and Dagster's code
    server gives SIGTERM the SIGINT handler it inherits: it would ignore SIGTERM too."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


@dataclass
class Processes:
    """Named children, each the leader of its own session, with its output in a log file."""

    log_dir: Path
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)  # every descendant ever observed
    stopped: set[str] = field(default_factory=set)  # stopped on purpose: no longer checked
    # What was still running below a child that had to be killed (pid: command line).
    left_below: dict[str, dict[int, str]] = field(default_factory=dict)
    # The end of the log of a child that had to be killed: every thread's stack, which Python's
    # faulthandler (on in each child) writes there on SIGABRT.
    stuck_logs: dict[str, str] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def start(
        self, name: str, argv: list[str], env: Mapping[str, str], **options: Any
    ) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("ab")
        self._logs.append(log)
        child = subprocess.Popen(
            argv,
            env={**env, "PYTHONFAULTHANDLER": "1"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_stop_signals,
            **options,
        )
        self.children[name] = child
        return child

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def check_alive(self) -> None:
        """Raise, with its log, when a child has exited; remember every descendant seen."""
        for name, child in self.children.items():
            if name not in self.stopped and child.poll() is not None:
                raise RuntimeError(f"{name} exited ({child.returncode}):\n{self.log(name)[-4000:]}")
        self.seen |= descendants(*(child.pid for child in self.children.values()))

    def stop(self, names: list[str], signum: int = signal.SIGTERM) -> dict[str, int | None]:
        """Signal these children at once, then wait for each; None for one that had to be
        killed after the grace period."""
        self.stopped.update(names)
        running = {n: self.children[n] for n in names if self.children[n].poll() is None}
        self.seen |= descendants(*(child.pid for child in running.values()))
        for child in running.values():
            child.send_signal(signum)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        codes: dict[str, int | None] = {}
        for name in names:
            child = self.children[name]
            try:
                codes[name] = child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.left_below[name] = {pid: command_line(pid) for pid in descendants(child.pid)}
                child.send_signal(signal.SIGABRT)  # where it is stuck goes to its log
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                self.stuck_logs[name] = self.log(name)[-8000:]
                codes[name] = None
        return codes

    def stop_all(self, last: dict[str, int]) -> dict[str, int | None]:
        """SIGTERM every child but those in `last` at once; then each of `last` in turn with
        its own signal (the database, once its clients are gone). Then SIGKILL any descendant
        left behind (a run worker the code server started). Returns each exit status."""
        codes = self.stop([n for n in self.children if n not in last])
        for name, signum in last.items():
            if name in self.children:
                codes |= self.stop([name], signum)
        for pid in self.seen:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for log in self._logs:
            log.close()
        self._logs.clear()
        return codes

    def left_running(self) -> list[int]:
        pids = set(self.seen) | {child.pid for child in self.children.values()}
        return sorted(pid for pid in pids if alive(pid))


def graphql(port: int, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One request to the Dagster webserver on `port`, as its UI sends them; its data."""
    request = urllib.request.Request(
        f"http://{HOST}:{port}/graphql",
        data=json.dumps({"query": query, "variables": dict(variables or {})}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body
    data: dict[str, Any] = body["data"]
    return data


SENSORS_QUERY = """{ repositoriesOrError { ... on RepositoryConnection { nodes {
  name location { name } sensors { name sensorState { id status } } } } } }"""
START_SENSOR = """mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) { __typename
    ... on Sensor { sensorState { status } } ... on PythonError { message } } }"""
STOP_SENSOR = """mutation Stop($id: String!) { stopSensor(id: $id) {
  __typename ... on StopSensorMutationResult { instigationState { status } }
  ... on PythonError { message } } }"""


def newest_tick(instance: DagsterInstance, name: str) -> Any:
    """The sensor's newest tick, None before its first (which comes as the daemon starts)."""
    for state in instance.all_instigator_state():
        if state.name == name:
            ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
            return ticks[0] if ticks else None
    return None


def sensor_ticked(instance: DagsterInstance, name: str) -> bool:
    return newest_tick(instance, name) is not None


def tick_in_progress(instance: DagsterInstance, name: str) -> bool:
    """Whether the sensor's newest tick is still being evaluated."""
    tick = newest_tick(instance, name)
    return tick is not None and tick.status.value == "STARTED"


def kindex_bin() -> str:
    return str(Path(sys.executable).parent / "kindex")


def kindex_env(home: Path, s3_port: int | None = None) -> dict[str, str]:
    """This environment without kindex's, AWS's and Dagster's variables, with `home` as
    KINDEX_HOME (and its embedded S3 server on `s3_port`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KINDEX_", "AWS_", "DAGSTER_"))}
    env["KINDEX_HOME"] = str(home)
    if s3_port is not None:
        env["KINDEX_S3_PORT"] = str(s3_port)
    return env


def run_kindex(
    env: Mapping[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """A `kindex` command in its own process, from the repository root."""
    return subprocess.run(
        [kindex_bin(), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class KindexUp:
    """A real `kindex up` (SeaweedFS, the Dagster webserver and daemon) in `home`, its output
    appended to `up.out` beside it."""

    def __init__(self, home: Path, port: int, s3_port: int) -> None:
        self.home = home
        self.port = port
        self.env = kindex_env(home, s3_port)
        self.output = home.parent / "up.out"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def graphql_url(self) -> str:
        return f"http://{HOST}:{self.port}/graphql"

    def switch_sensor(self, name: str, running: bool) -> None:
        """Turn a sensor on or off as the UI's switch does (it keeps its cursor)."""
        for repository in graphql(self.port, SENSORS_QUERY)["repositoriesOrError"]["nodes"]:
            for sensor in repository["sensors"]:
                if sensor["name"] != name:
                    continue
                if running:
                    selector = {
                        "repositoryLocationName": repository["location"]["name"],
                        "repositoryName": repository["name"],
                        "sensorName": name,
                    }
                    done = graphql(self.port, START_SENSOR, {"selector": selector})["startSensor"]
                    status = done.get("sensorState", {}).get("status")
                else:
                    done = graphql(self.port, STOP_SENSOR, {"id": sensor["sensorState"]["id"]})
                    state = done["stopSensor"].get("instigationState") or {}
                    status = state.get("status")
                assert status == ("RUNNING" if running else "STOPPED"), done
                return
        raise AssertionError(f"no sensor {name} in the webserver's workspace")

    def start(self) -> None:
        ups = self.text().count("kindex is up")  # a restarted `kindex up` appends
        with self.output.open("ab") as out:
            self.process = subprocess.Popen(
                [kindex_bin(), "up", "--port", str(self.port)],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the test can clean up after a failure
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while self.text().count("kindex is up") <= ups:
            assert self.process.poll() is None, self.text()
            assert time.monotonic() < deadline, f"not up after {STARTUP_TIMEOUT} s:\n{self.text()}"
            time.sleep(1)

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def kindex(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_kindex(self.env, *args, timeout=timeout)

    def backfill(
        self, glob: str = "incoming/*", timeout: float = BACKFILL_TIMEOUT, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`kindex backfill GLOB --wait` through this webserver's GraphQL; with `check`, asserts
        that the run succeeded."""
        return self._backfill([glob], "SUCCESS", timeout, check)

    def backfill_window(self, window: str, timeout: float = BACKFILL_TIMEOUT) -> None:
        """`kindex backfill --window HOUR --wait`: the UI's backfill of one arrival window."""
        self._backfill(["--window", window], "COMPLETED_SUCCESS", timeout, check=True)

    def _backfill(
        self, choice: list[str], success: str, timeout: float, check: bool
    ) -> subprocess.CompletedProcess[str]:
        done = self.kindex(
            "backfill",
            *choice,
            "--url",
            self.graphql_url,
            "--wait",
            "--timeout",
            str(int(timeout)),
            timeout=timeout + 100,
        )
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
            assert success in done.stdout.split(), done.stdout
        return done

    def query_column(self, sql: str) -> list[str]:
        """The first column of `kindex query SQL` (the local index), as text."""
        result = self.kindex("query", sql, "--format", "csv")
        assert result.returncode == 0, result.stderr
        return result.stdout.split()[1:]

    def count_runs(self) -> int:
        """`kindex query` of the run count (0 before the first file: the empty index exists
        from the start). Any failure (a lock, a half-written file) fails the test: readers must
        work while Dagster writes."""
        result = self.kindex("query", "select count(*) as n from runs", "--format", "csv")
        assert result.returncode == 0, result.stderr
        return int(result.stdout.split()[1])

    def stop(self) -> None:
        """After a failed test: SIGTERM (kindex up stops what it started), then SIGKILL for
        anything left, including children that a killed parent would orphan (SeaweedFS runs
        in a session of its own, and outlives a killed `kindex up` on purpose)."""
        if self.process is None or self.process.poll() is not None:
            self.stop_s3_server()
            return
        started = descendants(self.process.pid)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.stop_s3_server()

    def stop_s3_server(self) -> None:
        server = running_server(self.home)
        if server is not None:
            stop_pid(server.pid, self.home / "s3" / "data")


@pytest.fixture
def kindex_up(tmp_path: Path) -> Iterator[KindexUp]:
    """A `kindex up` in a fresh home on free ports, not yet started; stopped after the test."""
    up = KindexUp(tmp_path / "home", free_port(), find_free_port_block())
    try:
        yield up
    finally:
        up.stop()
