"""Real processes for the deployment test: a PostgreSQL server in a temporary cluster and the
Dagster processes of deploy/, each started in its own session and stopped by PID."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HOST = "127.0.0.1"
POLL_SECONDS = 0.5
# How long a process may take to stop on its signal: a code server lets a sensor tick it is
# evaluating finish first, which takes a while on a loaded machine.
STOP_GRACE_SECONDS = 60.0
POSTGRES_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/*/bin")
UNPRIVILEGED_USERS = ("postgres", "nobody")  # initdb and postgres refuse to run as root


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


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return "?"


def descendants(*pids: int) -> set[int]:
    """Every live process below `pids`, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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


def postgres_bin_dir() -> Path | None:
    """The directory holding `initdb` and `postgres` (PATH first, then Debian's layout)."""
    candidates: list[Path] = []
    if found := shutil.which("initdb"):
        candidates.append(Path(found).resolve().parent)
    for pattern in POSTGRES_DIRS:
        matches = sorted(Path("/").glob(pattern.lstrip("/")), key=_version_key, reverse=True)
        candidates.extend(matches)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "postgres").exists():
            return directory.resolve()
    return None


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", str(path))) or (0,)


class PostgresServer:
    """A throwaway cluster on 127.0.0.1 with its unix socket beside its data.

    Its directory comes from `tempfile` rather than pytest's tmp_path: the server runs as an
    unprivileged user when the tests run as root, and pytest's base directory is root-only."""

    def __init__(self, bin_dir: Path, processes: Processes) -> None:
        self.bin_dir = bin_dir
        self.processes = processes
        self.port = free_port()
        self.username = "dagster"
        self.password = secrets.token_hex(12)
        self.database = "dagster"
        self.root = Path(tempfile.mkdtemp(prefix="kindex-pg-"))
        self.user: dict[str, Any] = {}
        if os.geteuid() == 0:
            account = _unprivileged_account()
            self.user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            os.chown(self.root, account.pw_uid, account.pw_gid)

    @property
    def env(self) -> dict[str, str]:
        """The variables deploy/dagster.yaml reads."""
        return {
            "DAGSTER_PG_HOST": HOST,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": self.database,
            "DAGSTER_PG_USERNAME": self.username,
            "DAGSTER_PG_PASSWORD": self.password,
        }

    def start(self, timeout: float) -> None:
        password_file = self.root / "password"
        password_file.write_text(self.password + "\n")
        if self.user:
            os.chown(password_file, self.user["user"], self.user["group"])
        # Password authentication over TCP, as against a managed server.
        initdb = [
            str(self.bin_dir / "initdb"),
            f"--pgdata={self.root / 'data'}",
            f"--username={self.username}",
            f"--pwfile={password_file}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "--locale=C",
            "--encoding=UTF8",
            "--no-sync",
        ]
        done = subprocess.run(
            initdb, cwd=self.root, capture_output=True, text=True, timeout=timeout, **self.user
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr}")
        password_file.unlink()
        # A test's cluster: durability off, which changes nothing the test observes.
        postgres = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.root / "data"),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={HOST}",
            "-c",
            f"unix_socket_directories={self.root}",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]
        self.processes.start("postgres", postgres, os.environ, cwd=self.root, **self.user)
        wait_for(
            self._create_database,
            timeout,
            "PostgreSQL accepting connections",
            self.processes.check_alive,
        )

    def connect(self, database: str | None = None) -> Any:
        import psycopg2

        return psycopg2.connect(
            host=HOST,
            port=self.port,
            user=self.username,
            password=self.password,
            dbname=database or self.database,
            connect_timeout=5,
        )

    def _create_database(self) -> bool:
        import psycopg2

        try:
            connection = self.connect("postgres")
        except psycopg2.OperationalError:
            return False
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {self.database}")
        finally:
            connection.close()
        return True

    # Fast shutdown: sessions are ended, the cluster is left consistent.
    STOP_SIGNAL = signal.SIGINT

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _unprivileged_account() -> pwd.struct_passwd:
    for name in UNPRIVILEGED_USERS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError(f"running as root and none of {UNPRIVILEGED_USERS} exists for PostgreSQL")


def grpc_server_serving(port: int) -> bool:
    """The code server answers the standard gRPC health check (it binds after loading code)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="DagsterApi"), timeout=2
            )
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)
