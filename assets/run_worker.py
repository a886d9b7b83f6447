"""A run worker that stays up: `kindex up` starts it beside the code server, and the instance's
run launcher (`WarmRunLauncher`) hands it each run to start.

Dagster's default launcher asks the code server to start a run, and the code server spawns a
fresh interpreter that imports dagster and the definitions again before the run's first step: on
a busy machine that is most of a small batch's time. This process imports them once; for each run
it forks a child that runs `dagster api execute_run`, the same command a launcher of any kind
runs, found through the `dagster` console script. A run is still a process of its own (its
memory returns when it ends, a crash is its own, its pid is logged for the lost runs sensor).

It listens on a Unix socket in the Dagster home (mode 0600, in a folder only its owner reads), and
takes a run id only: the run's code origin comes from the instance's own record of the run.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dagster import DagsterInstance
from dagster._grpc.types import ExecuteRunArgs  # what every launcher gives that command

SOCKET_NAME = "run-worker.sock"
# A Unix socket's path must fit sockaddr_un (108 bytes on Linux, with its terminating NUL).
MAX_SOCKET_PATH = 100
REQUEST_BYTES = 4096
# What a run imports: the definitions, and what they import only on a run's way to the index
# (pyiceberg loads the SQL catalog's module, with SQLAlchemy's ORM, at the catalog's first open),
# or after it: matplotlib, for the window's speedup chart (more CPU than a small batch's files).
PRELOAD = (
    "definitions",
    "pyiceberg.catalog.sql",
    "matplotlib.figure",
    "matplotlib.ticker",
    "matplotlib.backends.backend_agg",
)


def socket_path(dagster_home: str | os.PathLike[str]) -> Path | None:
    """Where the home's run worker listens; None where the path is too long for a socket (runs
    then start the default way)."""
    path = Path(dagster_home) / SOCKET_NAME
    return path if len(os.fsencode(path)) <= MAX_SOCKET_PATH else None


def dagster_command() -> Callable[[], object]:
    """The `dagster` command's entry point, as its console script loads it (it reads sys.argv)."""
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="dagster")
    command: Callable[[], object] = script.load()
    return command


def execute_run(command: Callable[[], object], run_id: str) -> int:
    """In the forked child: run the run with the `dagster api execute_run` command; its exit
    code."""
    with DagsterInstance.get() as instance:
        run = instance.get_run_by_id(run_id)
        if run is None or run.job_code_origin is None:
            print(f"run worker: no run {run_id} with a code origin", file=sys.stderr)
            return 2
        args = ExecuteRunArgs(run.job_code_origin, run_id, None, set_exit_code_on_failure=True)
    argv = list(args.get_command_args())
    sys.argv = ["dagster", *argv[argv.index("api") :]]  # the console script reads its argv
    try:
        command()
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def reap() -> None:
    """Collect every child that ended (the runs' exit codes are in their own records)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def start_run(command: Callable[[], object], run_id: str, sockets: Sequence[socket.socket]) -> int:
    """Fork the run's process; its pid. The child closes the worker's `sockets` (a run that
    outlives the worker holds none of them)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the accept loop
        code = 1
        try:
            for each in sockets:
                each.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = execute_run(command, run_id)
        except BaseException as error:  # noqa: BLE001 (reported, then the child exits)
            print(f"run worker: run {run_id} failed to start: {error!r}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def warm_boto_session() -> None:
    """Load the S3 service model and endpoint rules into the process's boto3 session, which every
    run's first S3 client is made from: a client made here, never used (no connection opened, so
    nothing a fork could share), and the forks find the models loaded."""
    from pipelines.storage.s3 import boto_session, client_lock  # noqa: PLC0415  the worker only

    with client_lock():
        boto_session().client("s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9")


def serve(path: Path, preload: Sequence[str]) -> None:
    """Import `preload` (the definitions) and dagster's command, then start each requested run."""
    for module in preload:
        importlib.import_module(module)
    command = dagster_command()
    warm_boto_session()
    # Opening the instance imports its storages (SQLAlchemy, alembic) and a read prepares their
    # statements: once here, not per run. Closed before the first fork: no connection is shared
    # with a child.
    with DagsterInstance.get() as instance:
        instance.get_run_records(limit=1)
        instance.all_logs("")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old_umask)
    listener.listen(16)
    print(f"run worker: ready on {path} (pid {os.getpid()})", flush=True)
    # Children are reaped as they end, not only at the next request.
    signal.signal(signal.SIGCHLD, lambda signum, frame: reap())
    while True:
        try:
            connection, _ = listener.accept()
        except InterruptedError:
            continue
        with connection:
            try:
                request = json.loads(connection.recv(REQUEST_BYTES))
                run_id = str(request["run_id"])
                if not run_id:
                    raise ValueError("no run id")
                pid = start_run(command, run_id, [listener, connection])
                reply: dict[str, object] = {"pid": pid}
            except (ValueError, KeyError, TypeError, OSError) as error:
                reply = {"error": repr(error)}
            with contextlib.suppress(OSError):
                connection.sendall(json.dumps(reply).encode())


def request_run(path: Path, run_id: str, timeout: float = 10.0) -> int:
    """Ask the worker listening on `path` to start a run; the pid of the run's process. Raises
    OSError where no worker answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        client.connect(str(path))
        client.sendall(json.dumps({"run_id": run_id}).encode())
        client.shutdown(socket.SHUT_WR)
        reply = json.loads(client.recv(REQUEST_BYTES) or b"{}")
    if "pid" not in reply:
        raise OSError(f"the run worker did not start the run: {reply.get('error', 'no reply')}")
    return int(reply["pid"])


def main(argv: list[str] | None = None) -> None:
    """`python -m assets.run_worker [MODULE...]`: serve the runs of DAGSTER_HOME's instance, with
    the MODULEs (default: PRELOAD) imported before the first."""
    preload = (argv if argv is not None else sys.argv[1:]) or PRELOAD
    home = os.environ["DAGSTER_HOME"]
    path = socket_path(home)
    if path is None:
        sys.exit(f"run worker: {Path(home) / SOCKET_NAME} is too long for a Unix socket")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        serve(path, preload)
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


if __name__ == "__main__":
    main()
