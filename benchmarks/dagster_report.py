"""Benchmark what the Dagster UI's report costs a batch run: the window's metadata (the ledger's
count of every batch of the window, its runs' speedups, the chart), the checks, and what the
publish reports (the index, each table people query with its schema and row count, the index's
checks), against the batch itself (each file's snapshot, record set, the ledger, the publish),
measured in the same run.

Each round drops FILES small Liger files (ROWS rows each, bytes new to the bucket) into a fresh
embedded SeaweedFS, processes them as one batch as a run does (`process_batches`), then builds
the report as `records` does. Prints both times per round, the ratio (report / batch) and the
median ratio; exits non-zero when the median is over TARGET. With --write-docs, writes the
figure into docs/benchmarks.md.

    .venv/bin/python benchmarks/dagster_report.py [--files 50] [--rows 20] [--repeat 3]
                                                 [--s3-port 18333] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from report import Figure, add_write_docs, write_figures
from small_files import small_files

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET = 0.5  # the report costs at most half of what the batch itself costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--s3-port", type=int, default=18333)
    add_write_docs(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kindex-report-bench-") as home:
        os.environ["KINDEX_HOME"] = home
        os.environ["KINDEX_S3_PORT"] = str(args.s3_port)
        ratios = rounds(args.files, args.rows, args.repeat)
    median = statistics.median(ratios)
    print(f"median report/batch: {median:.2f}x (target <= {TARGET}x)")
    if args.write_docs:
        write_figures(
            [
                Figure(
                    f"dagster report: {args.files} small files' window, checks and index",
                    f"{median:.2f}x of the batch",
                    f"<= {TARGET}x",
                )
            ]
        )
    return 0 if median <= TARGET else 1


def rounds(files: int, rows: int, repeat: int) -> list[float]:
    from assets.files import BatchReport
    from assets.published import publish_report
    from assets.resources import KindexResource
    from pipelines.ingest import BatchResult, process_batches
    from pipelines.intake.ledger import FileEntry
    from pipelines.settings import Settings
    from pipelines.storage.s3 import store_session

    settings = Settings.from_env()
    ratios = []
    with store_session(settings) as store:
        store.ensure_bucket()
        kindex = KindexResource()
        for n in range(repeat):
            entries = []
            for i, (data, _) in enumerate(small_files(files, rows)):
                # New bytes each round: every file is read, normalized and written.
                info = store.put_bytes(f"incoming/r{n}/f{i}.csv", data + b"\n" * (n + 1))
                entries.append(FileEntry.pending(store.bucket, info, batch=f"bench-{n}"))
            kindex.ledger.append(entries)
            started = time.perf_counter()
            batch = f"bench-{n}"
            result = BatchResult.merged(
                batch, list(process_batches(store, settings, entries, batch))
            )
            processed = time.perf_counter()
            windows = sorted({e.arrival_window for e in entries})
            report = BatchReport.of(kindex, result, windows)
            for window in windows:
                report.window_metadata(window)
                report.verdicts(window)
            assert result.index is not None
            publish_report(kindex, result.index, result.requeued, "bench")
            reported = time.perf_counter()
            batch_s, report_s = processed - started, reported - processed
            ratios.append(report_s / batch_s)
            print(
                f"round {n}: batch {batch_s:.2f} s, report {report_s:.2f} s, "
                f"{report_s / batch_s:.2f}x"
            )
    return ratios


if __name__ == "__main__":
    sys.exit(main())
