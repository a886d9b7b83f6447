"""The ingest steps, plain Python: a snapshot into record objects, record objects into the index,
and files on disk all the way through (`kindex ingest`). Dagster assets call the same functions.
"""

from __future__ import annotations

import io
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
from tqdm import tqdm

from pipelines.incoming import upload_incoming
from pipelines.index.faults import RECORD_FILES_WRITTEN, pause_point
from pipelines.index.known import known_manifests
from pipelines.index.layout import IndexLayout
from pipelines.index.publish import IndexVersion, publish_index
from pipelines.index.reads import ObjectRead
from pipelines.index.record_objects import (
    READS_DIR,
    RECORD_FILES,
    SUMMARY_FILE,
    RecordSetBuilder,
    parquet_bytes,
    preview,
)
from pipelines.liger.relay import record_tables_file, worth_relay
from pipelines.liger.tables import record_tables as record_tables_of_csv
from pipelines.sources import normalize_object
from pipelines.storage.base import ObjectStore

RUN_PREVIEW_COLUMNS = [
    "source_line",
    "kernel",
    "provider",
    "mode",
    "metric",
    "gpu",
    "case_key",
    "median",
    "run_digest",
]
QUARANTINE_PREVIEW_COLUMNS = ["source_line", "reason", "detail"]


@dataclass(slots=True)
class SnapshotRecords:
    """What processing one snapshot produced (or found already written)."""

    snapshot_digest: str
    source_key: str
    parser_version: str
    source: str
    prefix: str  # the record set's prefix in the bucket
    rows: int
    runs: int
    runs_by_metric: dict[str, int]
    quarantined_by_reason: dict[str, int]
    manifests_by_kind: dict[str, int]
    reused: bool  # True when the record set existed: nothing was normalized or written
    run_preview: list[dict[str, Any]] = field(default_factory=list)
    quarantine_preview: list[dict[str, Any]] = field(default_factory=list)

    @property
    def quarantined(self) -> int:
        return sum(self.quarantined_by_reason.values())


@dataclass(slots=True)
class IngestSummary:
    files: list[SnapshotRecords]
    index: IndexVersion

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def runs_by_metric(self) -> dict[str, int]:
        return dict(sum((Counter(f.runs_by_metric) for f in self.files), Counter()))

    @property
    def quarantined_by_reason(self) -> dict[str, int]:
        return dict(sum((Counter(f.quarantined_by_reason) for f in self.files), Counter()))


def snapshot_data(store: ObjectStore, settings: Any, snapshot: Any) -> bytes:
    from pipelines.snapshots import read_snapshot

    return read_snapshot(store, settings, snapshot)


def object_read(snapshot: Any, bucket: str, parser_version: str, source: str) -> ObjectRead:
    return ObjectRead(
        snapshot_digest=snapshot.digest,
        bucket=bucket,
        source_key=snapshot.key,
        etag=snapshot.etag,
        version_id=getattr(snapshot, "version_id", None),
        size=snapshot.size,
        last_modified=snapshot.last_modified,
        taken_at=getattr(snapshot, "taken_at", None) or datetime.now(UTC),
        parser_version=parser_version,
        source=source,
        processed_at=datetime.now(UTC),
    )


def process_snapshot(store: ObjectStore, settings: Any, snapshot: Any) -> SnapshotRecords:
    """Normalize a snapshot's bytes and write its record objects (once per parser version).

    The summary object is written last: a record set without it is incomplete and is redone.
    The read (key, ETag) is registered every time, so the same bytes under a new key count."""
    layout = IndexLayout.of(settings)
    data = snapshot_data(store, settings, snapshot)
    result = normalize_object(snapshot.key, data, known_digest=known_manifests(store, settings))
    prefix = layout.record_set_prefix(result.parser_version, snapshot.digest)
    read = object_read(snapshot, layout.bucket, result.parser_version, result.source)
    existing = store.head(prefix + SUMMARY_FILE)
    if existing is not None:
        summary = orjson.loads(store.get_bytes(prefix + SUMMARY_FILE))
        records = records_from_summary(summary, snapshot.key, prefix, reused=True)
    else:
        rows, tables = record_tables(result, data, snapshot.digest)
        records = write_record_set(
            store, prefix, snapshot, result.parser_version, result.source, rows, tables
        )
    store.put_bytes(
        f"{prefix}{READS_DIR}/{read.read_id}.json", read.to_json(), content_type="application/json"
    )
    return records


def record_tables(
    result: Any, data: bytes, snapshot_digest: str
) -> tuple[int, dict[str, pa.Table]]:
    """(rows read, record tables) of one normalized object; a large Liger CSV on every core."""
    if result.source == "liger-csv":
        if worth_relay(len(data)):
            return _record_tables_on_every_core(data, snapshot_digest, result.parser_version)
        return record_tables_of_csv(io.BytesIO(data), snapshot_digest, result.parser_version)
    builder = RecordSetBuilder(snapshot_digest, result.parser_version)
    for outcome in result.outcomes:
        builder.add(outcome)
    return builder.rows, builder.tables()


def _record_tables_on_every_core(
    data: bytes, snapshot_digest: str, parser_version: str
) -> tuple[int, dict[str, pa.Table]]:
    """The relay's workers read their segments from a file, not from this process's memory."""
    with tempfile.TemporaryDirectory(prefix="kindex-ingest-") as workdir:
        path = Path(workdir) / "snapshot.csv"
        path.write_bytes(data)
        return record_tables_file(path, snapshot_digest, parser_version)


def value_counts(table: pa.Table, column: str) -> dict[str, int]:
    """Counts of a column's values (None counted as "unknown"), by value."""
    counts = Counter("unknown" if v is None else v for v in table.column(column).to_pylist())
    return dict(sorted(counts.items()))


def write_record_set(
    store: ObjectStore,
    prefix: str,
    snapshot: Any,
    parser_version: str,
    source: str,
    rows: int,
    tables: dict[str, pa.Table],
) -> SnapshotRecords:
    for name in RECORD_FILES:
        store.put_bytes(
            f"{prefix}{name}.parquet",
            parquet_bytes(tables[name]),
            content_type="application/vnd.apache.parquet",
        )
    pause_point(RECORD_FILES_WRITTEN)
    summary = {
        "snapshot_digest": snapshot.digest,
        "parser_version": parser_version,
        "source": source,
        "rows": rows,
        "runs": tables["runs"].num_rows,
        "lineage": tables["lineage"].num_rows,
        "runs_by_metric": value_counts(tables["runs"], "metric"),
        "quarantined": tables["quarantine"].num_rows,
        "quarantined_by_reason": value_counts(tables["quarantine"], "reason"),
        "manifests_by_kind": value_counts(tables["manifests"], "kind"),
        "run_preview": preview(tables["runs"], RUN_PREVIEW_COLUMNS),
        "quarantine_preview": preview(tables["quarantine"], QUARANTINE_PREVIEW_COLUMNS),
        "written_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    store.put_bytes(prefix + SUMMARY_FILE, orjson.dumps(summary), content_type="application/json")
    return records_from_summary(summary, snapshot.key, prefix, reused=False)


def records_from_summary(
    summary: dict[str, Any], source_key: str, prefix: str, *, reused: bool
) -> SnapshotRecords:
    return SnapshotRecords(
        snapshot_digest=summary["snapshot_digest"],
        source_key=source_key,
        parser_version=summary["parser_version"],
        source=summary["source"],
        prefix=prefix,
        rows=summary["rows"],
        runs=summary["runs"],
        runs_by_metric=summary["runs_by_metric"],
        quarantined_by_reason=summary["quarantined_by_reason"],
        manifests_by_kind=summary["manifests_by_kind"],
        reused=reused,
        run_preview=summary.get("run_preview", []),
        quarantine_preview=summary.get("quarantine_preview", []),
    )


def ingest_paths(
    paths: Sequence[Path | str],
    settings: Any,
    progress: bool = True,
    store: ObjectStore | None = None,
) -> IngestSummary:
    """Upload each file to incoming/<name>, snapshot it, write its records, then publish."""
    from pipelines.snapshots import take_snapshot

    if store is None:  # the configured endpoint, or the embedded server (started if need be)
        from pipelines.storage.s3 import store_session

        with store_session(settings) as session_store:
            return ingest_paths(paths, settings, progress, session_store)
    files: list[SnapshotRecords] = []
    # tqdm's monitor thread (it only nudges stalled bars) would make this process fork its
    # workers from a forkserver (pipelines/forked.py), which costs about half a second per file.
    tqdm.monitor_interval = 0
    bar = tqdm(total=len(paths) + 1, unit="step", disable=not (progress and sys.stderr.isatty()))
    with bar:
        for path in map(Path, paths):
            bar.set_description(path.name)
            info = upload_incoming(store, settings, path)
            snapshot = take_snapshot(store, settings, info.key, etag=info.etag)
            files.append(process_snapshot(store, settings, snapshot))
            bar.update()
        bar.set_description("publishing index")
        index = publish_index(store, settings)
        bar.update()
    return IngestSummary(files, index)
