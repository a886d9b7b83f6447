"""A month of the fleet: what one more batch and each sensor tick cost after 10 batches and after a
month-like history, on the embedded S3 server.

Builds a home through the product's own writing code: each fill batch uploads one small Liger CSV
(the incoming version and its snapshot, `put_by_snapshot`), writes its record set and its batch's
sets file (the batch steps' `write`), and its files' ledger rows (`Ledger.append`); the index is
published (`publish_index`) every `--publish-every` batches, as batch runs publish it. The fill
shortcuts normalization: one small file is normalized once (the batch steps' `normalize`) and its
record set content is written for every batch, under each batch's own snapshot digest. The
ledger's rows are the batches' own (a pending row when found, a done row when written) topped up,
in the same commits, with done rows of versions that arrived over the past month and whose
incoming objects are gone (expired), so that the ledger holds a month's rows without a month of
uploads.

Two homes are built in the same run, each on its own embedded server: one filled to 10 batches,
one filled the same way to the full history. Each measurement is taken in both, the homes taking
turns sample by sample (median of `--repeats`), so that the two rounds see the same load on the
machine (measured one after the other, half an hour of fill apart, the load of that moment
decided the ratio). Each sample runs in a fresh subprocess (its peak RSS is its own, VmHWM): one
more batch of 20 small files (`ingest_paths`: upload, snapshot,
normalize, write, ledger, publish), one `incoming_files_sensor` tick that finds one new file, one
`ledger_sensor` tick, one `reconcile_sensor` tick. S3 requests are counted by the embedded server
itself (its Prometheus request counters), so the Iceberg reads and writes of pyarrow's and
DuckDB's own S3 clients count too. The last line of stdout is one JSON object of the ratios (full
history over after 10 batches).

    .venv/bin/python benchmarks/history.py [--smoke] [--batches 20000] [--ledger-rows 1000000]
        [--repeats 5] [--port 18440] [--home FOLDER] [--write-docs]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import patch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from report import Figure, add_write_docs, write_figures  # noqa: E402

from pipelines.batch.records import done_entry  # noqa: E402
from pipelines.batch.stages import Failed, Normalized, Snapshotted, known_info  # noqa: E402
from pipelines.batch.steps import normalize, parse, write  # noqa: E402
from pipelines.batch.uploads import parts_folder  # noqa: E402
from pipelines.index.layout import IndexLayout  # noqa: E402
from pipelines.index.publish import publish_index  # noqa: E402
from pipelines.ingest import ingest_paths  # noqa: E402
from pipelines.intake.ledger import FileEntry, FileState, Ledger  # noqa: E402
from pipelines.intake.snapshots import content_digest, put_by_snapshot  # noqa: E402
from pipelines.settings import EMBEDDED_HOST, Settings  # noqa: E402
from pipelines.storage.base import ObjectInfo  # noqa: E402
from pipelines.storage.embedded import (  # noqa: E402
    PORT_BLOCK_SIZE,
    EmbeddedS3,
    PortPlan,
    find_free_port_block,
)
from pipelines.storage.s3 import S3Store  # noqa: E402

SHARED_CSV = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
EARLY_BATCHES = 10
MEASURED_FILES = 20  # the measured batch
FILE_ROWS = 20  # rows of each small file
FILL_THREADS = 8
MONTH = timedelta(days=30)
SMOKE = {"batches": 60, "ledger_rows": 3000, "rows_per_commit": 500, "publish_every": 30}
# SeaweedFS's counter of the S3 requests its gateway answered, by type, code and bucket.
REQUEST_COUNTER = "SeaweedFS_s3_request_total"
MEASUREMENTS = ("batch", "tick", "ledger_tick", "reconcile")


# -- small Liger files --------------------------------------------------------------------------


def liger_rows() -> tuple[list[str], list[list[str]]]:
    with SHARED_CSV.open(newline="") as handle:
        records = list(csv.reader(handle))
    return records[0], records[1:]


def small_file(n: int, header: list[str], rows: list[list[str]]) -> bytes:
    """A CSV of FILE_ROWS rows of the shared file, every x value shifted by n: its own bytes and
    its own runs."""
    x = header.index("x_value")
    start = (n * FILE_ROWS) % (len(rows) - FILE_ROWS)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in rows[start : start + FILE_ROWS]:
        shifted = list(row)
        shifted[x] = str(float(row[x]) + n)
        writer.writerow(shifted)
    return out.getvalue().encode()


# -- the product's internals this benchmark depends on (one place, to adapt after a change) ----


@dataclass(frozen=True, slots=True)
class Template:
    """One small file normalized once: its place (source, parser version) and record set."""

    normalized: Normalized


def normalized_template(store: S3Store, settings: Settings, data: bytes) -> Template:
    """A file taken and normalized by the batch steps (snapshot, parse, normalize)."""
    file = uploaded(store, settings, "incoming/history/template.csv", data, "template")
    with parts_folder(settings) as parts_dir:
        [result] = normalize(store, settings, [parse(file)], parts_dir)
    if isinstance(result, Failed):
        raise result.error
    assert isinstance(result, Normalized), result
    return Template(result)


def uploaded(store: S3Store, settings: Settings, key: str, data: bytes, batch: str) -> Snapshotted:
    """Steps 1-2 of a file: its incoming version by way of its snapshot."""
    taken = put_by_snapshot(store, settings, Path(key), data, content_digest(data), key=key)
    entry = FileEntry.pending(store.bucket, known_info(taken.snapshot), batch=batch)
    return Snapshotted(entry, taken.snapshot, taken.data, taken.kept_now)


def write_batch(
    store: S3Store, settings: Settings, template: Template, items: Sequence[tuple[str, bytes]]
) -> list[FileEntry]:
    """A fill batch: its files uploaded, the template's content written as each file's record
    set (under its own snapshot digest) with the batch's sets file (the write step); its ledger
    rows (each file's pending row and its done row, which names the sets file), not appended."""
    batch = f"history-{secrets.token_hex(6)}"
    layout = IndexLayout.of(settings)
    files = [uploaded(store, settings, key, data, batch) for key, data in items]
    place = template.normalized.place
    prepared = [
        Normalized(
            file,
            replace(
                place, prefix=layout.record_set_prefix(place.parser_version, file.snapshot.digest)
            ),
            template.normalized.content,
        )
        for file in files
    ]
    rows = []
    for file, result in zip(files, write(store, settings, prepared), strict=True):
        if isinstance(result, Failed):
            raise result.error
        rows += [file.entry, done_entry(result.entry, result.records)]
    return rows


def load_sensors() -> None:
    """Import the sensors (Dagster) before a tick is timed: a daemon has them loaded."""
    import assets.reconcile
    import assets.sensors  # noqa: F401


def sensor_tick(
    home: Path, port: int, bucket: str, name: str, cursor: str | None
) -> tuple[int, str | None]:
    """One tick of a sensor as the daemon runs it (a fresh resource, an instance of its own):
    the run requests it made, and its new cursor."""
    from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

    from assets.reconcile import reconcile_sensor
    from assets.resources import KindexResource
    from assets.sensors import incoming_files_sensor, ledger_sensor

    sensor = {
        "tick": incoming_files_sensor,
        "ledger_tick": ledger_sensor,
        "reconcile": reconcile_sensor,
    }[name]
    kindex = KindexResource(home=str(home), s3_port=str(port), bucket=bucket, notifications="filer")
    with DagsterInstance.ephemeral() as instance:
        context = build_sensor_context(
            instance=instance, cursor=cursor, resources={"kindex": kindex}
        )
        result = sensor(context)
    if isinstance(result, SkipReason):
        return 0, cursor
    assert isinstance(result, SensorResult), result
    return len(result.run_requests or []), result.cursor


def feed_cursor_now(settings: Settings) -> str:
    """The incoming sensor's cursor as a tick now leaves it at rest: the filer feed read up to
    now (the fill's own changes are behind it, as the daemon's ticks would have read them)."""
    from assets.sensors import DiscoveryCursor
    from pipelines.intake.notifications import FilerFeed

    feed = FilerFeed.from_settings(settings)
    return DiscoveryCursor(feed=feed.since(datetime.now(UTC))).to_json()


class MeteredS3(EmbeddedS3):
    """The embedded server with its Prometheus metrics on `metrics_port`: its request counters
    count every client's requests (boto3's, pyarrow's and DuckDB's alike)."""

    def __init__(self, home: Path, *, port: int, metrics_port: int) -> None:
        super().__init__(home, port=port)
        self.metrics_port = metrics_port

    def _spawn(self, plan: PortPlan) -> subprocess.Popen[bytes]:
        real = subprocess.Popen
        flags = [f"-metricsPort={self.metrics_port}", f"-metricsIp={EMBEDDED_HOST}"]

        def metered(command: list[str], **options: Any) -> subprocess.Popen[bytes]:
            return real([*command[:2], *flags, *command[2:]], **options)

        with patch.object(subprocess, "Popen", metered):  # the module embedded.py calls
            return super()._spawn(plan)


def server_requests(metrics_port: int) -> int:
    """The S3 requests the server has answered since it started (all buckets, all codes)."""
    return sum(server_requests_by_type(metrics_port).values())


def server_requests_by_type(metrics_port: int) -> Counter[str]:
    """server_requests by S3 API (the counter's `type` label)."""
    url = f"http://{EMBEDDED_HOST}:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith(REQUEST_COUNTER + "{"):
            labels, value = line.rsplit(" ", 1)
            kind = re.search(r'type="([^"]*)"', labels)
            counts[kind.group(1) if kind else "?"] += round(float(value))
    return counts


class RequestTrace:
    """With --trace: this process's S3 calls by operation and key prefix (boto3's calls, and the
    files pyiceberg's FileIO opens), to find what grows with history."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    @staticmethod
    def prefix(key: str) -> str:
        url = "://" in key
        parts = [
            re.sub(r"[0-9a-f-]{6,}|\d+", "#", part) for part in key.split("://")[-1].split("/")
        ]
        return "/".join(parts[3:] if url else parts)  # an Iceberg file: from its table on

    def install(self) -> None:
        from pyiceberg.io.pyarrow import PyArrowFileIO

        from pipelines.storage.s3 import boto_session

        def boto_call(model: Any, params: dict[str, Any], **_: Any) -> None:
            key = params.get("Key") or params.get("Prefix") or ""
            self.counts[f"boto {model.name} {self.prefix(str(key))}"] += 1

        boto_session().events.register("before-call.s3", boto_call)
        for method in ("new_input", "new_output", "delete"):
            real = getattr(PyArrowFileIO, method)

            def traced(io: Any, location: Any, *a: Any, _real: Any = real, _m: str = method) -> Any:
                self.counts[f"iceberg {_m} {self.prefix(str(location))}"] += 1
                return _real(io, location, *a)

            setattr(PyArrowFileIO, method, traced)


# -- the fill -----------------------------------------------------------------------------------


@dataclass
class Fill:
    store: S3Store
    settings: Settings
    template: Template
    header: list[str]
    rows: list[list[str]]
    ledger_rows: int  # the ledger's total at the end
    batches: int  # the fill's total
    rows_per_commit: int
    publish_every: int
    written_batches: int = 0
    appended_rows: int = 0
    commits: int = 0
    covered_share: float = 0.0  # how far through the month the past versions have arrived

    def __post_init__(self) -> None:
        self.ledger = Ledger.of(self.store, self.settings)
        self.rng = random.Random(43)

    def topped_up(self, own: list[FileEntry]) -> list[FileEntry]:
        """A commit's rows: the batches' own, and rows of past versions to the fill's pace.
        The past versions' arrivals advance with the fill: commit k of N holds versions of the
        stretch of the month k/N of the way through (ending an hour before now), so that a
        commit touches one or two arrival windows, as a fleet's commit does."""
        done_share = (self.written_batches / self.batches) if self.batches else 1.0
        target = round(self.ledger_rows * done_share) - self.appended_rows
        extra = max(0, target - len(own))
        now = datetime.now(UTC)
        start, span = now - MONTH, MONTH - timedelta(hours=1)
        low, high = self.covered_share, max(self.covered_share, done_share)
        self.covered_share = high
        past = []
        for _ in range(extra):
            arrived = start + (low + self.rng.random() * (high - low)) * span
            info = ObjectInfo(
                f"incoming/fleet/{arrived:%Y-%m-%d}/{secrets.token_hex(8)}.csv",
                f'"{secrets.token_hex(16)}"',
                2048,
                arrived,
                None,
            )
            entry = FileEntry.pending(self.store.bucket, info, batch="fleet")
            past.append(
                replace(
                    entry,
                    state=FileState.INDEXED,
                    attempts=1,
                    runs=FILE_ROWS,
                    snapshot_digest=f"sha256:{secrets.token_hex(32)}",
                    updated_at=arrived + timedelta(seconds=30),
                )
            )
        # In order of arrival: each of the commits these rows are cut into holds a stretch.
        return own + sorted(past, key=lambda entry: entry.last_modified)

    def run(self, until: int, threads: int, progress: bool) -> None:
        """Batches until `until` are written, FILL_THREADS at a time; their rows committed as
        they gather, rows_per_commit at a time; the index published every publish_every."""
        pending: list[FileEntry] = []
        started = time.perf_counter()

        def one(n: int) -> list[FileEntry]:
            key = f"incoming/history/{n:06d}.csv"
            return write_batch(
                self.store,
                self.settings,
                self.template,
                [(key, small_file(n, self.header, self.rows))],
            )

        def commit(rows: list[FileEntry]) -> None:
            rows = self.topped_up(rows)
            for start in range(0, len(rows), self.rows_per_commit):
                chunk = rows[start : start + self.rows_per_commit]
                self.ledger.append(chunk)
                self.appended_rows += len(chunk)
                self.commits += 1

        # A publish runs while the next batches are written, as a batch run's publish runs
        # while other runs write theirs; the next publish waits for it.
        publishing: Future[object] | None = None
        with (
            ThreadPoolExecutor(threads, thread_name_prefix="history-fill") as pool,
            ThreadPoolExecutor(1, thread_name_prefix="history-publish") as publisher,
        ):
            while self.written_batches < until:
                step = min(
                    until, (self.written_batches // self.publish_every + 1) * self.publish_every
                )
                for rows in pool.map(one, range(self.written_batches, step)):
                    pending += rows
                    self.written_batches += 1
                    if len(pending) >= self.rows_per_commit:
                        commit(pending)
                        pending = []
                commit(pending)
                pending = []
                if publishing is not None:
                    publishing.result()
                publishing = publisher.submit(publish_index, self.store, self.settings)
                if progress:
                    took = time.perf_counter() - started
                    print(
                        f"  {self.written_batches} batches, {self.appended_rows} ledger rows in "
                        f"{self.commits} commits ({took:.0f} s)",
                        flush=True,
                    )
            if publishing is not None:
                publishing.result()  # the history measured is published whole


# -- the measurements, each in a fresh subprocess -----------------------------------------------


def measure(args: argparse.Namespace) -> None:
    """The --measure child: one measurement, printed as one JSON line."""
    home, port, bucket = Path(args.home), args.port, args.bucket
    state_path = home / "history-cursors.json"
    cursors: dict[str, str | None] = (
        json.loads(state_path.read_text()) if state_path.exists() else {}
    )
    settings = Settings(home=home, s3_port=port, bucket=bucket)
    trace = RequestTrace()
    if args.trace:
        trace.install()
    store = S3Store.from_settings(settings)
    load_sensors()
    if args.measure == "batch":
        header, rows = liger_rows()
        with tempfile.TemporaryDirectory(prefix="history-batch-") as folder:
            paths = []
            for n in range(MEASURED_FILES):
                path = Path(folder) / f"measured-{args.round}-{n:02d}.csv"
                path.write_bytes(small_file(900_000 + args.seed * 100 + n, header, rows))
                paths.append(path)
            before = server_requests_by_type(args.metrics_port)
            trace.counts.clear()
            start = time.perf_counter()
            summary = ingest_paths(paths, settings, progress=False, store=store)
            took = time.perf_counter() - start
        assert len(summary.files) == MEASURED_FILES and not summary.failed, summary.failed
    else:
        if args.measure == "tick":
            store.put_bytes(
                f"incoming/measured/{args.round}-{args.seed}.csv",
                small_file(args.seed, *liger_rows()),
            )
        before = server_requests_by_type(args.metrics_port)
        trace.counts.clear()
        start = time.perf_counter()
        found, cursor = sensor_tick(home, port, bucket, args.measure, cursors.get(args.measure))
        took = time.perf_counter() - start
        if args.measure == "tick":
            assert found == 1, f"the tick found {found} batches, not the one new file"
        if args.measure != "ledger_tick":  # each sample ticks from the cursor the round began with
            cursors[args.measure] = cursor
        state_path.write_text(json.dumps(cursors))
    by_type = server_requests_by_type(args.metrics_port) - before
    rss = peak_rss_mib()
    if args.measure == "tick":  # its batch ran, as the daemon would run it: not left pending
        ledger = Ledger.of(store, settings)
        [dropped] = store.list(f"incoming/measured/{args.round}-{args.seed}.csv")
        [entry] = ledger.seen([dropped]).values()
        ledger.append([replace(entry, state=FileState.INDEXED, attempts=1, updated_at=None)])
    cost: dict[str, object] = {"seconds": took, "requests": sum(by_type.values()), "rss_mib": rss}
    if args.trace:
        cost |= {"by_type": dict(by_type), "trace": dict(trace.counts)}
    print(json.dumps(cost))


def peak_rss_mib() -> float:
    """This process's peak RSS since its exec (VmHWM): ru_maxrss would carry the RSS of the
    parent it was forked from."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


@dataclass(frozen=True, slots=True)
class Cost:
    seconds: float
    requests: float
    rss_mib: float


def measured_rounds(
    servers: dict[str, MeteredS3], bucket: str, repeats: int, trace: bool = False
) -> dict[str, dict[str, Cost]]:
    """Each measurement `repeats` times in each home, each in a fresh process, the homes taking
    turns sample by sample, so that both rounds see the same load on the machine; medians."""
    for server in servers.values():
        settings = Settings(home=server.home, s3_port=server.port, bucket=bucket)
        # The cursors the daemon's last ticks left: the feed read up to now, and the ledger
        # sensor's last look (before the measured batch and tick, whose commits it reads).
        _, ledger_cursor = sensor_tick(server.home, server.port, bucket, "ledger_tick", None)
        (server.home / "history-cursors.json").write_text(
            json.dumps({"tick": feed_cursor_now(settings), "ledger_tick": ledger_cursor})
        )
    costs: dict[str, dict[str, Cost]] = {name: {} for name in servers}
    for what in MEASUREMENTS:
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
        for seed in range(repeats):
            for name, server in servers.items():
                samples[name].append(measured_sample(server, bucket, name, what, seed, trace))
        for name, taken in samples.items():
            cost = costs[name][what] = Cost(
                statistics.median(s["seconds"] for s in taken),
                statistics.median(s["requests"] for s in taken),
                statistics.median(s["rss_mib"] for s in taken),
            )
            print(
                f"  {name:>6} {what:12} {cost.seconds:8.2f} s {cost.requests:8.0f} requests "
                f"{cost.rss_mib:8.0f} MiB",
                flush=True,
            )
    return costs


def measured_sample(
    server: MeteredS3, bucket: str, name: str, what: str, seed: int, trace: bool
) -> dict[str, Any]:
    """One measurement in a fresh process (its peak RSS its own)."""
    command = [
        sys.executable,
        __file__,
        "--measure",
        what,
        "--home",
        str(server.home),
        "--port",
        str(server.port),
        "--bucket",
        bucket,
        "--metrics-port",
        str(server.metrics_port),
        "--round",
        name,
        "--seed",
        str(seed + (1000 if name == "full" else 0)),
        *(["--trace"] if trace else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{what} ({name}) failed:\n{done.stdout}\n{done.stderr}")
    sample: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if trace:
        print(f"  {name} {what} by API: {sorted(sample['by_type'].items())}")
        for where, count in sorted(sample["trace"].items()):
            print(f"    {count:5d} {where}")
    return sample


def ratio(full: float, early: float) -> float:
    return round(full / early, 3) if early else float("inf")


def report(
    fill: Fill, early: dict[str, Cost], full: dict[str, Cost], fill_seconds: float
) -> dict[str, object]:
    print(
        f"\nhistory: {fill.written_batches} batches (record sets and sets files), "
        f"{fill.appended_rows} ledger rows in {fill.commits} commits, "
        f"filled in {fill_seconds:.0f} s"
    )
    print(f"{'':14} {'after 10':>26} {'full history':>26} {'ratios (time, requests, RSS)':>32}")
    for what in MEASUREMENTS:
        a, b = early[what], full[what]
        print(
            f"{what:14} {a.seconds:8.2f} s {a.requests:6.0f} req {a.rss_mib:5.0f} MiB "
            f"{b.seconds:8.2f} s {b.requests:6.0f} req {b.rss_mib:5.0f} MiB   "
            f"{ratio(b.seconds, a.seconds):6.2f}x {ratio(b.requests, a.requests):6.2f}x "
            f"{ratio(b.rss_mib, a.rss_mib):6.2f}x"
        )
    return {
        "history_batches": fill.written_batches,
        "ledger_rows": fill.appended_rows,
        "ledger_commits": fill.commits,
        "batch_time_ratio": ratio(full["batch"].seconds, early["batch"].seconds),
        "batch_requests_ratio": ratio(full["batch"].requests, early["batch"].requests),
        "batch_rss_ratio": ratio(full["batch"].rss_mib, early["batch"].rss_mib),
        "tick_time_ratio": ratio(full["tick"].seconds, early["tick"].seconds),
        "tick_requests_ratio": ratio(full["tick"].requests, early["tick"].requests),
        "ledger_tick_time_ratio": ratio(full["ledger_tick"].seconds, early["ledger_tick"].seconds),
        "ledger_tick_requests_ratio": ratio(
            full["ledger_tick"].requests, early["ledger_tick"].requests
        ),
        "reconcile_time_ratio": ratio(full["reconcile"].seconds, early["reconcile"].seconds),
        "reconcile_requests_ratio": ratio(full["reconcile"].requests, early["reconcile"].requests),
        "fill_seconds": round(fill_seconds),
    }


def figures(result: dict[str, object], smoke: bool) -> list[Figure]:
    size = f"{result['history_batches']} batches, {result['ledger_rows']} ledger rows"
    label = "history (smoke)" if smoke else "history"
    return [
        Figure(
            f"{label}: one more batch / sensor ticks at {size} vs after 10 batches",
            f"batch {result['batch_time_ratio']}x time, {result['batch_requests_ratio']}x "
            f"requests, {result['batch_rss_ratio']}x RSS; incoming tick "
            f"{result['tick_time_ratio']}x, ledger tick {result['ledger_tick_time_ratio']}x, "
            f"reconcile {result['reconcile_time_ratio']}x time",
            "<= 1.25x time, <= 1.1x requests, <= 1.25x RSS",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--smoke", action="store_true", help="a small history (seconds to a minute)"
    )
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--ledger-rows", type=int, default=1_000_000)
    parser.add_argument("--rows-per-commit", type=int, default=1000)
    parser.add_argument("--publish-every", type=int, default=1000, help="batches between publishes")
    parser.add_argument("--threads", type=int, default=FILL_THREADS)
    parser.add_argument("--repeats", type=int, default=5, help="samples of each measurement")
    parser.add_argument("--port", type=int, default=18440, help="the embedded S3 server's port")
    parser.add_argument("--metrics-port", type=int, help="the server's metrics (default: port + 9)")
    parser.add_argument(
        "--trace", action="store_true", help="print each measurement's requests by API and key"
    )
    parser.add_argument(
        "--early-port", type=int, help="the 10-batch home's server (default: a free port)"
    )
    parser.add_argument(
        "--early-metrics-port", type=int, help="its metrics (default: its port + 9)"
    )
    parser.add_argument(
        "--home", help="a folder for the two homes, early/ and full/ (default: a temporary one)"
    )
    # The child that runs one measurement.
    parser.add_argument("--measure", choices=MEASUREMENTS, help=argparse.SUPPRESS)
    parser.add_argument("--bucket", default="kindex", help=argparse.SUPPRESS)
    parser.add_argument("--round", default="early", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    add_write_docs(parser)
    args = parser.parse_args()
    # The benchmark makes its own settings: a configured home, endpoint or queue would take the
    # measured steps elsewhere (the sensors off the embedded server's feed).
    for name in [n for n in os.environ if n.startswith(("KINDEX_", "AWS_ENDPOINT_URL"))]:
        del os.environ[name]
    if args.measure:
        measure(args)
        return
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
        args.repeats = 1
    with home_folder(args.home) as folder:
        started: list[MeteredS3] = []

        def started_server(name: str, port: int, metrics_port: int | None) -> MeteredS3:
            server = MeteredS3(
                folder / name, port=port, metrics_port=metrics_port or port + PORT_BLOCK_SIZE
            )
            server.home.mkdir(exist_ok=True)
            server.start()
            started.append(server)
            return server

        try:
            full = started_server("full", args.port, args.metrics_port)
            # Its block is picked once the full home's server holds its ports (not before).
            early_port = args.early_port or find_free_port_block()
            early = started_server("early", early_port, args.early_metrics_port)
            result = build_and_measure({"early": early, "full": full}, args)
        finally:
            for server in started:
                server.stop()  # by its own PID: the servers this run started
    if args.write_docs:
        write_figures(figures(result, args.smoke))
    print(json.dumps(result))


@contextmanager
def home_folder(chosen: str | None) -> Iterator[Path]:
    """The chosen folder (kept), else a temporary one."""
    if chosen:
        Path(chosen).mkdir(parents=True, exist_ok=True)
        yield Path(chosen)
        return
    with tempfile.TemporaryDirectory(prefix="history-") as tmp:
        yield Path(tmp)


def build_and_measure(servers: dict[str, MeteredS3], args: argparse.Namespace) -> dict[str, object]:
    """Both homes filled to 10 batches, the full one on to its history; then both measured."""
    fills = {name: new_fill(server, args) for name, server in servers.items()}
    for name, fill in fills.items():
        print(f"history ({name}): {EARLY_BATCHES} batches", flush=True)
        fill.run(EARLY_BATCHES, args.threads, progress=True)
    full = fills["full"]
    print(f"history (full): filling to {args.batches} batches", flush=True)
    full.publish_every = args.publish_every
    start = time.perf_counter()
    full.run(args.batches, args.threads, progress=True)
    fill_seconds = time.perf_counter() - start
    costs = measured_rounds(servers, args.bucket, args.repeats, args.trace)
    return report(full, costs["early"], costs["full"], fill_seconds)


def new_fill(server: MeteredS3, args: argparse.Namespace) -> Fill:
    """A fill of the server's home to the history asked for, publishing every 10 batches until
    it has 10 (the early round's index holds them)."""
    settings = Settings(home=server.home, s3_port=server.port, bucket=args.bucket)
    store = S3Store.from_settings(settings)
    store.ensure_bucket()
    header, rows = liger_rows()
    return Fill(
        store,
        settings,
        normalized_template(store, settings, small_file(0, header, rows)),
        header,
        rows,
        ledger_rows=args.ledger_rows,
        batches=args.batches,
        rows_per_commit=args.rows_per_commit,
        publish_every=min(args.publish_every, EARLY_BATCHES),
    )


if __name__ == "__main__":
    main()
