"""`kindex up`: the embedded S3 (unless an endpoint is configured), the Dagster webserver and the
Dagster daemon on 127.0.0.1, sensors and automation running. Ctrl-C or SIGTERM stops all of it.

Every child runs in its own process group and is stopped by group (the webserver and daemon
spawn code servers of their own), first with SIGTERM, then SIGKILL after a grace period. Signals
are handled here rather than left to the children: started from a shell with `&`, Dagster's
processes ignore SIGINT and SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

DEFAULT_PORT = 3000
HOST = "127.0.0.1"
STOP_GRACE_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 180.0
# A run coordinator queue: a burst of drops must not start dozens of run processes at once.
MAX_CONCURRENT_RUNS = 4


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start the embedded S3, the Dagster webserver and daemon; Ctrl-C stops them",
        description=__doc__,
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="webserver port")
    parser.set_defaults(func=run)


def dagster_instance_yaml(home: Path) -> str:
    """The local instance: SQLite storage under the kindex home, a queued run coordinator, and
    a pool of one for the index writer (the only pool kindex declares)."""
    return f"""\
# Written by `kindex up`; rewritten on every start.
local_artifact_storage:
  module: dagster.core.storage.root
  class: LocalArtifactStorage
  config:
    base_dir: {home / "dagster" / "storage"}
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
concurrency:
  runs:
    max_concurrent_runs: {MAX_CONCURRENT_RUNS}
  pools:
    default_limit: 1
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
    """Linux: a child gets SIGTERM if `kindex up` itself is killed with SIGKILL (no orphan)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


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


@contextlib.contextmanager
def _object_store(settings: Any, log_dir: Path) -> Iterator[tuple[dict[str, str], str]]:
    """The configured endpoint, or an embedded SeaweedFS for the lifetime of `kindex up`.
    Yields the environment the Dagster processes need to reach it, and its endpoint URL."""
    if settings.s3_endpoint:
        yield {}, str(settings.s3_endpoint)
        return
    from pipelines.storage.embedded import EmbeddedS3
    from pipelines.storage.s3 import S3Store

    with EmbeddedS3.from_settings(settings, log_path=log_dir / "s3.log") as server:
        S3Store.from_settings(settings).ensure_bucket()  # the sensor lists it from the start
        yield dict(server.client_env()), server.endpoint_url


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
    from pipelines.settings import Settings

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
            s3_env, endpoint = stack.enter_context(_object_store(settings, log_dir))
            env = dagster_env(os.environ, dagster_home, s3_env)
            prepare_instance(env, log_dir)
            module = ["-m", "definitions"]
            supervisor.start(
                "dagster-webserver",
                [_bin("dagster-webserver"), "-h", HOST, "-p", str(args.port), *module],
                env,
            )
            supervisor.start("dagster-daemon", [_bin("dagster-daemon"), "run", *module], env)
            wait_until_ready(
                f"http://{HOST}:{args.port}/server_info", supervisor, READY_TIMEOUT_SECONDS
            )
            print(
                banner(args.port, settings.bucket, endpoint, settings.incoming_prefix, home),
                flush=True,
            )
            while not (dead := supervisor.exited()):
                time.sleep(0.5)
            print(f"kindex up: {', '.join(dead)} exited; stopping. See {log_dir}", file=sys.stderr)
            return 1
        except StopRequested as stop:
            print(f"kindex up: {stop}, stopping...", file=sys.stderr, flush=True)
            return 0
        except (RuntimeError, TimeoutError) as error:
            print(f"kindex up: {error}; logs in {log_dir}", file=sys.stderr)
            return 1
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):  # restored by stop_on_signals
                signal.signal(signum, signal.SIG_IGN)
            supervisor.stop_all()
