"""The index at fleet size: ingest memory and time as the index grows, and queries at size.

Builds an index of --files Liger CSVs of --rows rows each (default 10 x 1M: ~10M runs), each
made of the shared CSV's real rows with shifted timestamps, every file re-measuring the cases of
the one before, later than all its runs (so all but the newest run of each case end superseded),
ingested one by one with `kindex ingest` (a fresh process each) into one fresh home. Prints, in
one run:
1. the last file's ingest against the first's: wall time and peak RSS (target <= 1.5x each);
2. a 20-row file (later runs of 20 of the cases) into the big index against into an empty home,
   the median of --repeats each (target <= 1.5x each);
3. five queries through `kindex query` at full size against the same at --small runs (an index
   of one --small-row file built alike): median wall time (process start included) and peak
   RSS of --repeats (target <= 2x each and under 1 GB);
4. the number of data files a scan of `runs` opens (the run_segments files of the version);
5. the same five queries in a bare DuckDB that ran the statements of `kindex connect` (the
   bucket's Iceberg tables), at full size: the query's own time, after the statements;
6. what an old version costs: `select count(*) from runs --as-of` the first version.

Peak RSS is the largest of the command's processes (wait4's ru_maxrss). Each home's embedded S3
server runs for the whole benchmark (as under `kindex up`): no command pays its start. Usage:

    python benchmarks/index_scale.py [--files 10] [--rows 1000000] [--small 20000]
                                     [--repeats 3] [--write-docs]

Iterate at a reduced size (`--files 3 --rows 300000`); the full size takes 10-20 minutes.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED_CSV = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
KINDEX = str(Path(sys.executable).with_name("kindex"))

QUERIES = {
    "count runs": "select count(*) from runs",
    "speedups (README)": (
        "SELECT mode, count(*) AS workloads, round(min(speedup), 2) AS min, "
        "round(median(speedup), 2) AS median, round(max(speedup), 2) AS max FROM speedups "
        "WHERE kernel = 'jsd' AND gpu = 'NVIDIA B200' AND metric = 'latency' "
        "AND provider = 'liger' GROUP BY mode ORDER BY mode"
    ),
    "latest runs (README)": (
        "SELECT gpu, liger_version, provider, case_key, round(median / 1e6, 3) AS ms, "
        "observed_at FROM latest_runs WHERE kernel = 'layer_norm' AND metric = 'latency' "
        "AND mode = 'forward' QUALIFY row_number() OVER (PARTITION BY gpu, provider "
        "ORDER BY observed_at DESC, case_key) = 1 ORDER BY gpu, provider"
    ),
    "group by over runs": (
        "select kernel, gpu, provider, count(*) as n from runs group by all order by all"
    ),
    "count regressions": "select count(*) from regressions",
}

# A bare DuckDB (no kindex imported): runs the statements on stdin, then each query, timed.
BARE_DUCKDB = """
import json, sys, time
import duckdb
text = "\\n".join(line for line in sys.stdin.read().splitlines() if not line.startswith("--"))
statements = [s for s in text.split(";\\n") if s.strip()]
con = duckdb.connect(config={"autoinstall_known_extensions": False,
                             "autoload_known_extensions": False})
began = time.perf_counter()
for statement in statements:
    con.execute(statement)
setup = time.perf_counter() - began
began = time.perf_counter()
rows = con.execute(sys.argv[1]).fetchall()
print(json.dumps({"setup": setup, "query": time.perf_counter() - began, "rows": len(rows)}))
"""


@dataclass(frozen=True, slots=True)
class Measured:
    seconds: float
    rss_mb: float
    stdout: str


def run_with_rusage(command: list[str], env: dict[str, str], stdin: str | None = None) -> Measured:
    """Run a command (stderr shows); its wall time, stdout, and the peak RSS of its largest
    process (reaped with wait4)."""
    began = time.perf_counter()
    read_out, write_out = os.pipe()
    read_in, write_in = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: stdin from the pipe, stdout into the other, stderr kept
        os.dup2(read_in, 0)
        os.dup2(write_out, 1)
        for fd in (read_out, write_out, read_in, write_in):
            os.close(fd)
        os.execvpe(command[0], command, env)
    os.close(read_in)
    os.close(write_out)
    with os.fdopen(write_in, "w") as feed:
        if stdin is not None:
            feed.write(stdin)
    with os.fdopen(read_out) as output:
        out = output.read()
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{' '.join(command[:4])} failed: {out[-2000:]}")
    return Measured(seconds, usage.ru_maxrss / 1024, out)


def shared_rows() -> tuple[list[str], list[list[str]]]:
    with SHARED_CSV.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        return header, list(reader)


def csv_span() -> timedelta:
    """More than the shared CSV's time span: a file shifted by it holds only later runs."""
    header, shared = shared_rows()
    at = header.index("timestamp")
    times = [datetime.strptime(row[at], TIME_FORMAT) for row in shared]
    return max(times) - min(times) + timedelta(days=1)


def shifted_csv(
    path: Path,
    rows: int,
    first_replica: int,
    base: list[list[str]] | None = None,
    later: timedelta = timedelta(0),
) -> Path:
    """`rows` rows: replicas of the shared CSV (or of `base`), replica r's timestamps shifted
    by r minutes (the same cases measured again later), from `first_replica` on, and all by
    `later`."""
    header, shared = shared_rows()
    source = base or shared
    at = header.index("timestamp")
    with path.open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        written, replica = 0, first_replica
        while written < rows:
            shift = later + timedelta(minutes=replica)
            for fields in source[: rows - written]:
                row = list(fields)
                row[at] = (datetime.strptime(row[at], TIME_FORMAT) + shift).strftime(TIME_FORMAT)
                writer.writerow(row)
            written += min(len(source), rows - written)
            replica += 1
    return path


PORTS: dict[Path, int] = {}
SERVERS = ExitStack()


def kindex_env(home: Path) -> dict[str, str]:
    """The environment of a kindex command on `home`: its own port block (others' servers may
    hold the default one), its embedded server already running (started here on first use and
    held to the end, as `kindex up` would: no command pays its start)."""
    from pipelines.storage.embedded import find_free_port_block

    if home not in PORTS:
        PORTS[home] = find_free_port_block()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KINDEX_")}
    env["KINDEX_HOME"] = str(home)
    env["KINDEX_S3_PORT"] = str(PORTS[home])
    if home not in SERVED:
        SERVED.add(home)
        SERVERS.enter_context(served(env))
    return env


SERVED: set[Path] = set()


@contextmanager
def served(env: dict[str, str]) -> Iterator[None]:
    from pipelines.settings import Settings
    from pipelines.storage.s3 import store_session

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        settings = Settings.from_env()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    with store_session(settings):
        yield


def ingest(home: Path, path: Path) -> Measured:
    return run_with_rusage([KINDEX, "ingest", "--no-progress", str(path)], kindex_env(home))


def query(home: Path, sql: str, *extra: str) -> Measured:
    return run_with_rusage([KINDEX, "query", sql, "--format", "csv", *extra], kindex_env(home))


def medians(samples: list[Measured]) -> tuple[float, float]:
    return (
        statistics.median(m.seconds for m in samples),
        statistics.median(m.rss_mb for m in samples),
    )


def ratio_text(
    name: str, big: tuple[float, float], small: tuple[float, float], target: float
) -> str:
    return (
        f"{name}: {big[0]:.2f} s / {big[1]:,.0f} MB vs {small[0]:.2f} s / {small[1]:,.0f} MB "
        f"= {big[0] / small[0]:.2f}x time, {big[1] / small[1]:.2f}x RSS (target <= {target}x)"
    )


def run_segment_files(home: Path) -> int:
    import duckdb

    database = (home / "index.duckdb").resolve()
    con = duckdb.connect(str(database), read_only=True)
    try:
        row = con.execute(
            "SELECT count(*) FROM kindex_internal.files WHERE tbl = 'run_segments'"
        ).fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0


def first_version(home: Path) -> str:
    from pipelines.index.catalog import IndexCatalog
    from pipelines.settings import Settings
    from pipelines.storage.s3 import store_session

    saved = dict(os.environ)
    os.environ.update(kindex_env(home))
    try:
        settings = Settings.from_env()
        with store_session(settings) as store:
            versions = IndexCatalog.beside(store, settings).versions()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return str(versions[0].version)


def bare_duckdb(home: Path, repeats: int) -> dict[str, float]:
    """Each query's median time in a bare DuckDB over `kindex connect`'s statements (the
    embedded server held up meanwhile)."""
    times: dict[str, float] = {}
    statements = run_with_rusage([KINDEX, "connect"], kindex_env(home)).stdout
    for name, sql in QUERIES.items():
        samples = []
        for _ in range(repeats):
            measured = run_with_rusage(
                [sys.executable, "-I", "-c", BARE_DUCKDB, sql], kindex_env(home), statements
            )
            result = json.loads(measured.stdout.splitlines()[-1])
            samples.append(result["query"])
        times[name] = statistics.median(samples)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build in this folder and keep it")
    from report import Figure, add_write_docs, write_figures

    add_write_docs(parser)
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="kindex-index-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    figures: list[Figure] = []
    size = f"{args.files} x {args.rows:,}"
    try:
        _, shared = shared_rows()
        per_file = math.ceil(args.rows / len(shared))
        span = csv_span()
        window = timedelta(minutes=per_file * (args.files + 2))
        big = work / "home-big"
        builds: list[Measured] = []
        for k in range(args.files):
            # Each file later than every run of the one before (its replicas' minutes included):
            # it supersedes the newest runs, as a fleet's next day of measurements does.
            path = shifted_csv(
                work / f"file-{k:02}.csv", args.rows, k * per_file, later=k * (span + window)
            )
            builds.append(ingest(big, path))
            path.unlink()
            print(
                f"ingest {k + 1}/{args.files}: {builds[-1].seconds:.1f} s, "
                f"peak RSS {builds[-1].rss_mb:,.0f} MB",
                flush=True,
            )
        first, last = builds[0], builds[-1]
        line = ratio_text(
            f"last vs first {args.rows:,}-row ingest",
            (last.seconds, last.rss_mb),
            (first.seconds, first.rss_mb),
            1.5,
        )
        print(line)
        figures.append(
            Figure(
                f"index_scale: last vs first ingest ({size})",
                line.split(": ", 1)[1].split(" (target")[0],
                "<= 1.5x each",
            )
        )

        # 20 rows: later runs of 20 cases (the replicas after every big file's).
        later = (args.files + 1) * per_file
        into_big, into_empty = [], []
        for i in range(args.repeats):
            small_file = shifted_csv(
                work / f"twenty-{i}.csv", 20, later + i, later=(args.files + i) * (span + window)
            )
            into_big.append(ingest(big, small_file))
            into_empty.append(ingest(work / f"home-empty-{i}", small_file))
        line = ratio_text(
            "20-row file into the big index vs into an empty home",
            medians(into_big),
            medians(into_empty),
            1.5,
        )
        print(line)
        figures.append(
            Figure(
                f"index_scale: 20-row file into {size} vs empty",
                line.split(": ", 1)[1].split(" (target")[0],
                "<= 1.5x each",
            )
        )

        small = work / "home-small"
        ingest(small, shifted_csv(work / "small.csv", args.small, 0))
        ok = True
        start = medians([query(small, "select 1") for _ in range(args.repeats)])
        print(f"process start (`kindex query 'select 1'`): {start[0]:.2f} s / {start[1]:,.0f} MB")
        for name, sql in QUERIES.items():
            at_size = medians([query(big, sql) for _ in range(args.repeats)])
            at_small = medians([query(small, sql) for _ in range(args.repeats)])
            line = ratio_text(f"query {name}", at_size, at_small, 2)
            print(f"{line}; {at_size[0] - start[0]:.2f} s past process start")
            ok = ok and at_size[1] < 1024
            figures.append(
                Figure(
                    f"index_scale: query {name} at {size} vs {args.small:,} runs",
                    line.split(": ", 1)[1].split(" (target")[0],
                    "<= 2x, < 1 GB",
                )
            )
        count = query(big, "select count(*) as runs, count(superseded_by) as superseded from runs")
        print(f"runs, superseded at full size: {count.stdout.splitlines()[1]}")
        files = run_segment_files(big)
        print(f"a scan of runs opens {files} data files (run_segments)")
        figures.append(Figure(f"index_scale: files a runs scan opens ({size})", str(files)))

        old = first_version(big)
        as_of = [query(big, "select count(*) from runs", "--as-of", old) for _ in range(2)]
        print(
            f"--as-of the first version: {as_of[0].seconds:.2f} s / {as_of[0].rss_mb:,.0f} MB "
            f"the first time (builds its database), {as_of[1].seconds:.2f} s / "
            f"{as_of[1].rss_mb:,.0f} MB again"
        )
        bare = bare_duckdb(big, args.repeats)
        for name, seconds in bare.items():
            print(f"bare DuckDB over kindex connect, {name}: {seconds:.2f} s (the query alone)")
        figures.append(
            Figure(
                f"index_scale: bare DuckDB (kindex connect) queries at {size}",
                ", ".join(f"{name} {seconds:.2f} s" for name, seconds in bare.items()),
            )
        )
        if args.write_docs:
            write_figures(figures)
        return 0 if ok else 1
    finally:
        SERVERS.close()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.exit(main())
