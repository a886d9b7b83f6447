"""Worker processes of the parallel paths (pipelines/sources/liger/relay.py: `kindex normalize` and
the
record tables of an ingest): how they start, what they reset first, and how they are stopped."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterable
from multiprocessing.process import BaseProcess
from pathlib import Path

import pyarrow as pa

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


def collect_garbage_rarely() -> None:
    """For a process that normalizes batches: they make and drop millions of small objects,
    none of them in cycles, so collect young garbage less often, and never scan what exists
    already (the curation, the modules, a forked parent's objects)."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


# glibc's mallopt parameters (malloc.h), and its ceiling on the mmap threshold on 64-bit systems
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20


def reuse_freed_memory() -> None:
    """For a worker that allocates and frees buffers of a few MB per batch: keep freed memory
    for the next batch instead of handing it back to the kernel.

    Arrow's default allocator (mimalloc) returns freed pages to the kernel within milliseconds,
    and glibc's malloc unmaps large blocks and trims its heap; each batch then faults in fresh
    zeroed pages, which cost the relay's workers ~1 s of kernel time per million Liger rows on
    a 2-core VM (their system time 1.7-1.9 s, 0.6-0.7 s with this). So Arrow allocates from
    malloc here, and glibc keeps blocks up to 32 MiB in its heap and never trims it (a worker
    ends with its file). Where malloc is not glibc's, Arrow's allocator is changed only."""
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS has no mallopt)
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # an int: its largest


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
