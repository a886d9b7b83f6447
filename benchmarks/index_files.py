"""Small files one by one: how many data files a full scan of `runs` opens, and what a publish
costs as the index grows, against the embedded S3 (SeaweedFS).

Ingests --files small Liger CSVs (--rows rows each) one after another into one home, each its
own publish, and prints every --every files: the data files per table of the current version,
the files a full scan of `runs` opens (run_segments: the table
the `runs` view reads), and the median publish time of the last stretch against the first
stretch's (the baseline measured in the same run). At the end, the index's fingerprints are
compared with those of one publish of all the same files into a second home (compaction kept
every row). Target: at most 50 files for a full scan of `runs` after 1,000 files.

    python benchmarks/index_files.py [--files 1000] [--rows 5] [--every 100]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

# The tables the `runs` view reads.
RUNS_SCAN = ("run_segments",)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args()

    from index_support import csv_bytes, drop_and_process, fingerprints, liger_rows

    from pipelines.index.local import load_current
    from pipelines.index.publish import publish_index
    from pipelines.settings import Settings
    from pipelines.storage.embedded import start_on_free_ports
    from pipelines.storage.s3 import S3Store

    header, rows = liger_rows(range(2, 2449))
    root = Path(tempfile.mkdtemp(prefix="kindex-index-files-"))
    server = start_on_free_ports(root / "s3")
    try:

        def target(name: str) -> tuple[S3Store, Settings]:
            store = S3Store(
                f"{name}-{uuid.uuid4().hex[:8]}",
                endpoint_url=server.endpoint_url,
                credentials=server.credentials,
            )
            store.ensure_bucket()
            settings = Settings(
                home=root / name, s3_endpoint=server.endpoint_url, bucket=store.bucket
            )
            return store, settings

        store, settings = target("one-by-one")
        files = []
        for i in range(args.files):
            # Rows cycle through the shared CSV: past its end, the same bytes come again under
            # new keys (new reads of a known snapshot).
            start = (i * args.rows) % (len(rows) - args.rows)
            files.append(
                (f"incoming/f{i:05}.csv", csv_bytes(header, rows[start : start + args.rows]))
            )
        times: list[float] = []
        first: float | None = None
        for i, (key, data) in enumerate(files, 1):
            drop_and_process(store, settings, key, data)
            began = time.perf_counter()
            publish_index(store, settings)
            times.append(time.perf_counter() - began)
            if i % args.every == 0 or i == args.files:
                current = load_current(store, settings)
                per_table = {name: len(keys) for name, keys in current.files.items()}
                scan = sum(per_table[name] for name in RUNS_SCAN)
                stretch = statistics.median(times[-args.every :])
                first = first if first is not None else stretch
                print(
                    f"{i:5} files: runs scan opens {scan} files {per_table}; "
                    f"publish median {stretch:.2f} s ({stretch / first:.2f}x the first stretch)",
                    flush=True,
                )
        compacted = fingerprints(settings)
        other_store, other = target("all-at-once")
        for key, data in files:
            drop_and_process(other_store, other, key, data)
        publish_index(other_store, other)
        same = fingerprints(other) == compacted
        print(f"fingerprints equal to one publish of all {args.files} files: {same}")
        return 0 if same else 1
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
