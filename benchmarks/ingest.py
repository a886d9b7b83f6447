"""Ingest throughput and cost-follows-new-work, against the embedded S3 (SeaweedFS).

Prints, in one run:
1. end-to-end `ingest_paths` rows/s of a 1M-row Liger CSV, each ingest into a fresh kindex home
   and server and in a fresh process, as `kindex ingest` runs (its workers fork from it; a
   process that published before holds pyiceberg's idle threads, and its workers would come from
   a forkserver, as in a Dagster run), its imports done before the clock starts, as DuckDB's
   are; next to DuckDB CSV->Parquet (zstd) rows/s on the same file, in --big-repeats
   pairs: DuckDB right before each ingest, as this machine's speed drifts from one minute to the
   next, and each pair after a sync, so that the disk writes of one pair (~300 MB: an ingest's
   bucket and cache) are not flushed while the next one is timed. The ratio is the median of the
   pairs' ratios (target >= 0.1);
2. the median time to ingest a 100-row file into an index of 10k runs and into one of 1M runs
   (target: the second at most 3x the first).

The big file is the shared CSV replicated with distinct x values and timestamps, so almost every
row is a distinct run of a distinct case (28 runs of a million are superseded). Usage:

    python benchmarks/ingest.py [--rows 1000000] [--small-index 10000] [--repeats 5]
                                [--big-repeats 3]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED_CSV = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def replicated_csv(path: Path, rows: int, offset: int = 0) -> Path:
    """`rows` data rows: replica r of the shared CSV has x + (offset + r) * 1_000_000... made
    distinct by shifting x by the replica number and the timestamp by that many seconds."""
    with SHARED_CSV.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        base = list(reader)
    x, ts = header.index("x_value"), header.index("timestamp")
    with path.open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        written = 0
        replica = offset
        while written < rows:
            shift = timedelta(seconds=replica)
            for fields in base[: rows - written]:
                row = list(fields)
                row[x] = str(int(float(row[x])) + replica * 7919)
                row[ts] = (datetime.strptime(row[ts], TIME_FORMAT) + shift).strftime(TIME_FORMAT)
                writer.writerow(row)
            written += min(len(base), rows - (written))
            replica += 1
    return path


def duckdb_rows_per_second(csv_path: Path, workdir: Path) -> float:
    start = time.perf_counter()
    con = duckdb.connect()
    rows = con.execute(
        f"COPY (SELECT * FROM read_csv('{csv_path}')) TO '{workdir / 'duck.parquet'}' "
        "(FORMAT parquet, COMPRESSION zstd)"
    ).fetchone()
    con.close()
    assert rows is not None
    return int(rows[0]) / (time.perf_counter() - start)


@contextmanager
def kindex_instance(home: Path) -> Iterator[tuple[Any, Any]]:
    """Settings and a store for one kindex home, with its embedded S3 server running."""
    from pipelines.storage.embedded import start_on_free_ports
    from pipelines.storage.s3 import S3Store

    os.environ["KINDEX_HOME"] = str(home)
    # Free ports, not the default 8333 a running `kindex up` may hold.
    with start_on_free_ports(home) as running:
        settings = running.settings
        store = S3Store.from_settings(settings)
        store.ensure_bucket()
        yield settings, store


def timed_ingest(paths: list[Path], settings: Any, store: Any) -> tuple[float, Any]:
    from pipelines.ingest import ingest_paths

    start = time.perf_counter()
    summary = ingest_paths(paths, settings, progress=False, store=store)
    return time.perf_counter() - start, summary


def ingest_in_fresh_process(path: Path, home: Path) -> tuple[float, int, int]:
    """Seconds, rows and indexed runs of one ingest of `path` into `home`, in a new process."""
    command = [sys.executable, __file__, "--ingest-into", str(home), str(path)]
    result = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)  # stderr shows
    measured = json.loads(result.stdout.splitlines()[-1])
    return measured["seconds"], measured["rows"], measured["runs"]


def ingest_here(home: Path, path: Path) -> None:
    """The child of ingest_in_fresh_process: the modules the first ingest and publish load
    imported first, then one timed ingest, printed as JSON."""
    import pyiceberg.catalog.sql  # noqa: F401  (loaded by the first publish's catalog)

    import pipelines.index.publish  # noqa: F401
    import pipelines.intake.snapshots  # noqa: F401
    import pipelines.sources.bundles.sniff  # noqa: F401

    with kindex_instance(home) as (settings, store):
        elapsed, summary = timed_ingest([path], settings, store)
    runs = summary.index.counts.get("runs", 0)
    print(json.dumps({"seconds": elapsed, "rows": summary.rows, "runs": runs}))


def small_file_times(
    settings: Any, store: Any, workdir: Path, repeats: int, tag: str
) -> list[float]:
    times = []
    for i in range(repeats):
        # Offsets far past the big files' replicas: new cases, new runs.
        small = replicated_csv(workdir / f"small-{tag}-{i}.csv", 100, offset=10_000_000 + i)
        elapsed, summary = timed_ingest([small], settings, store)
        assert summary.index.new_runs == 100, summary.index
        times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small-index", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--big-repeats", type=int, default=3)
    parser.add_argument("--ingest-into", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ingest_into:
        ingest_here(*args.ingest_into)
        return
    with tempfile.TemporaryDirectory(prefix="kindex-bench-") as tmp:
        workdir = Path(tmp)
        big = replicated_csv(workdir / "big.csv", args.rows)
        medium = replicated_csv(workdir / "medium.csv", args.small_index, offset=5_000_000)
        with kindex_instance(workdir / "home-small") as (settings, store):
            elapsed, _ = timed_ingest([medium], settings, store)
            print(f"index of {args.small_index:,} runs built in {elapsed:.1f} s")
            small_times = small_file_times(settings, store, workdir, args.repeats, "a")
        ducks: list[float] = []
        ingests: list[float] = []
        for attempt in range(args.big_repeats):
            os.sync()  # the last pair's writes reach the disk now, not while this pair is timed
            ducks.append(duckdb_rows_per_second(big, workdir))
            home = workdir / f"home-big-{attempt}"
            elapsed, rows, runs = ingest_in_fresh_process(big, home)
            assert runs == args.rows, runs
            ingests.append(rows / elapsed)
        with kindex_instance(home) as (settings, store):  # the last one's million runs
            big_times = small_file_times(settings, store, workdir, args.repeats, "b")
        print(
            f"DuckDB CSV->Parquet (zstd): median {statistics.median(ducks):,.0f} rows/s  "
            f"({args.rows:,} rows; {', '.join(f'{d / 1000:,.0f}k' for d in ducks)})"
        )
        print(
            f"kindex ingest end to end: median {statistics.median(ingests):,.0f} rows/s  "
            f"(each run indexed; {', '.join(f'{k / 1000:,.1f}k' for k in ingests)})"
        )
        ratios = [k / d for k, d in zip(ingests, ducks, strict=True)]
        print(
            f"ratio kindex/DuckDB: median {statistics.median(ratios):.3f} of the pairs' "
            f"({', '.join(f'{r:.3f}' for r in ratios)})  (target >= 0.1)"
        )
        small_median, big_median = statistics.median(small_times), statistics.median(big_times)
        print(
            f"100-row file into {args.small_index:,}-run index: median {small_median:.3f} s "
            f"({', '.join(f'{t:.3f}' for t in small_times)})"
        )
        print(
            f"100-row file into {args.rows:,}-run index: median {big_median:.3f} s "
            f"({', '.join(f'{t:.3f}' for t in big_times)})"
        )
        print(f"ratio big/small: {big_median / small_median:.2f}  (target <= 3)")


if __name__ == "__main__":
    main()
