"""What a publish costs against the bucket's history: one more batch after --small earlier
batches, against after --large, each home on the embedded S3 (SeaweedFS) with the product's own
writing code (`process_batch`: snapshots, record sets, a sets file and ledger rows per batch).

The history is published once; then, --repeats times, one more batch of --files small Liger
files is processed and the index published. Prints the median publish time and S3 requests of
each home, and their ratios (large over small): a publish reads the ledger rows committed since
its version and their sets files, never a listing of `records/`, so the ratios stay near 1.

    python benchmarks/publish_history.py [--small 10] [--large 300] [--files 5] [--repeats 5]
        [--write-docs]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

S3_PORT = 18400

from report import Figure, add_write_docs, write_figures  # noqa: E402


class CountingProxy:
    """An HTTP proxy to `upstream` that records each request's method and path. The Host
    header goes through unchanged, so the clients' signatures still hold."""

    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        self.sent: list[tuple[str, str]] = []
        sent = self.sent

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def relay(self) -> None:
                sent.append((self.command, self.path))
                body = b""
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self._chunked()
                elif length := int(self.headers.get("Content-Length") or 0):
                    body = self.rfile.read(length)
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                try:
                    conn.putrequest(
                        self.command, self.path, skip_host=True, skip_accept_encoding=True
                    )
                    for name, value in self.headers.items():
                        if name.lower() != "expect":  # answered here already
                            conn.putheader(name, value)
                    conn.endheaders(body or None)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                self.send_response_only(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection"):
                        self.send_header(name, value)
                if response.getheader("Content-Length") is None:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _chunked(self) -> bytes:
                raw = b""
                while True:
                    line = self.rfile.readline()
                    raw += line
                    size = int(line.split(b";")[0], 16)
                    chunk = self.rfile.read(size + 2)
                    raw += chunk
                    if size == 0:
                        while chunk not in (b"\r\n", b""):  # trailers
                            chunk = self.rfile.readline()
                            raw += chunk
                        return raw

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=300)
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--port", type=int, default=S3_PORT)
    add_write_docs(parser)
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
    # Every request to the bucket, boto3's and the Iceberg writer's (pyarrow) alike, goes
    # through a counting proxy in front of the server.
    proxy = CountingProxy(server.endpoint_url)
    sent = proxy.sent
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
                endpoint_url=proxy.endpoint_url,
                credentials=server.credentials,
            )
            store.ensure_bucket()
            settings = Settings(
                home=root / store.bucket, s3_endpoint=proxy.endpoint_url, bucket=store.bucket
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
                # Listings of the record sets (the Iceberg writer lists table folders too).
                lists.append(
                    sum(1 for _, path in sent if "list-type" in path and "=records" in path)
                )
            result = {
                "batches": history,
                "build_s": round(built, 1),
                "publish_s": statistics.median(times),
                "requests": statistics.median(requests),
                "records_lists": statistics.median(lists),
            }
            print(json.dumps(result), flush=True)
            return result

        small, large = home(args.small), home(args.large)
    finally:
        proxy.close()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    time_ratio = large["publish_s"] / small["publish_s"]
    requests_ratio = large["requests"] / small["requests"]
    if args.write_docs:
        name = f"publish after {args.large} vs {args.small} batches"
        write_figures(
            [
                Figure(
                    f"{name}: time",
                    f"{time_ratio:.2f}x ({large['publish_s']:.2f} vs {small['publish_s']:.2f} s)",
                    "<= 1.25x",
                ),
                Figure(
                    f"{name}: S3 requests",
                    f"{requests_ratio:.2f}x ({large['requests']:g} vs {small['requests']:g}), "
                    f"{large['records_lists']:g} listings of records/",
                    "<= 1.1x",
                ),
            ]
        )
    print(
        json.dumps(
            {
                "small_batches": small["batches"],
                "large_batches": large["batches"],
                "publish_time_ratio": round(time_ratio, 2),
                "publish_requests_ratio": round(requests_ratio, 2),
                "publish_s_small": round(small["publish_s"], 3),
                "publish_s_large": round(large["publish_s"], 3),
                "requests_small": small["requests"],
                "requests_large": large["requests"],
                "records_lists_large": large["records_lists"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
