"""Discovery at rest: an idle minute of the sensors, empty bucket vs N objects in incoming/.

The sensors find new objects from the embedded SeaweedFS's change notifications (`weed
filer.meta.tail`, one short-lived child per incoming tick), so an idle minute should cost the
same whatever `incoming/` holds. On one embedded server, two buckets: `empty`, and `full` with
`--objects` tiny objects in incoming/ (uploaded with many threads through `put_bytes`) whose
ledger rows say indexed, as they would at rest. The sensors run in-process as the daemon runs
them, each tick with a fresh `KindexResource` and the cursor of the tick before.

An idle minute is 12 `incoming_files_sensor` ticks (every 5 s), 2 `ledger_sensor` and 2
`index_catchup_sensor` ticks (every 30 s), called back to back rather than 60 s apart (the
minute is compressed; the per-minute counts are the daemon's). Minutes of the two buckets
alternate, so a shared machine's noise falls on both; figures are medians. CPU is user+sys of
this process plus its reaped children (the weed of each poll), from getrusage; the server's own
CPU (`weed mini`, from /proc) is shown beside it. The `reconcile_sensor` ticks every 15
minutes, comparing the filer log since its last tick with the ledger (it lists nothing; a full
listing is `kindex reconcile --full`'s): its tick at rest is measured apart, with its share of a
minute (1/15).

Then, in the full bucket: a file dropped after the N objects must be found by the next incoming
tick (a run request whose batch's ledger row is that key), and a file whose notification was
lost (the feed's page polled and dropped) must be found by the reconcile sensor.

    .venv/bin/python benchmarks/discovery.py [--objects 100000 | --quick] [--minutes 5]
        [--write-docs]
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from dagster import (
    DagsterInstance,
    RunRequest,
    SensorDefinition,
    SensorResult,
    SkipReason,
    build_sensor_context,
)
from report import Figure, add_write_docs, write_figures

from assets.reconcile import RECONCILE_INTERVAL_SECONDS, reconcile_sensor
from assets.resources import KindexResource
from assets.sensors import (
    CATCHUP_INTERVAL_SECONDS,
    LEDGER_INTERVAL_SECONDS,
    TICK_INTERVAL_SECONDS,
    DiscoveryCursor,
    batch_of,
    incoming_files_sensor,
    index_catchup_sensor,
    ledger_sensor,
)
from pipelines.intake.ledger import FileEntry, FileState, Ledger
from pipelines.intake.notifications import FilerFeed
from pipelines.intake.notifications.filer import DEFAULT_OVERLAP
from pipelines.intake.reconcile import ReconcileCursor
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo
from pipelines.storage.embedded import EmbeddedS3, start_on_free_ports
from pipelines.storage.s3 import S3Store

UPLOAD_THREADS = 32
QUICK_OBJECTS = 2000
TARGET = 1.5
MINUTE = 60
# The daemon's ticks in one minute, in the order they fall: (sensor, ticks per minute).
PER_MINUTE = (
    (incoming_files_sensor, MINUTE // TICK_INTERVAL_SECONDS),
    (ledger_sensor, MINUTE // LEDGER_INTERVAL_SECONDS),
    (index_catchup_sensor, MINUTE // CATCHUP_INTERVAL_SECONDS),
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A configured endpoint or queue would take the sensors away from the embedded server's feed.
FOREIGN_SETTINGS = (
    "KINDEX_S3_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "KINDEX_SQS_QUEUE_URL",
    "KINDEX_CATALOG_URI",
)


def cpu_seconds() -> float:
    """User+sys CPU of this process and its reaped children (the weed each poll runs)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def server_seconds(pid: int) -> float:
    """User+sys CPU of the running `weed mini` (not reaped, so not in RUSAGE_CHILDREN)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


@dataclass(frozen=True, slots=True)
class Cost:
    client: float  # seconds of CPU here and in reaped children
    server: float  # seconds of CPU of the weed server
    wall: float


def measured(server_pid: int, work: Callable[[], object]) -> Cost:
    cpu, served, wall = cpu_seconds(), server_seconds(server_pid), time.perf_counter()
    work()
    return Cost(
        cpu_seconds() - cpu,
        server_seconds(server_pid) - served,
        time.perf_counter() - wall,
    )


@dataclass
class Sensors:
    """The daemon's view of one bucket: an instance and each sensor's cursor."""

    server: EmbeddedS3
    bucket: str
    instance: DagsterInstance
    cursors: dict[str, str | None] = field(default_factory=dict)

    def resource(self) -> KindexResource:
        # A fresh resource per tick, as the daemon builds one per evaluation.
        return KindexResource(
            home=str(self.server.home),
            s3_port=str(self.server.port),
            bucket=self.bucket,
            notifications="filer",
        )

    def tick(self, sensor: SensorDefinition) -> list[RunRequest]:
        context = build_sensor_context(
            instance=self.instance,
            cursor=self.cursors.get(sensor.name),
            resources={"kindex": self.resource()},
        )
        result = sensor(context)
        if isinstance(result, SkipReason):  # the daemon keeps the cursor
            return []
        assert isinstance(result, SensorResult), result
        if result.cursor is not None:
            self.cursors[sensor.name] = result.cursor
        return list(result.run_requests or [])

    def idle_minute(self) -> None:
        """One minute of ticks, back to back; at rest none may request a run."""
        incoming, ledger_ticks, catchup_ticks = (count for _, count in PER_MINUTE)
        for n in range(incoming):
            requests = self.tick(incoming_files_sensor)
            # The 30 s sensors fall due on the first and seventh 5 s tick.
            if n % (incoming // ledger_ticks) == 0:
                requests += self.tick(ledger_sensor)
            if n % (incoming // catchup_ticks) == 0:
                requests += self.tick(index_catchup_sensor)
            assert not requests, f"an idle tick of {self.bucket} requested {requests}"


def batch_keys(ledger: Ledger, request: RunRequest) -> list[str]:
    """The keys of the ledger rows of the batch a run request names."""
    return [entry.key for entry in ledger.of_batch(batch_of(request))]


def fill(store: S3Store, count: int) -> list[ObjectInfo]:
    """`count` tiny objects under incoming/, each as its upload's HEAD saw it."""
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        return list(
            pool.map(
                lambda n: store.put_bytes(f"incoming/{n:07d}.csv", f"a,b\n{n},2\n".encode()),
                range(count),
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_OBJECTS} objects")
    parser.add_argument("--minutes", type=int, default=5, help="idle minutes per bucket")
    parser.add_argument(
        "--reconcile-ticks", type=int, default=3, help="reconcile ticks measured per bucket"
    )
    add_write_docs(parser)
    args = parser.parse_args()
    objects = QUICK_OBJECTS if args.quick else args.objects
    for name in FOREIGN_SETTINGS:
        os.environ.pop(name, None)

    with tempfile.TemporaryDirectory(prefix="kindex-discovery-") as tmp:
        server = start_on_free_ports(Path(tmp))
        assert server.pid is not None
        pid = server.pid
        try:
            settings = Settings(home=server.home, s3_port=server.port)
            full_store = S3Store.from_settings(settings.replace(bucket="full"))
            for bucket in ("empty", "full"):
                full_store.with_bucket(bucket).ensure_bucket()

            start = time.perf_counter()
            infos = fill(full_store, objects)
            took = time.perf_counter() - start
            print(f"uploaded {objects} objects in {took:.0f} s ({objects / took:.0f}/s)")
            full_ledger = Ledger.of(full_store, settings.replace(bucket="full"))
            full_ledger.append(
                [
                    replace(FileEntry.pending("full", info), state=FileState.INDEXED, attempts=1)
                    for info in infos
                ]
            )
            del infos

            with DagsterInstance.ephemeral() as instance:
                sensors = {b: Sensors(server, b, instance) for b in ("empty", "full")}
                for each in sensors.values():  # the daemon's cursors at rest
                    each.idle_minute()
                    assert not each.tick(reconcile_sensor), "at rest, nothing is missing"
                time.sleep(DEFAULT_OVERLAP.total_seconds() + 1)  # past the feed's overlap

                minute: dict[str, list[Cost]] = {"empty": [], "full": []}
                for _ in range(args.minutes):
                    for bucket, each in sensors.items():
                        minute[bucket].append(measured(pid, each.idle_minute))
                reconciles: dict[str, list[Cost]] = {"empty": [], "full": []}
                for _ in range(args.reconcile_ticks):
                    for bucket, each in sensors.items():
                        reconciles[bucket].append(
                            measured(pid, functools.partial(each.tick, reconcile_sensor))
                        )
                        # The label says the filer log: a tick that read it kept its position.
                        cursor = ReconcileCursor.from_json(each.cursors[reconcile_sensor.name])
                        assert cursor.feed is not None, "the reconcile tick read no filer log"

                found_wall = drop_and_find(sensors["full"], full_store, full_ledger)
                lost_wall = lose_and_reconcile(sensors["full"], full_store, full_ledger, settings)
        finally:
            server.stop()  # by its own PID: the server this run started

    def median(costs: list[Cost], part: str) -> float:
        return statistics.median(getattr(c, part) for c in costs)

    empty, full = median(minute["empty"], "client"), median(minute["full"], "client")
    empty_srv, full_srv = median(minute["empty"], "server"), median(minute["full"], "server")
    tick_empty = median(reconciles["empty"], "client")
    tick_full = median(reconciles["full"], "client")
    tick_full_srv = median(reconciles["full"], "server")
    share = MINUTE / RECONCILE_INTERVAL_SECONDS
    ratio = full / empty
    ratio_server = (full + full_srv) / (empty + empty_srv)
    ratio_amortized = (full + share * tick_full) / (empty + share * tick_empty)
    wall = median(minute["full"], "wall")

    print(
        f"\nan idle minute of the sensors (12 incoming, 2 ledger, 2 catchup ticks, back to back;"
        f" median of {args.minutes})"
    )
    print(f"{'':32} {'empty':>10} {f'{objects} objects':>16} {'ratio':>7}")
    print(f"{'CPU, sensors (self + weed polls)':32} {empty:9.3f}s {full:15.3f}s {ratio:6.2f}x")
    print(
        f"{'CPU, incl. the weed server':32} {empty + empty_srv:9.3f}s "
        f"{full + full_srv:15.3f}s {ratio_server:6.2f}x"
    )
    print(
        f"{'reconcile tick (filer log)':32} {tick_empty:9.3f}s {tick_full:15.3f}s "
        f"(server {tick_full_srv:.3f}s)"
    )
    print(
        f"{'idle minute + reconcile / 15':32} {empty + share * tick_empty:9.3f}s "
        f"{full + share * tick_full:15.3f}s {ratio_amortized:6.2f}x"
    )
    print(f"(a compressed minute took {wall:.1f} s of wall time with {objects} objects)")
    print(
        f"\na file dropped after the {objects}: found by the next incoming tick "
        f"({found_wall * 1000:.0f} ms)"
    )
    print(f"a file whose notification was lost: found by the reconcile tick ({lost_wall:.1f} s)")
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(f"\nratio {ratio:.2f}x: {verdict} the target <= {TARGET}x")

    if args.write_docs:
        write_figures(
            [
                Figure(
                    f"discovery: idle sensor minute, {objects} objects vs empty bucket (CPU)",
                    f"{ratio:.2f}x ({full * 1000:.0f} vs {empty * 1000:.0f} ms); with the "
                    f"reconcile tick amortized (1/15 of {tick_full:.2f} s, the filer log) "
                    f"{ratio_amortized:.2f}x; dropped and lost files found",
                    f"<= {TARGET}x",
                )
            ]
        )


def drop_and_find(sensors: Sensors, store: S3Store, ledger: Ledger) -> float:
    """A file dropped now is in the next incoming tick's run request; its wall seconds."""
    key = "incoming/dropped-after.csv"
    store.put_bytes(key, b"a,b\n1,2\n")
    start = time.perf_counter()
    requests = sensors.tick(incoming_files_sensor)
    took = time.perf_counter() - start
    assert [batch_keys(ledger, r) for r in requests] == [[key]], requests
    return took


def lose_and_reconcile(
    sensors: Sensors, store: S3Store, ledger: Ledger, settings: Settings
) -> float:
    """A file whose notification is lost (its page polled and dropped) is found by the reconcile
    tick, not the incoming one; the reconcile tick's wall seconds."""
    key = "incoming/lost-notification.csv"
    store.put_bytes(key, b"a,b\n3,4\n")
    feed = FilerFeed.from_settings(settings.replace(bucket=sensors.bucket))
    cursor = DiscoveryCursor.from_json(sensors.cursors[incoming_files_sensor.name])
    page = feed.poll(cursor.feed, 1000)
    assert [c.key for c in page.changes] == [key], page.changes
    sensors.cursors[incoming_files_sensor.name] = replace(cursor, feed=page.cursor).to_json()
    assert not sensors.tick(incoming_files_sensor), "the lost notification came back"
    start = time.perf_counter()
    requests = sensors.tick(reconcile_sensor)
    took = time.perf_counter() - start
    assert [batch_keys(ledger, r) for r in requests] == [[key]], requests
    return took


if __name__ == "__main__":
    main()
