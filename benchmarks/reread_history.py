"""What a batch of bytes kept before and the `no_failing_files` check cost against the bucket's
history: after --small earlier batches, against after --large, each home on the embedded S3
(SeaweedFS) with the product's own writing code (`process_batch`: snapshots, record sets, a sets
file and ledger rows per batch; one file in --bad-every batches quarantined).

The history is published once and the failing set carried from its first look; then, --repeats
times, --files files of the history dropped again under new keys (their record sets found and
reused) are processed and the index published, and the failing files looked up. Prints the
median time and S3 requests of each, per home, their ratios (large over small) and the listings
of `records/`: neither step lists it, so the ratios stay near 1.

    python benchmarks/reread_history.py [--small 10] [--large 200] [--files 5] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
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

S3_PORT = 18800

from publish_history import CountingProxy  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=200)
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--bad-every", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--port", type=int, default=S3_PORT)
    args = parser.parse_args()

    from index_support import csv_bytes, liger_rows

    from pipelines.index.publish import publish_index
    from pipelines.ingest import process_batch
    from pipelines.intake.failing import failing_files
    from pipelines.intake.ledger import FileEntry, Ledger
    from pipelines.settings import Settings
    from pipelines.storage.embedded import EmbeddedS3
    from pipelines.storage.s3 import S3Store

    header, rows = liger_rows(range(2, 2449))
    stamp = header.index("timestamp")
    root = Path(tempfile.mkdtemp(prefix="listings-reread-history-"))
    server = EmbeddedS3(root / "s3", port=args.port).start()
    proxy = CountingProxy(server.endpoint_url)  # every request, boto3's and pyarrow's
    sent = proxy.sent

    def records_lists() -> int:
        return sum(1 for _, path in sent if "list-type" in path and "=records" in path)

    try:

        def home(history: int) -> dict[str, float]:
            store = S3Store(
                f"reread-{uuid.uuid4().hex[:8]}",
                endpoint_url=proxy.endpoint_url,
                credentials=server.credentials,
            )
            store.ensure_bucket()
            settings = Settings(
                home=root / store.bucket, s3_endpoint=proxy.endpoint_url, bucket=store.bucket
            )
            ledger = Ledger.of(store, settings)
            kept: list[bytes] = []
            started = time.perf_counter()
            for n in range(history):
                entries = []
                for _ in range(args.files):
                    fields = list(rows[len(kept) % len(rows)])
                    n_file = len(kept)  # a timestamp of its own, so a run of its own
                    fields[stamp] = (
                        f"2025-01-{1 + n_file // 86400:02d} {n_file // 3600 % 24:02d}:"
                        f"{n_file // 60 % 60:02d}:{n_file % 60:02d}"
                    )
                    kept.append(csv_bytes(header, [fields]))
                    info = store.put_bytes(f"incoming/f{len(kept):07d}.csv", kept[-1])
                    entries.append(FileEntry.pending(store.bucket, info))
                if n % args.bad_every == 0:  # quarantined: no source recognizes it
                    info = store.put_bytes(f"incoming/bad{n:05d}.txt", b"not a result %d\n" % n)
                    entries.append(FileEntry.pending(store.bucket, info))
                process_batch(store, settings, entries, f"b{n}", publish=False)
            publish_index(store, settings)
            failing = len(failing_files(store, settings, ledger).files)
            built = time.perf_counter() - started
            batch_s, batch_requests, fail_s, fail_requests, lists = [], [], [], [], []
            for repeat in range(args.repeats):
                again = [kept[(i * 7 + repeat) % len(kept)] for i in range(args.files)]
                entries = [
                    FileEntry.pending(
                        store.bucket, store.put_bytes(f"incoming/again-{repeat}-{i}.csv", data)
                    )
                    for i, data in enumerate(again)
                ]
                sent.clear()
                started = time.perf_counter()
                result = process_batch(store, settings, entries, f"again{repeat}")
                batch_s.append(time.perf_counter() - started)
                batch_requests.append(len(sent))
                assert all(f.records is not None and f.records.reused for f in result.files)
                lists.append(records_lists())
                sent.clear()
                started = time.perf_counter()
                now = failing_files(store, settings, ledger).files
                fail_s.append(time.perf_counter() - started)
                fail_requests.append(len(sent))
                # the same answer as a read of every window
                assert now == ledger.current("state IN ('failed', 'quarantined')")
                assert len(now) == failing
                lists[-1] += records_lists()
            result_row = {
                "batches": history,
                "failing_files": failing,
                "build_s": round(built, 1),
                "batch_s": statistics.median(batch_s),
                "batch_requests": statistics.median(batch_requests),
                "check_s": statistics.median(fail_s),
                "check_requests": statistics.median(fail_requests),
                "records_lists": max(lists),
            }
            print(json.dumps(result_row), flush=True)
            return result_row

        small, large = home(args.small), home(args.large)
    finally:
        proxy.close()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

    def ratio(name: str) -> float:
        return round(large[name] / small[name], 2)

    print(
        json.dumps(
            {
                "small_batches": small["batches"],
                "large_batches": large["batches"],
                "reread_batch_time_ratio": ratio("batch_s"),
                "reread_batch_requests_ratio": ratio("batch_requests"),
                "failing_check_time_ratio": ratio("check_s"),
                "failing_check_requests_ratio": ratio("check_requests"),
                "batch_s_small": round(small["batch_s"], 3),
                "batch_s_large": round(large["batch_s"], 3),
                "check_s_small": round(small["check_s"], 3),
                "check_s_large": round(large["check_s"], 3),
                "records_lists": max(small["records_lists"], large["records_lists"]),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
