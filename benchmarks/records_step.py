"""The Dagster `records` step against in-process ingest, on the same large file.

For one synthetic Liger CSV (the shared CSV tiled with distinct x values and timestamps, as
benchmarks/ingest.py builds it), each pair times, each in a fresh bucket of one embedded
SeaweedFS:
- `pipelines.ingest.ingest_file`: what `kindex ingest` spends on the file (upload, snapshot,
  records), its index publish left out, as the step publishes nothing either;
- the `records` step of the file's partition, run by Dagster's `materialize` in-process after
  the snapshot step: normalize, write the record set, then the checks and metadata (schema
  check, duplicates, previews, the speedup chart), as its STEP_START to STEP_SUCCESS.
Prints each pair and the median of the pairs' ratios (target: at most 1.3). Usage:

    python benchmarks/records_step.py [--rows 200000] [--pairs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ingest import replicated_csv  # noqa: E402


def fresh_bucket(running: Any) -> tuple[Any, Any]:
    """Settings and a store on a new bucket of the running server (the environment names it,
    so Dagster's KindexResource reaches the same bucket)."""
    from pipelines.settings import Settings
    from pipelines.storage.s3 import S3Store

    os.environ["KINDEX_BUCKET"] = f"bench-{uuid.uuid4().hex[:12]}"
    settings = Settings.from_env()
    store = S3Store.from_settings(settings)
    store.ensure_bucket()
    return settings, store


def ingest_seconds(path: Path, settings: Any, store: Any) -> float:
    from pipelines.ingest import ingest_file

    started = time.perf_counter()
    ingest_file(store, settings, path)
    return time.perf_counter() - started


def records_step_seconds(path: Path, store: Any) -> float:
    from dagster import DagsterInstance, materialize

    import definitions
    from assets.files import records, snapshot
    from pipelines.intake.sensor_cursor import partition_key_for

    info = store.put_bytes("incoming/" + path.name, path.read_bytes())
    partition = partition_key_for(info)
    resources = {"kindex": definitions.defs.resources["kindex"]}
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("incoming_files", [partition])
        taken = materialize(
            [snapshot], partition_key=partition, instance=instance, resources=resources
        )
        assert taken.success
        result = materialize(
            [snapshot, records],
            selection=[records],
            partition_key=partition,
            instance=instance,
            resources=resources,
        )
        assert result.success
        times = {
            entry.dagster_event.event_type_value: entry.timestamp
            for entry in instance.all_logs(result.run_id)
            if entry.dagster_event is not None
            and entry.step_key == "records"
            and entry.dagster_event.event_type_value in {"STEP_START", "STEP_SUCCESS"}
        }
    return times["STEP_SUCCESS"] - times["STEP_START"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    from pipelines.storage.embedded import start_on_free_ports

    with tempfile.TemporaryDirectory(prefix="kindex-records-step-") as folder:
        work = Path(folder)
        path = replicated_csv(work / "liger.csv", args.rows)
        os.environ["KINDEX_HOME"] = str(work / "home")
        with start_on_free_ports(work / "s3") as running:
            os.environ["KINDEX_S3_ENDPOINT"] = running.endpoint_url
            os.environ["AWS_ACCESS_KEY_ID"] = running.credentials.access_key
            os.environ["AWS_SECRET_ACCESS_KEY"] = running.credentials.secret_key
            ratios = []
            for pair in range(args.pairs):
                os.sync()
                settings, store = fresh_bucket(running)
                ingest = ingest_seconds(path, settings, store)
                _, store = fresh_bucket(running)
                step = records_step_seconds(path, store)
                ratios.append(step / ingest)
                print(
                    f"pair {pair + 1}: ingest {ingest:.2f} s, records step {step:.2f} s, "
                    f"ratio {step / ingest:.2f}",
                    flush=True,
                )
    print(
        f"{args.rows:,} rows: records step / ingest, median of {args.pairs} pairs: "
        f"{statistics.median(ratios):.2f}x (target <= 1.3x)"
    )


if __name__ == "__main__":
    main()
