"""The filer change feed at rest: one poll with nothing new, bucket empty vs full.

A poll runs `weed filer.meta.tail` over the time since its cursor, so its cost should follow
what is new, not what the bucket holds. On one embedded SeaweedFS, two buckets: one with
nothing under incoming/, one given `--objects` uploads (which its feed then reports). Once the
overlap the feed re-reads has passed (at rest), idle polls of the two alternate, so the noise
of a shared machine falls on both alike. CPU is user+sys of this process and of the weed child
each poll runs (getrusage); for scale, the full bucket's incoming/ listed once, as the listing
sensor does every tick.

    .venv/bin/python benchmarks/notifications.py [--objects 2000] [--polls 10] [--write-docs]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from report import Figure, add_write_docs, write_figures

from pipelines.intake.notifications import FilerFeed
from pipelines.intake.notifications.filer import DEFAULT_OVERLAP
from pipelines.settings import Settings
from pipelines.storage.embedded import start_on_free_ports
from pipelines.storage.s3 import S3Store

UPLOAD_THREADS = 8


def cpu_seconds() -> float:
    """User+sys CPU of this process and its reaped children (the weed each poll runs)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def idle_poll(feed: FilerFeed, cursor: str) -> tuple[float, float, str]:
    """CPU and wall seconds of one poll that finds nothing new, and its cursor."""
    cpu_start, wall_start = cpu_seconds(), time.perf_counter()
    page = feed.poll(cursor, 1000)
    wall = time.perf_counter() - wall_start
    assert page.changes == [], "nothing new was uploaded"
    return cpu_seconds() - cpu_start, wall, page.cursor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--polls", type=int, default=10)
    add_write_docs(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kindex-bench-") as tmp:
        home = Path(tmp)
        server = start_on_free_ports(home)
        try:
            settings = Settings(home=home, s3_port=server.port)
            full_store = S3Store.from_settings(settings.replace(bucket="full"))
            empty_store = full_store.with_bucket("empty")
            feeds: dict[str, FilerFeed] = {}
            cursors: dict[str, str] = {}
            for store in (empty_store, full_store):
                store.ensure_bucket()
                feeds[store.bucket] = FilerFeed.from_settings(settings.replace(bucket=store.bucket))
                cursors[store.bucket] = feeds[store.bucket].poll(None, 1000).cursor

            with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
                list(
                    pool.map(
                        lambda n: full_store.put(f"incoming/{n:06d}.csv", b"a,b\n1,2\n"),
                        range(args.objects),
                    )
                )
            found = 0
            while True:  # the feed reports the burst, a page at a time
                page = feeds["full"].poll(cursors["full"], 1000)
                found, cursors["full"] = found + len(page.changes), page.cursor
                if not page.changes:
                    break
            time.sleep(DEFAULT_OVERLAP.total_seconds() + 1)  # at rest: past the overlap

            cpu: dict[str, list[float]] = {"empty": [], "full": []}
            wall: dict[str, list[float]] = {"empty": [], "full": []}
            for _ in range(args.polls):
                for bucket in ("empty", "full"):
                    used, took, cursors[bucket] = idle_poll(feeds[bucket], cursors[bucket])
                    cpu[bucket].append(used)
                    wall[bucket].append(took)
            empty_cpu, full_cpu = (statistics.median(cpu[b]) for b in ("empty", "full"))
            empty_wall, full_wall = (statistics.median(wall[b]) for b in ("empty", "full"))

            cpu_start, wall_start = cpu_seconds(), time.perf_counter()
            listed = sum(1 for _ in full_store.list(settings.incoming_prefix))
            list_cpu, list_wall = cpu_seconds() - cpu_start, time.perf_counter() - wall_start
        finally:
            server.stop()

    ratio = full_cpu / empty_cpu
    print(f"the feed reported {found} of {args.objects} uploads")
    print(
        f"idle poll, median of {args.polls}: 0 objects {empty_cpu * 1000:.0f} ms CPU "
        f"({empty_wall * 1000:.0f} ms wall); {args.objects} objects {full_cpu * 1000:.0f} ms CPU "
        f"({full_wall * 1000:.0f} ms wall): ratio {ratio:.2f}"
    )
    print(
        f"for scale, one listing of incoming/ ({listed} keys): {list_cpu * 1000:.0f} ms CPU "
        f"({list_wall * 1000:.0f} ms wall)"
    )
    if args.write_docs:
        write_figures(
            [
                Figure(
                    f"notifications: idle filer poll, {args.objects} objects vs empty bucket (CPU)",
                    f"{ratio:.2f}x ({full_cpu * 1000:.0f} vs {empty_cpu * 1000:.0f} ms)",
                    "<= 1.5x",
                )
            ]
        )


if __name__ == "__main__":
    main()
