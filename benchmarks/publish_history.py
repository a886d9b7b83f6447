"""What a publish costs against the bucket's history: one more batch after --small earlier
batches, against after --large, each home on the embedded S3 (SeaweedFS) with the product's own
writing code (`process_batch`: snapshots, record sets, a sets file and ledger rows per batch).

The history is published once; then, --repeats times, one more batch of --files small Liger
files is processed and the index published. Prints the median publish time and S3 requests of
each home, and their ratios (large over small): a publish reads the ledger rows committed since
its version and their sets files, never a listing of `records/`, so the ratios stay near 1.

    python benchmarks/publish_history.py [--small 10] [--large 300] [--files 5] [--repeats 5]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

S3_PORT = 18400


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=300)
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--port", type=int, default=S3_PORT)
    args = parser.parse_args()

    from index_support import csv_bytes, liger_rows

    from pipelines.index.publish import publish_index
    from pipelines.ingest import process_batch
    from pipelines.intake.ledger import FileEntry
    from pipelines.settings import Settings
    from pipelines.storage.embedded import EmbeddedS3
    from pipelines.storage.s3 import S3Store

    header, rows = liger_rows(range(2, 2449))
    stamp = header.index("timestamp")
    root = Path(tempfile.mkdtemp(prefix="ledgerpub-publish-history-"))
    server = EmbeddedS3(root / "s3", port=args.port).start()
    sent: list[str] = []
    real_call = S3Store._call

    def counted(store: S3Store, action: str, key: str, operation: Callable[[], Any]) -> Any:
        sent.append(action)
        return real_call(store, action, key, operation)

    S3Store._call = counted  # type: ignore[method-assign]
    try:
        file_number = 0

        def batch(store: S3Store, settings: Settings) -> None:
            nonlocal file_number
            entries = []
            for _ in range(args.files):
                fields = list(rows[file_number % len(rows)])
                fields[stamp] = f"2025-01-01 00:00:{file_number % 60:02d}.{file_number:06d}"
                data = csv_bytes(header, [fields])
                info = store.put_bytes(f"incoming/f{file_number:07d}.csv", data)
                entries.append(FileEntry.pending(store.bucket, info))
                file_number += 1
            process_batch(store, settings, entries, f"b{file_number}", publish=False)

        def home(history: int) -> dict[str, float]:
            store = S3Store(
                f"history-{uuid.uuid4().hex[:8]}",
                endpoint_url=server.endpoint_url,
                credentials=server.credentials,
            )
            store.ensure_bucket()
            settings = Settings(
                home=root / store.bucket, s3_endpoint=server.endpoint_url, bucket=store.bucket
            )
            started = time.perf_counter()
            for _ in range(history):
                batch(store, settings)
            publish_index(store, settings)
            built = time.perf_counter() - started
            times, requests, lists = [], [], []
            for _ in range(args.repeats):
                batch(store, settings)
                sent.clear()
                started = time.perf_counter()
                publish_index(store, settings)
                times.append(time.perf_counter() - started)
                requests.append(len(sent))
                lists.append(sent.count("list"))
            result = {
                "batches": history,
                "build_s": round(built, 1),
                "publish_s": statistics.median(times),
                "requests": statistics.median(requests),
                "lists": statistics.median(lists),
            }
            print(json.dumps(result), flush=True)
            return result

        small, large = home(args.small), home(args.large)
    finally:
        S3Store._call = real_call  # type: ignore[method-assign]
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "small_batches": small["batches"],
                "large_batches": large["batches"],
                "publish_time_ratio": round(large["publish_s"] / small["publish_s"], 2),
                "publish_requests_ratio": round(large["requests"] / small["requests"], 2),
                "publish_s_small": round(small["publish_s"], 3),
                "publish_s_large": round(large["publish_s"], 3),
                "requests_small": small["requests"],
                "requests_large": large["requests"],
                "lists_large": large["lists"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
