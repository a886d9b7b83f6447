"""What the two parallel paths (`kindex normalize` relay, parallel record tables) share about
the worker processes they fork."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from multiprocessing.process import BaseProcess

STOP_GRACE_SECONDS = 5.0


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_signals() -> None:
    """Run first in a forked worker. A fork inherits the parent's Python signal handlers, and a
    handler that does not raise (Dagster and test runners install such) lets a worker blocked
    on a pipe outlive `terminate()`; then the parent's interpreter waits for it at exit."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop(processes: Iterable[BaseProcess]) -> None:
    """End workers that are still running: SIGTERM, and SIGKILL for any that outlive the grace."""
    processes = list(processes)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(STOP_GRACE_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()
