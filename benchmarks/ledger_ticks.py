"""The ledger sensor's tick and a reconcile tick, with a small and a large file ledger.

Two buckets of one embedded SeaweedFS: `small` with SMALL rows, `large` with --rows rows (default
100,000), both appended through the product's own `Ledger.append` in commits of --per-commit
rows, each commit one arrival window, the windows going back an hour at a time (100,000 rows:
200 windows over eight days). The rows are done (indexed) but for the newest window's, which
are pending: what a fleet's ledger looks like between batches; that window holds OPEN rows in
both ledgers, so that what differs is the history behind it. Each bucket's incoming/ holds the
same 20 objects, known to its ledger.

Then, alternating the two buckets, --repeat times each (median):
- the ledger sensor's tick (`assets.sensors.ledger_sensor`, a fresh cursor so it never skips):
  `Ledger.due` and `Ledger.waiting`, read from the oldest open window on;
- a reconcile tick (`assets.reconcile.reconcile_tick`): the filer log since the last tick and
  `Ledger.seen` of what it held;
- a publish's `every_version_processed` check (`assets.published.missing_versions_check`, a
  fresh resource as a run has): the ledger's open versions, no listing;
- a backfill of the newest window (`Ledger.select`, its partition);
- beside them, the full check `kindex reconcile --full` runs (`unprocessed_versions`: a listing
  of incoming/ and the whole ledger), which grows with the ledger by design.

The last line of stdout is one JSON object: the rows, the data files each read plans, the
medians and the ratios large / small (the design's target: about 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

from assets.published import missing_versions_check
from assets.reconcile import reconcile_tick
from assets.resources import KindexResource
from assets.sensors import ledger_sensor
from pipelines.intake.ledger import (
    FileEntry,
    FileState,
    Ledger,
    open_filter,
    unprocessed_versions,
    window_of,
)
from pipelines.intake.reconcile import ReconcileCursor
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo
from pipelines.storage.embedded import start_on_free_ports
from pipelines.storage.s3 import S3Store

SMALL = 100
OPEN = SMALL // 10  # rows of the newest (pending) window, in both ledgers
OBJECTS = 20
FOREIGN_SETTINGS = ("KINDEX_S3_ENDPOINT", "KINDEX_BUCKET", "KINDEX_HOME", "KINDEX_CATALOG_URI")


def fill_ledger(
    ledger: Ledger, bucket: str, rows: int, per_commit: int, now: datetime
) -> tuple[int, int]:
    """About `rows` rows in commits of `per_commit` (the newest of OPEN), a window each, newest
    last; returns the commits and the rows."""
    commits, written = max(1, rows // per_commit), 0
    for commit in range(commits):
        at = now - timedelta(hours=commits - commit)
        state = FileState.PENDING if commit == commits - 1 else FileState.INDEXED
        entries = [
            replace(
                FileEntry.pending(
                    bucket,
                    ObjectInfo(f"incoming/w{commit:05d}/{n:05d}.csv", f"{n:032x}", 100, at),
                ),
                state=state,
                attempts=0 if state is FileState.PENDING else 1,
            )
            for n in range(OPEN if commit == commits - 1 else per_commit)
        ]
        ledger.append(entries)
        written += len(entries)
    return commits, written


def median_seconds(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the large ledger")
    parser.add_argument("--per-commit", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="10,000 rows, 3 repeats")
    args = parser.parse_args()
    rows, repeat = (10_000, 3) if args.quick else (args.rows, args.repeat)
    for name in FOREIGN_SETTINGS:
        os.environ.pop(name, None)

    with tempfile.TemporaryDirectory(prefix="kindex-ledger-ticks-") as tmp:
        server = start_on_free_ports(Path(tmp))
        try:
            settings = Settings(home=server.home, s3_port=server.port)
            now = datetime.now(UTC).replace(microsecond=0)
            kindexes: dict[str, KindexResource] = {}
            ledgers: dict[str, Ledger] = {}
            commits: dict[str, int] = {}
            written: dict[str, int] = {}
            for bucket, count, per_commit in (
                ("small", SMALL, SMALL // 10),
                ("large", rows, args.per_commit),
            ):
                store = S3Store.from_settings(settings.replace(bucket=bucket))
                store.ensure_bucket()
                ledger = Ledger.of(store, settings.replace(bucket=bucket))
                start = time.perf_counter()
                commits[bucket], written[bucket] = fill_ledger(
                    ledger, bucket, count, per_commit, now
                )
                infos = [
                    store.put_bytes(f"incoming/obj{n:03d}.csv", f"a,b\n{n},2\n".encode())
                    for n in range(OBJECTS)
                ]
                ledger.append(
                    [replace(FileEntry.pending(bucket, i), state=FileState.INDEXED) for i in infos]
                )
                print(
                    f"{bucket}: {written[bucket]} rows in {commits[bucket]} commits "
                    f"({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
                ledgers[bucket] = ledger
                kindexes[bucket] = KindexResource(
                    home=str(server.home),
                    s3_port=str(server.port),
                    bucket=bucket,
                    notifications="filer",
                )

            with DagsterInstance.ephemeral() as instance:

                def ledger_tick(bucket: str) -> None:
                    context = build_sensor_context(
                        instance=instance, resources={"kindex": kindexes[bucket]}
                    )
                    result = ledger_sensor(context)
                    assert isinstance(result, SensorResult | SkipReason)

                cursors = {b: ReconcileCursor() for b in kindexes}

                def reconcile(bucket: str) -> None:
                    step, missing = reconcile_tick(kindexes[bucket], cursors[bucket])
                    cursors[bucket] = step.cursor
                    assert not missing, f"{bucket}: {len(missing)} missing at rest"

                for bucket in kindexes:  # warm: the first reconcile tick reads the log's start
                    ledger_tick(bucket)
                    reconcile(bucket)

                def publish_check(bucket: str) -> None:
                    fresh = KindexResource(**kindexes[bucket].model_dump())  # a run's own
                    missing_versions_check(fresh)

                newest = window_of(now - timedelta(hours=1))

                def window_backfill(bucket: str) -> None:
                    assert ledgers[bucket].select(windows=[newest])

                def full_check(bucket: str) -> None:
                    fresh = KindexResource(**kindexes[bucket].model_dump())
                    unprocessed_versions(fresh.store, fresh.settings, fresh.ledger)

                measures = {
                    "ledger_tick": ledger_tick,
                    "reconcile_tick": reconcile,
                    "publish_check": publish_check,
                    "window_backfill": window_backfill,
                    "full_check": full_check,
                }
                times: dict[str, dict[str, list[float]]] = {
                    m: {b: [] for b in kindexes} for m in measures
                }
                for _ in range(repeat):
                    for bucket in kindexes:
                        for name, work in measures.items():
                            times[name][bucket].append(
                                median_seconds(lambda b=bucket, w=work: w(b), 1)
                            )
            planned = {b: ledgers[b].planned_files() for b in ledgers}
            due_planned = {
                b: ledgers[b].planned_files(open_filter(ledgers[b].open_since())) for b in ledgers
            }
        finally:
            server.stop()  # by its own PID: the server this run started

    medians = {m: {b: statistics.median(t) for b, t in by.items()} for m, by in times.items()}
    ledger_median, reconcile_median = medians["ledger_tick"], medians["reconcile_tick"]
    for bucket in kindexes:
        print(
            f"{bucket:6} "
            + "   ".join(f"{m} {medians[m][bucket] * 1000:6.0f} ms" for m in medians)
            + f"   data files {planned[bucket]:4}, of them read by due {due_planned[bucket]}"
        )
    summary = {
        "small_rows": written["small"] + OBJECTS,
        "large_rows": written["large"] + OBJECTS,
        "large_commits": commits["large"] + 1,
        "data_files": planned,
        "due_data_files": due_planned,
        "ledger_tick_s": ledger_median,
        "reconcile_tick_s": reconcile_median,
        "ledger_tick_time_ratio": round(ledger_median["large"] / ledger_median["small"], 2),
        "reconcile_time_ratio": round(reconcile_median["large"] / reconcile_median["small"], 2),
        **{
            f"{m}_time_ratio": round(medians[m]["large"] / medians[m]["small"], 2)
            for m in ("publish_check", "window_backfill", "full_check")
        },
        "s": {m: {b: round(t, 4) for b, t in by.items()} for m, by in medians.items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
