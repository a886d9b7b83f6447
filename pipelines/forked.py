"""Processes: how many CPUs this one may use, how its workers start (the record sets of several
Liger files, pipelines/sources/liger/normalize.py), and whether a process is alive."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
from pathlib import Path


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def collect_garbage_rarely() -> None:
    """For a process that normalizes batches: they make and drop millions of small objects,
    none of them in cycles, so collect young garbage less often, and never scan what exists
    already (the curation, the modules, a forked parent's objects)."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


WorkerContext = (
    multiprocessing.context.ForkContext
    | multiprocessing.context.ForkServerContext
    | multiprocessing.context.SpawnContext
)


def worker_context(preload: str) -> WorkerContext:
    """A plain fork when this process runs one thread (`kindex normalize`, `kindex ingest`).
    Inside a Dagster run, whose threads may hold a lock at the moment of a fork and leave the
    child waiting forever, workers come from a forkserver that has imported `preload`; like
    spawn, a forkserver imports the caller's main module again in each worker, which Dagster's
    and kindex's entry points allow."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    assert isinstance(context, multiprocessing.context.ForkServerContext)
    context.set_forkserver_preload([preload])
    return context


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped, does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs: kill(0) is all there is
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
