"""`kindex up`: the embedded S3 (unless an endpoint is configured), the Dagster webserver and the
Dagster daemon on 127.0.0.1, sensors running. Ctrl-C or SIGTERM stops all of it.

Every child runs in its own process group and is stopped by group (the webserver and daemon
spawn code servers of their own), first with SIGTERM, then SIGKILL after a grace period. Signals
are handled here rather than left to the children: started from a shell with `&`, Dagster's
processes ignore SIGINT and SIGTERM. If `kindex up` itself is killed, the kernel kills the
webserver and the daemon (PR_SET_PDEATHSIG); the embedded S3 server, shared with other commands
(`ServerLease`), stays and the next `kindex up` reuses it. Runs in flight finish in their own
processes, or fail and are retried (`run_retries`; the `lost_runs_sensor` fails a run whose
worker died, see assets/lost_runs.py).

`kindex up` watches the embedded S3 server: if it dies, up says so and starts it again, and the
sensors and runs reconnect by themselves; if it cannot, up stops everything, loudly.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from pipelines.settings import Settings
from pipelines.storage.embedded import ServerLease
from pipelines.storage.errors import EmbeddedS3Error, StorageError
from pipelines.storage.s3 import S3Store

DEFAULT_PORT = 3000
HOST = "127.0.0.1"
STOP_GRACE_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 180.0
POLL_SECONDS = 0.5
# A run coordinator queue: a burst of drops must not start dozens of run processes at once.
# A run works its files on threads of one process (one core, with the GIL); two runs keep two
# cores busy, and more only add memory and contention for the event log's SQLite files.
MAX_CONCURRENT_RUNS = 2
# A run that failed (its worker killed, S3 gone for a while) is run again, up to this often.
MAX_RUN_RETRIES = 3
RUN_MONITORING_POLL_SECONDS = 5
# How often the daemon starts queued runs (Dagster's default is every 5 s): a file dropped waits
# for a sensor tick and then this, before its run even starts. Dagster takes whole seconds.
DEQUEUE_INTERVAL_SECONDS = 1
# Sensors tick on threads of the daemon: a long tick (the reconcile listing of a large bucket)
# never holds up the one that finds new files.
SENSOR_THREADS = 4
# An S3 server that dies this often within S3_RESTART_WINDOW_SECONDS is not restarted again.
MAX_S3_RESTARTS = 5
S3_RESTART_WINDOW_SECONDS = 600.0
UP_FILE = "up.json"  # {"url", "pid"} while the webserver is ready; `kindex backfill` reads it

DESCRIPTION = """\
Run kindex on this machine: the embedded S3 server (unless KINDEX_S3_ENDPOINT is set), the
Dagster UI and the Dagster daemon, all on 127.0.0.1. Files put into incoming/ are snapshotted,
normalized and indexed with no click; a failed run is retried, and a dead S3 server is started
again. Ctrl-C stops everything."""

EPILOG = """\
environment:
  KINDEX_HOME          where data, logs and the Dagster instance live (default ./.kindex)
  KINDEX_S3_PORT       the embedded S3 server's port (default 8333; uses the next 8 and +10008 too)
  KINDEX_S3_ENDPOINT   use this S3 endpoint instead of the embedded server
  KINDEX_BUCKET        the bucket (default kindex)

While the UI is ready, $KINDEX_HOME/up.json holds its URL and this process's id."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up",
        help="run kindex: embedded S3, Dagster UI and daemon on 127.0.0.1; Ctrl-C stops them",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port of the Dagster UI (default {DEFAULT_PORT})",
    )
    parser.set_defaults(func=run)


def dagster_instance_yaml(home: Path) -> str:
    """The local instance: SQLite storage under the kindex home, runs forked from the run worker
    that stays up (assets/launcher.py), a queued run coordinator, a pool of one for the index
    writer (the only pool kindex declares), sensors on threads, failed runs retried, and runs
    that never started failed (assets/lost_runs.py fails those whose worker died)."""
    return f"""\
# Written by `kindex up`; rewritten on every start.
local_artifact_storage:
  module: dagster.core.storage.root
  class: LocalArtifactStorage
  config:
    base_dir: {home / "dagster" / "storage"}
run_launcher:
  module: assets.launcher
  class: WarmRunLauncher
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: {DEQUEUE_INTERVAL_SECONDS}
concurrency:
  runs:
    max_concurrent_runs: {MAX_CONCURRENT_RUNS}
  pools:
    default_limit: 1
sensors:
  use_threads: true
  num_workers: {SENSOR_THREADS}
run_retries:
  enabled: true
  max_retries: {MAX_RUN_RETRIES}
  retry_on_asset_or_op_failure: true
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  cancel_timeout_seconds: 60
  max_resume_run_attempts: 0
  poll_interval_seconds: {RUN_MONITORING_POLL_SECONDS}
telemetry:
  enabled: false
"""


@dataclass
class Supervisor:
    """Children started by `kindex up`, each the leader of its own process group."""

    log_dir: Path
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (closed in stop_all)
        self._logs.append(log)
        child = subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stopped as a whole, not by terminal
            preexec_fn=_die_with_parent,
        )
        self.children[name] = child
        return child

    def exited(self) -> list[str]:
        return [name for name, child in self.children.items() if child.poll() is not None]

    def stop_all(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM every group, wait up to `grace` seconds in total, then SIGKILL what is left."""
        for child in reversed(self.children.values()):
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
        for child in self.children.values():
            # Also the group's stragglers (code servers) once the leader is gone.
            _signal_group(child, signal.SIGKILL)
            child.wait()
        for log in self._logs:
            log.close()


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signum)


def _die_with_parent() -> None:
    """Linux: a child is killed if `kindex up` itself is killed with SIGKILL (no orphan holds
    the UI's port). SIGKILL, as Dagster's processes may ignore SIGTERM."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class StopRequested(Exception):
    pass


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn the first SIGINT/SIGTERM into StopRequested in the main thread; ignore repeats, so
    a second Ctrl-C cannot interrupt the shutdown half-way. Restores the handlers after."""
    stopping = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise StopRequested(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def wait_until_ready(url: str, supervisor: Supervisor, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dead := supervisor.exited():
            raise RuntimeError(f"{', '.join(dead)} exited while starting; see the logs")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (the venv kindex runs from)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def dagster_env(
    base: Mapping[str, str], dagster_home: Path, s3_env: Mapping[str, str]
) -> dict[str, str]:
    env = {**base, **s3_env, "DAGSTER_HOME": str(dagster_home)}
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def banner(port: int, bucket: str, endpoint: str, incoming_prefix: str, home: Path) -> str:
    return f"""
kindex is up.
  Dagster UI     http://{HOST}:{port}   (asset graph: http://{HOST}:{port}/asset-groups)
  Drop files     kindex put FILE...
                 or: aws s3 cp FILE s3://{bucket}/{incoming_prefix} --endpoint-url {endpoint}
  Query          kindex query "select kernel, provider, count(*) from runs group by all"
  Logs           {home / "logs"}
Press Ctrl-C to stop everything.
"""


@dataclass
class ObjectStore:
    """Where the Dagster processes find S3: the configured endpoint, or the embedded server this
    `kindex up` uses (and watches) through its lease."""

    endpoint: str
    env: dict[str, str]
    lease: ServerLease | None = None
    restarts: list[float] = field(default_factory=list)

    def check(self) -> None:
        """Start the embedded server again if it died; raise S3Died when it cannot be."""
        if self.lease is None or self.lease.alive():
            return

        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < S3_RESTART_WINDOW_SECONDS] + [now]
        dead = self.lease.server.pid if self.lease.server else "?"
        if len(self.restarts) > MAX_S3_RESTARTS:
            raise S3Died(
                f"the embedded S3 server (pid {dead}) died {len(self.restarts)} times in "
                f"{S3_RESTART_WINDOW_SECONDS / 60:.0f} minutes; not restarting it again"
            )
        print(
            f"kindex up: the embedded S3 server (pid {dead}) died; starting it again...",
            file=sys.stderr,
            flush=True,
        )
        try:
            server = self.lease.restart()
        except EmbeddedS3Error as error:
            raise S3Died(
                f"the embedded S3 server died and could not be restarted: {error}"
            ) from error
        print(
            f"kindex up: the embedded S3 server is back on {server.endpoint_url} (pid "
            f"{server.pid}, {time.monotonic() - now:.1f} s)",
            file=sys.stderr,
            flush=True,
        )


class S3Died(RuntimeError):
    pass


@contextlib.contextmanager
def _object_store(settings: Settings, log_dir: Path) -> Iterator[ObjectStore]:
    """The configured endpoint, or the home's embedded SeaweedFS, held for the lifetime of
    `kindex up` (started unless another command already runs it)."""
    if settings.s3_endpoint:
        yield ObjectStore(str(settings.s3_endpoint), {})
        return

    lease = ServerLease(settings.home, port=settings.s3_port, log_path=log_dir / "s3.log")
    with lease as server:
        running = settings.replace(s3_port=server.port)
        S3Store.from_settings(running).ensure_bucket()  # the sensor lists it from the start
        env = {"KINDEX_HOME": str(settings.home), "KINDEX_S3_PORT": str(running.s3_port)}
        yield ObjectStore(running.endpoint_url, env, lease)


def write_up_file(home: Path, url: str) -> Path:
    """`$KINDEX_HOME/up.json`, replaced atomically: readers see the old file or the new one."""
    path = home / UP_FILE
    tmp = path.with_name(f".{UP_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}), encoding="utf-8")
    os.replace(tmp, path)
    return path


def remove_up_file(home: Path) -> None:
    """Remove up.json if this process wrote it (a later `kindex up` may have replaced it)."""
    path = home / UP_FILE
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        if json.loads(path.read_text(encoding="utf-8"))["pid"] == os.getpid():
            path.unlink()


def free_port() -> int:
    """A port free on the loopback now (the code server binds it a moment later)."""

    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, supervisor: Supervisor, timeout: float) -> None:
    """Until something accepts connections on the loopback port (the code server's)."""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dead := supervisor.exited():
            raise RuntimeError(f"{', '.join(dead)} exited while starting; see the logs")
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing answered on {HOST}:{port} within {timeout:.0f} s")


def workspace_yaml(port: int) -> str:
    """The workspace of the webserver and the daemon: the one code server `kindex up` runs."""
    return f"""\
# Written by `kindex up`; rewritten on every start.
load_from:
  - grpc_server:
      host: {HOST}
      port: {port}
      location_name: definitions
"""


def prepare_instance(env: Mapping[str, str], log_dir: Path) -> None:
    """Create the instance's SQLite storages once, before the webserver, the daemon and their code
    servers open them together: concurrent first opens can stamp a schema twice, after which
    nothing loads (alembic: "more than one head")."""
    with (log_dir / "dagster-instance.log").open("ab") as log:
        done = subprocess.run(
            [_bin("dagster"), "instance", "migrate"], env=dict(env), stdout=log, stderr=log
        )
    if done.returncode != 0:
        raise RuntimeError(f"preparing the Dagster instance failed (exit {done.returncode})")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    home = Path(settings.home)
    log_dir = home / "logs"
    dagster_home = home / "dagster"
    log_dir.mkdir(parents=True, exist_ok=True)
    dagster_home.mkdir(parents=True, exist_ok=True)
    (dagster_home / "dagster.yaml").write_text(dagster_instance_yaml(home), encoding="utf-8")

    supervisor = Supervisor(log_dir)
    with stop_on_signals(), contextlib.ExitStack() as stack:
        try:
            store = stack.enter_context(_object_store(settings, log_dir))
            env = dagster_env(os.environ, dagster_home, store.env)
            prepare_instance(env, log_dir)
            # One code server for the webserver and the daemon, which both reach it through the
            # workspace: given the module itself, the daemon starts a code server of its own
            # and replaces it every minute (Dagster reloads a daemon's local code that often).
            code_port = free_port()
            supervisor.start(
                "dagster-code-server",
                [_bin("dagster"), "code-server", "start", "-m", "definitions", "-h", HOST]
                + ["-p", str(code_port), "--location-name", "definitions"],
                env,
            )
            wait_for_port(code_port, supervisor, READY_TIMEOUT_SECONDS)
            # Runs start as forks of this process, which imported dagster and the definitions
            # once, rather than each in a new interpreter importing them (assets/run_worker.py).
            supervisor.start("dagster-run-worker", [sys.executable, "-m", "assets.run_worker"], env)
            workspace = dagster_home / "workspace.yaml"
            workspace.write_text(workspace_yaml(code_port), encoding="utf-8")
            module = ["-w", str(workspace)]
            supervisor.start(
                "dagster-webserver",
                [_bin("dagster-webserver"), "-h", HOST, "-p", str(args.port), *module],
                env,
            )
            # Warnings up: at info the daemon logs every sensor tick, a line a second at rest
            # (the ticks are in the UI's sensor history).
            daemon = [_bin("dagster-daemon"), "run", "--log-level", "warning", *module]
            supervisor.start("dagster-daemon", daemon, env)
            wait_until_ready(
                f"http://{HOST}:{args.port}/server_info", supervisor, READY_TIMEOUT_SECONDS
            )
            write_up_file(home, f"http://{HOST}:{args.port}")
            print(
                banner(args.port, settings.bucket, store.endpoint, settings.incoming_prefix, home),
                flush=True,
            )
            while not (dead := supervisor.exited()):
                store.check()
                time.sleep(POLL_SECONDS)
            print(f"kindex up: {', '.join(dead)} exited; stopping. See {log_dir}", file=sys.stderr)
            return 1
        except StopRequested as stop:
            print(f"kindex up: {stop}, stopping...", file=sys.stderr, flush=True)
            return 0
        except (RuntimeError, TimeoutError, StorageError) as error:
            print(f"kindex up: {error}; stopping. Logs in {log_dir}", file=sys.stderr, flush=True)
            return 1
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):  # restored by stop_on_signals
                signal.signal(signum, signal.SIG_IGN)
            remove_up_file(home)
            supervisor.stop_all()
