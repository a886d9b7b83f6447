"""Object storage against the embedded SeaweedFS, measured in one run with its own baselines.

Prints: server start and stop times; S3Store.put_bytes (PUT + HEAD for LastModified) against a
bare boto3 put_object; listing; take_snapshot of a large object against a bare GET + PUT of it.

    .venv/bin/python benchmarks/storage.py [--objects 300] [--megabytes 64] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from report import Figure, add_write_docs, write_figures

from pipelines.intake.snapshots import read_snapshot, take_snapshot
from pipelines.settings import Settings
from pipelines.storage.embedded import EmbeddedS3, start_on_free_ports
from pipelines.storage.s3 import S3Store


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def small_puts(store: S3Store, count: int) -> tuple[float, float]:
    """Objects per second: bare boto3 put_object, then S3Store.put_bytes."""
    bare = timed(
        lambda: [
            store.client.put_object(Bucket=store.bucket, Key=f"bare/{i}", Body=b"x" * 512)
            for i in range(count)
        ]
    )
    ours = timed(lambda: [store.put_bytes(f"ours/{i}", b"x" * 512) for i in range(count)])
    return count / bare, count / ours


def snapshot_throughput(store: S3Store, settings: Settings, megabytes: int) -> tuple[float, float]:
    """MB/s: a bare GET + PUT of the object, then take_snapshot + read_snapshot."""
    data = os.urandom(megabytes * 1024 * 1024)
    store.put_bytes("incoming/big.bin", data)

    def bare() -> None:
        body = store.client.get_object(Bucket=store.bucket, Key="incoming/big.bin")["Body"].read()
        store.client.put_object(Bucket=store.bucket, Key="copy/big.bin", Body=body)

    def ours() -> None:
        snap = take_snapshot(store, settings, "incoming/big.bin")
        read_snapshot(store, settings, snap)

    return megabytes / timed(bare), megabytes / timed(ours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--megabytes", type=int, default=64)
    add_write_docs(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kindex-bench-") as tmp:
        home = Path(tmp)
        start = time.perf_counter()
        server = start_on_free_ports(home)
        started = time.perf_counter() - start
        try:
            settings = Settings(home=home, s3_port=server.port)
            client_start = time.perf_counter()
            store = S3Store.from_settings(settings)
            client_created = time.perf_counter() - client_start
            store.ensure_bucket()
            bare_puts, our_puts = small_puts(store, args.objects)
            listed = timed(lambda: list(store.list("")))
            bare_mbs, snap_mbs = snapshot_throughput(store, settings, args.megabytes)
        finally:
            stopped = timed(server.stop)
        restarted = timed(lambda: EmbeddedS3(home, port=server.port).start().stop())

    print(f"server start {started:.2f} s, stop {stopped:.2f} s, start+stop again {restarted:.2f} s")
    print(f"boto3 client creation {client_created * 1000:.0f} ms (once per store)")
    print(
        f"small PUTs: boto3 {bare_puts:.0f}/s, S3Store.put_bytes {our_puts:.0f}/s "
        f"(ratio {our_puts / bare_puts:.2f}; the HEAD that reads LastModified)"
    )
    print(f"list: {2 * args.objects / listed:.0f} keys/s over {2 * args.objects} keys")
    print(
        f"{args.megabytes} MiB object: bare GET+PUT {bare_mbs:.0f} MB/s, take_snapshot + "
        f"read_snapshot {snap_mbs:.0f} MB/s (ratio {snap_mbs / bare_mbs:.2f}; adds a HEAD, "
        "the read record, a GET of the copy and two sha256)"
    )
    if args.write_docs:
        write_figures(
            [
                Figure(
                    "storage: S3Store.put_bytes vs bare boto3 put_object (small objects)",
                    f"{our_puts / bare_puts:.2f}x ({our_puts:.0f} vs {bare_puts:.0f}/s)",
                ),
                Figure(
                    f"storage: take_snapshot + read_snapshot vs GET+PUT ({args.megabytes} MiB)",
                    f"{snap_mbs / bare_mbs:.2f}x ({snap_mbs:.0f} vs {bare_mbs:.0f} MB/s)",
                ),
            ]
        )


if __name__ == "__main__":
    main()
