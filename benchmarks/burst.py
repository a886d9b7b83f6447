"""A burst of small files dropped at once under a real `kindex up`, against `kindex ingest` and
DuckDB, on the same files.

Starts `kindex up` (embedded SeaweedFS, Dagster webserver and daemon) in a fresh home, uploads
N small Liger CSVs (20 rows each, distinct runs) at once, plus a 999-byte key, a binary file and
a text file that is no format, and waits until the file ledger holds every object version done
(indexed, quarantined or gone) and the index holds every record set. Then, at rest, five lone
files one after another, each from its upload until `kindex query` shows its runs, and last
`kindex backfill 'incoming/*' --wait` of every file. Then `kindex ingest` of the same small
files in another fresh home, in-process, and DuckDB copying each file to Parquet, one file at a
time (the baseline). Prints the three rates and the ratios to DuckDB's, the lone files' median,
the peak memory of `kindex up`'s process tree, the partitions the burst added, the `files`
view's states, the load average before and after, and checks that both indexes hold the same
runs (count and fingerprint: the sha256 of the sorted run digests); its last line is a JSON
object of the issue's three figures (`burst_ratio`, `ingest_ratio`, `lone_file_median_s`) and
the load. The test suite runs the same with fewer files (tests/test_burst_e2e.py). Usage:

    python benchmarks/burst.py [--files 2000] [--rows 20] [--no-backfill] [--latency-only]
                               [--soak BATCHES [--soak-files 5]] [--write-docs]

Each lone file is reported with where its time went (the run's marks in the instance's event
log); `--latency-only` measures only the lone files, in a fresh home. `--soak BATCHES` measures
only the memory of `kindex up`'s long-lived processes (embedded S3, code server, daemon,
webserver, run worker) while a small batch arrives each sensor tick: RSS after the first tenth
of the batches vs the end, at rest.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines.intake.ledger import Ledger
    from pipelines.settings import Settings
    from pipelines.storage.base import ObjectStore

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from process_support import KindexUp, descendants, free_port, kindex_env  # noqa: E402
from process_support import run_kindex as kindex  # noqa: E402
from report import Figure, add_write_docs, write_figures  # noqa: E402

SHARED_CSV = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
LONG_KEY_BYTES = 999
DROP_TIMEOUT = 1800.0
UPLOAD_THREADS = 8
# How often the benchmark judges the bucket while it waits: each look lists every object the
# burst made, which loads the S3 server the pipeline is using.
POLL_SECONDS = 3.0


def small_files(folder: Path, count: int, rows: int) -> list[Path]:
    """`count` Liger CSVs of `rows` rows each, cut from the shared CSV; file i shifts every x
    value by i, so each file's runs are its own."""
    with SHARED_CSV.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        base = list(reader)
    x = header.index("x_value")
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        start = (i * rows) % (len(base) - rows)
        path = folder / f"small-{i:05d}.csv"
        with path.open("w", newline="") as out:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(header)
            for fields in base[start : start + rows]:
                row = list(fields)
                row[x] = str(int(float(row[x])) + i * 7919)
                writer.writerow(row)
        paths.append(path)
    return paths


def long_key(length: int = LONG_KEY_BYTES) -> str:
    """A valid key of `length` bytes (SeaweedFS takes path segments up to 255 bytes)."""
    stem = "incoming/" + ("d" * 199 + "/") * 4
    return stem + "k" * (length - len(stem) - len(".csv")) + ".csv"


def odd_objects(small: Path) -> dict[str, bytes]:
    """The objects dropped beside the small files: a 999-byte key holding a copy of the first
    small file (so its runs are the ingest's too), a binary file, and text in no format."""
    return {
        long_key(): small.read_bytes(),
        "incoming/odd/blob.bin": bytes(range(256)) * 64,
        "incoming/odd/notes.txt": b"this is not a benchmark file\njust words\n",
    }


def run_digests(env: dict[str, str], *sync: str) -> list[str]:
    """The index's run digests; `--sync` first where an index run may still be writing this
    home's local copy after publishing (the burst waited on the published pointer)."""
    sql = "select run_digest from runs order by 1"
    result = kindex(env, "query", sql, "--format", "csv", *sync)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[1:]


def fingerprint(digests: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()


def rss_bytes(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


@dataclass
class BurstResult:
    files: int  # objects dropped, odd ones included
    drop_to_last_file_s: float
    drop_to_index_s: float  # until the published index holds every record set
    upload_s: float
    peak_rss_bytes: int
    runs: int
    fingerprint: str
    missing: int
    quarantined_files: int
    states: dict[str, int]
    partitions: int  # partition keys materialized, over every asset


def drop_burst(up: KindexUp, paths: list[Path], odd: dict[str, bytes]) -> BurstResult:
    """Upload everything at once to a running `kindex up` and wait until nothing is missing and
    the index holds every file's record set."""
    assert up.process is not None, "kindex up is not started"
    from pipelines.intake.ledger import Ledger, unprocessed_versions
    from pipelines.settings import Settings
    from pipelines.storage.s3 import store_session

    settings = Settings.from_env(up.env)
    objects = {f"incoming/{p.name}": p.read_bytes() for p in paths} | odd
    with store_session(settings) as store:
        dropped_at = time.monotonic()
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            list(pool.map(lambda item: store.put_bytes(*item), objects.items()))
        upload_s = time.monotonic() - dropped_at
        peak = 0
        deadline = dropped_at + DROP_TIMEOUT
        ledger = Ledger.of(store, settings)
        while True:
            peak = max(peak, rss_bytes({up.process.pid, *descendants(up.process.pid)}))
            listing, missing_now = unprocessed_versions(store, settings, ledger)
            if len(listing) == len(objects) and not missing_now:
                break
            assert time.monotonic() < deadline, f"{len(missing_now)} still missing"
            time.sleep(POLL_SECONDS)
        last_file_s = time.monotonic() - dropped_at
        # The index follows the record sets: wait until it holds them all.
        from pipelines.index.publish import unpublished_record_sets

        while unpublished_record_sets(store, settings):
            peak = max(peak, rss_bytes({up.process.pid, *descendants(up.process.pid)}))
            assert time.monotonic() < deadline, "the index never caught up"
            time.sleep(POLL_SECONDS)
        index_s = time.monotonic() - dropped_at
        missing = len(unprocessed_versions(store, settings, ledger)[1])
    digests = run_digests(up.env, "--sync")
    states = file_states(up.env)
    return BurstResult(
        files=len(objects),
        drop_to_last_file_s=last_file_s,
        drop_to_index_s=index_s,
        upload_s=upload_s,
        peak_rss_bytes=peak,
        runs=len(digests),
        fingerprint=fingerprint(digests),
        missing=missing,
        quarantined_files=states.get("quarantined", 0),
        states=states,
        partitions=materialized_partitions(up),
    )


def file_states(env: dict[str, str]) -> dict[str, int]:
    """The `files` view's count of object versions by state."""
    sql = "select state, count(*) as n from files group by state order by state"
    result = kindex(env, "query", sql, "--format", "csv")
    assert result.returncode == 0, result.stderr
    rows = [line.split(",") for line in result.stdout.split()[1:]]
    return {state: int(n) for state, n in rows}


PARTITIONS_QUERY = """
query {
  assetNodes {
    assetKey { path }
    partitionStats { numMaterialized }
  }
}"""


def materialized_partitions(up: KindexUp) -> int:
    """Partition keys materialized over every asset (Dagster's own count, through GraphQL)."""
    from pipelines.commands.backfill import graphql

    nodes = graphql(up.graphql_url, PARTITIONS_QUERY, {})["assetNodes"]
    return sum((n["partitionStats"] or {}).get("numMaterialized") or 0 for n in nodes)


def duckdb_per_file(paths: list[Path], out: Path) -> float:
    """Seconds DuckDB takes to copy each file to Parquet, one statement per file."""
    import duckdb

    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    started = time.monotonic()
    for i, path in enumerate(paths):
        con.execute(
            f"COPY (SELECT * FROM read_csv('{path}')) TO '{out / f'{i}.parquet'}' (FORMAT parquet)"
        )
    seconds = time.monotonic() - started
    con.close()
    return seconds


@dataclass
class IngestResult:
    seconds: float
    runs: int
    fingerprint: str


def ingest_in_process(home: Path, paths: list[Path]) -> IngestResult:
    """`kindex ingest` of the same files into a fresh home (its own embedded server)."""
    from pipelines.storage.embedded import find_free_port_block

    env = kindex_env(home, find_free_port_block())
    started = time.monotonic()
    result = kindex(env, "ingest", *map(str, paths), timeout=DROP_TIMEOUT)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-2000:]
    digests = run_digests(env)
    return IngestResult(seconds, len(digests), fingerprint(digests))


LONE_FILES = 5
LATENCY_POLL_SECONDS = 0.2


@dataclass
class Latency:
    """A lone file's way from its upload to the query that shows its runs, in seconds from
    the upload, with the marks of the run that took it (from the instance's event log; empty
    where its run could not be told apart). Its run publishes the index in its step, before the
    step's checks and chart: the file is queryable before the run ends."""

    queryable: float
    marks: list[tuple[str, float]] = field(default_factory=list)

    def breakdown(self) -> str:
        parts, before = [], 0.0
        for name, mark in [*self.marks, ("step to queryable", self.queryable)]:
            parts.append(f"{name} {mark - before:.1f}")
            before = mark
        if not self.marks:
            return f"{self.queryable:.1f} s"
        return f"{self.queryable:.1f} s = " + " + ".join(parts)


def run_marks(up: KindexUp, dropped_wall: float) -> list[tuple[str, float]]:
    """When the one run created after `dropped_wall` reached each stage, in seconds from it:
    the sensor's tick requested it, the run queue handed it to the launcher, its process
    logged its start, its step began."""
    from dagster import DagsterEventType, DagsterInstance, RunsFilter

    with DagsterInstance.from_config(str(up.home / "dagster")) as instance:
        records = instance.get_run_records(RunsFilter(), limit=5)
        after = [r for r in records if r.create_timestamp.timestamp() >= dropped_wall]
        if len(after) != 1:  # none, or a catch-up run beside it: the marks would guess
            return []
        record = after[0]
        events = instance.all_logs(record.dagster_run.run_id)
    first: dict[str, float] = {}
    for entry in events:
        kind = entry.dagster_event_type
        name = (
            {
                DagsterEventType.RUN_STARTING: "queue",
                DagsterEventType.RUN_START: "launch",
                DagsterEventType.STEP_START: "to the step",
            }.get(kind)
            if kind is not None
            else None
        )
        if name is not None:
            first.setdefault(name, entry.timestamp - dropped_wall)
    marks = [("discovery", record.create_timestamp.timestamp() - dropped_wall)]
    marks += [(name, first[name]) for name in ("queue", "launch", "to the step") if name in first]
    return marks


def lone_file_latency(up: KindexUp, path: Path) -> Latency:
    """From the upload of one file, the system at rest, until `kindex query` (the home's local
    index) shows its runs; with the marks of the run that took it, from Dagster."""
    from pipelines.index.local import open_index
    from pipelines.settings import Settings
    from pipelines.storage.s3 import store_session

    settings = Settings.from_env(up.env)
    key = f"incoming/{path.name}"
    time.sleep(10)  # the tick after a file, and the runs of the one before, are over
    with store_session(settings) as store:
        dropped_at, dropped_wall = time.monotonic(), time.time()
        store.put_bytes(key, path.read_bytes())
        while True:
            con = open_index(settings)
            try:
                row = con.execute("select count(*) from runs where source_key = ?", [key])
                found = row.fetchone()
            finally:
                con.close()
            if found and found[0]:
                latency = Latency(time.monotonic() - dropped_at)
                break
            assert time.monotonic() - dropped_at < DROP_TIMEOUT, f"{key} never indexed"
            time.sleep(LATENCY_POLL_SECONDS)
    latency.marks = run_marks(up, dropped_wall)
    return latency


# The long-lived processes of `kindex up`, told apart by their command lines (the run worker's
# forks, one a run, share its command line and are children of it, not of `kindex up`).
ROLES = {
    "weed": "embedded S3",
    "dagster-daemon": "daemon",
    "dagster-webserver": "webserver",
    "code-server": "code server",
    "assets.run_worker": "run worker",
}


def long_lived(up: KindexUp) -> dict[str, int]:
    """Each long-lived process of `kindex up` by its role: the pid of the role's topmost one."""
    from process_support import command_line, parent_pid

    assert up.process is not None
    found: dict[str, int] = {}
    for pid in sorted(descendants(up.process.pid)):
        line = command_line(pid)
        role = next((name for needle, name in ROLES.items() if needle in line), None)
        if role is None or role in found:
            continue
        parent = parent_pid(pid)
        if parent is not None and any(needle in command_line(parent) for needle in ROLES):
            continue  # a child of a long-lived one (a run, a code server's helper)
        found[role] = pid
    return found


def soak(up: KindexUp, work: Path, batches: int, per_batch: int, rows: int) -> Figure:
    """Drop `batches` small batches of files, one each sensor tick, and print each long-lived
    process's RSS after the first tenth of them against the end's, once every file is indexed
    and the system is at rest again."""
    from pipelines.intake.ledger import Ledger
    from pipelines.settings import Settings
    from pipelines.storage.s3 import store_session

    settings = Settings.from_env(up.env)
    paths = small_files(work / "soak", batches * per_batch, rows)
    warm = max(1, batches // 10)
    started: dict[str, int] = {}
    with store_session(settings) as store:
        ledger = Ledger.of(store, settings)
        began = time.monotonic()
        for b in range(batches):
            for path in paths[b * per_batch : (b + 1) * per_batch]:
                store.put_bytes(f"incoming/{path.name}", path.read_bytes())
            time.sleep(SOAK_TICK_SECONDS)
            if b + 1 == warm:
                wait_indexed(store, settings, ledger, (b + 1) * per_batch)
                time.sleep(SOAK_REST_SECONDS)
                started = {role: rss_bytes({pid}) for role, pid in long_lived(up).items()}
                print(f"soak: warm after {warm} batches ({time.monotonic() - began:.0f} s)")
            if (b + 1) % warm == 0:
                # Each tenth, under way: whether a process levels off or keeps growing.
                now = {role: rss_bytes({pid}) for role, pid in long_lived(up).items()}
                print(
                    f"soak: {b + 1:5d} batches, {time.monotonic() - began:5.0f} s: "
                    + ", ".join(f"{role} {now[role] / 2**20:.0f}" for role in sorted(now))
                    + " MiB",
                    flush=True,
                )
        wait_indexed(store, settings, ledger, len(paths))
    time.sleep(SOAK_REST_SECONDS)
    ended = {role: rss_bytes({pid}) for role, pid in long_lived(up).items()}
    print(f"soak: {batches} batches of {per_batch} files in {time.monotonic() - began:.0f} s")
    for role in sorted(started.keys() | ended.keys()):
        before, after = started.get(role, 0), ended.get(role, 0)
        ratio = after / before if before else float("nan")
        print(
            f"RSS {role + ':':<13} {before / 2**20:6.0f} MiB -> {after / 2**20:6.0f} MiB "
            f"= {ratio:.2f}x"
        )
    total_before, total_after = sum(started.values()), sum(ended.values())
    print(f"RSS of all:        {total_after / total_before:.2f}x end / start (target <= 1.1)")
    each = ", ".join(
        f"{role} {ended.get(role, 0) / started[role]:.2f}x" for role in sorted(started)
    )
    return Figure(
        f"burst: kindex up's long-lived processes over {batches} batches of {per_batch} files, "
        "RSS at the end vs after the first tenth",
        f"{total_after / total_before:.2f}x ({total_before / 2**20:.0f} -> "
        f"{total_after / 2**20:.0f} MiB; {each})",
        "<= 1.1x",
    )


SOAK_TICK_SECONDS = 5.0  # the daemon's sensor loop: a batch per tick
SOAK_REST_SECONDS = 15.0


def wait_indexed(store: ObjectStore, settings: Settings, ledger: Ledger, count: int) -> None:
    """Until the ledger holds `count` files done and nothing is missing."""
    from pipelines.intake.ledger import unprocessed_versions

    deadline = time.monotonic() + DROP_TIMEOUT
    while True:
        listing, missing = unprocessed_versions(store, settings, ledger)
        if len(listing) >= count and not missing:
            return
        assert time.monotonic() < deadline, f"{len(missing)} still missing"
        time.sleep(POLL_SECONDS)


@contextmanager
def fresh_up(prefix: str) -> Iterator[tuple[KindexUp, Path]]:
    """A started `kindex up` in a fresh home under a temporary folder, stopped after."""
    import tempfile

    from pipelines.storage.embedded import find_free_port_block

    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        work = Path(folder)
        up = KindexUp(work / "up-home", free_port(), find_free_port_block())
        try:
            up.start()
            yield up, work
        finally:
            up.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument(
        "--no-backfill",
        dest="backfill",
        action="store_false",
        help="skip `kindex backfill 'incoming/*' --wait` over every file after the burst",
    )
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="only the lone files at rest under a fresh `kindex up`, with where their time goes",
    )
    parser.add_argument(
        "--soak",
        type=int,
        metavar="BATCHES",
        help="only the memory of kindex up's long-lived processes over BATCHES small batches, "
        "one each sensor tick: RSS after the first tenth vs the end",
    )
    parser.add_argument("--soak-files", type=int, default=5, help="files a soak batch drops")
    add_write_docs(parser)
    args = parser.parse_args()
    import tempfile

    from pipelines.storage.embedded import find_free_port_block

    if args.soak:
        with fresh_up("kindex-soak-") as (up, work):
            figure = soak(up, work, args.soak, args.soak_files, args.rows)
        if args.write_docs:
            write_figures([figure])
        return

    if args.latency_only:
        with fresh_up("kindex-latency-") as (up, work):
            lone = small_files(work / "lone", LONE_FILES, args.rows)
            measured = [lone_file_latency(up, path) for path in lone]
        for latency in measured:
            print(f"lone file to queryable:     {latency.breakdown()}")
        seconds = [latency.queryable for latency in measured]
        print(f"median:                     {statistics.median(seconds):.1f} s (target <= 5)")
        if args.write_docs:
            write_figures([latency_figure(seconds, "in a fresh home")])
        return

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="kindex-burst-") as folder:
        work = Path(folder)
        paths = small_files(work / "files", args.files, args.rows)
        up = KindexUp(work / "up-home", free_port(), find_free_port_block())
        try:
            up.start()
            burst = drop_burst(up, paths, odd_objects(paths[0]))
            # At rest now: each lone file from its upload to its runs in the index.
            lone = small_files(work / "lone", args.files + LONE_FILES, args.rows)[-LONE_FILES:]
            lone_files = [lone_file_latency(up, path) for path in lone]
            latencies = [latency.queryable for latency in lone_files]
            # Last: the backfill re-processes every file, which the lone files must not wait on.
            backfill_started = time.monotonic()
            backfill = (
                up.backfill("incoming/*", timeout=1500, check=False) if args.backfill else None
            )
            backfill_s = time.monotonic() - backfill_started
        finally:
            up.stop()
        ingest = ingest_in_process(work / "ingest-home", paths)
        duckdb_s = duckdb_per_file(paths, work / "duckdb")
    load = (load_before, os.getloadavg()[0])
    rate = burst.files / burst.drop_to_last_file_s
    ingest_rate = len(paths) / ingest.seconds
    duckdb_rate = len(paths) / duckdb_s
    print(f"files dropped:              {burst.files} ({args.files} x {args.rows} rows + 3 odd)")
    print(f"upload:                     {burst.upload_s:.1f} s")
    print(f"drop to last file:          {burst.drop_to_last_file_s:.1f} s")
    print(f"drop to index holding all:  {burst.drop_to_index_s:.1f} s")
    print(f"files/s under kindex up:    {rate:.1f}")
    print(f"files/s in-process ingest:  {ingest_rate:.1f} ({ingest.seconds:.1f} s, same files)")
    print(f"files/s DuckDB per file:    {duckdb_rate:.1f} ({duckdb_s:.1f} s, same files)")
    print(f"burst / DuckDB:             {rate / duckdb_rate:.3f}x (target >= 0.2)")
    print(f"in-process / DuckDB:        {ingest_rate / duckdb_rate:.3f}x (target >= 0.2)")
    print(f"peak RSS of kindex up:      {burst.peak_rss_bytes / 2**20:.0f} MiB")
    print(f"load average (1 min):       {load[0]:.1f} before, {load[1]:.1f} after (2 cores)")
    print(
        f"lone file to queryable:     median {statistics.median(latencies):.1f} s "
        f"({', '.join(f'{x:.1f}' for x in latencies)}; target <= 5)"
    )
    for latency in lone_files:
        print(f"  a lone file:              {latency.breakdown()}")
    print(f"partition keys materialized: {burst.partitions} (target <= 10)")
    print(f"files view at rest:         {burst.states}")
    print(f"missing at rest:            {burst.missing}")
    print(
        f"runs: burst {burst.runs}, ingest {ingest.runs}; fingerprints equal: "
        f"{burst.fingerprint == ingest.fingerprint}"
    )
    if args.write_docs:
        write_docs(burst.files, rate, ingest_rate, duckdb_rate, burst, latencies, load)
    if backfill is not None:
        print(
            f"backfill of every file:     {backfill_s:.1f} s, rc {backfill.returncode}, "
            f"{backfill.stdout.split()[-1] if backfill.stdout.split() else ''}"
        )
    # The three targets of one run, last, for a script to read.
    summary = {
        "burst_ratio": round(rate / duckdb_rate, 3),
        "ingest_ratio": round(ingest_rate / duckdb_rate, 3),
        "lone_file_median_s": round(statistics.median(latencies), 1),
        "load_before": round(load[0], 1),
        "load_after": round(load[1], 1),
    }
    print(json.dumps(summary))


def write_docs(
    files: int,
    rate: float,
    ingest_rate: float,
    duckdb_rate: float,
    burst: BurstResult,
    latencies: list[float],
    load: tuple[float, float],
) -> None:
    at = f"load {load[0]:.1f} -> {load[1]:.1f}"
    write_figures(
        [
            Figure(
                f"burst: {files} small files under kindex up vs DuckDB per file",
                f"{rate / duckdb_rate:.3f}x ({rate:.1f} vs {duckdb_rate:.1f} files/s), "
                f"peak RSS {burst.peak_rss_bytes / 2**20:.0f} MiB, "
                f"{burst.partitions} partition keys, missing {burst.missing}, {at}",
                ">= 0.2x, <= 10 partition keys",
            ),
            Figure(
                f"burst: {files} small files, in-process kindex ingest vs DuckDB per file",
                f"{ingest_rate / duckdb_rate:.3f}x "
                f"({ingest_rate:.1f} vs {duckdb_rate:.1f} files/s), {at}",
                ">= 0.2x",
            ),
            latency_figure(latencies, f"after the burst of {files}"),
        ]
    )


def latency_figure(latencies: list[float], when: str) -> Figure:
    """The lone files' figure; `when` tells the two settings apart (each keeps its own row)."""
    return Figure(
        f"burst: a lone file at rest {when}, upload to queryable (median of {len(latencies)})",
        f"{statistics.median(latencies):.1f} s ({', '.join(f'{x:.1f}' for x in latencies)})",
        "<= 5 s",
    )


if __name__ == "__main__":
    main()
