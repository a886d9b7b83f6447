"""The deployment test's PostgreSQL server, in a temporary cluster, and the gRPC health check of
its code server. The processes themselves are tests/process_support.py's `Processes`."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from process_support import HOST, Processes, free_port, wait_for

POSTGRES_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/*/bin")
UNPRIVILEGED_USERS = ("postgres", "nobody")  # initdb and postgres refuse to run as root


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
