"""What was committed since a version: the sets files named by the ledger rows appended after
the ledger point the version covers (`committed_since`), or the object versions those rows are
of (`versions_since`: what a look that carries its answer forward reads again).

The ledger (pipelines/intake/ledger.py) is an Iceberg table written only by appends, one commit
per tick or batch, and its compactions. Its snapshots form one line of commits in the order the
catalog took them, so "the rows committed after snapshot P" is exact whatever the writers' clocks
or how many append at once: they are the data files that the append snapshots after P added.
Compaction rewrites rows into new files but adds none, so its snapshots are passed over (the
files it replaced stay in the bucket). A version records the head it read before reading rows;
a publish that dies before its version commits records nothing, and the next one reads the same
rows again. A point the ledger no longer has (its snapshots expired) costs one read of every row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot

from pipelines.index.catalog import LEDGER_TABLE, IndexCatalog, Version, snapshots_since
from pipelines.storage.base import ObjectInfo

SETS_FILE_COLUMN = "sets_file"


@dataclass(frozen=True, slots=True)
class Committed:
    """The ledger's head as read (`point`: what a version that takes these rows covers), and
    the sets files the rows committed since the earlier point name, oldest batch first."""

    point: int | None
    sets_files: list[str]
    whole: bool = False  # the earlier point was not in the ledger's history: every row was read


def ledger_head(catalog: IndexCatalog) -> int | None:
    table = _ledger(catalog)
    head = table.current_snapshot() if table is not None else None
    return head.snapshot_id if head is not None else None


def committed_since(catalog: IndexCatalog, since: int | None) -> Committed:
    """The sets files named by the ledger rows committed after snapshot `since` (None: every
    row)."""
    table = _ledger(catalog)
    head = table.current_snapshot() if table is not None else None
    if table is None or head is None:
        return Committed(None, [])
    if head.snapshot_id == since:
        return Committed(since, [])
    appended = appended_since(table, head, since)
    if appended is None:
        rows = table.scan(selected_fields=(SETS_FILE_COLUMN,)).to_arrow()
        named = {key for key in rows.column(SETS_FILE_COLUMN).to_pylist() if key}
        return Committed(head.snapshot_id, sorted(named), whole=True)
    keys: set[str] = set()
    for rows in added_rows(table, appended, (SETS_FILE_COLUMN,)):
        if SETS_FILE_COLUMN in rows.column_names:  # a file written before the column was: none
            keys.update(key for key in rows.column(SETS_FILE_COLUMN).to_pylist() if key)
    return Committed(head.snapshot_id, sorted(keys))


def committed_after(catalog: IndexCatalog, version: Version) -> Committed | None:
    """The sets files of the ledger rows a version lacks: those committed after its ledger
    point; every row's when nothing was published yet (no version holds any of them). None for
    a version published before versions named a point, or an index of another layout: what it
    lacks only a listing of the record sets tells, which its next publish reads once."""
    if version.ledger_point is not None:
        return committed_since(catalog, version.ledger_point)
    if version.version is None and not catalog.outdated():
        return committed_since(catalog, None)
    return None


@dataclass(frozen=True, slots=True)
class CommittedVersions:
    """The ledger's head as read, and the versions (as ObjectInfo) that the rows committed
    since an earlier point are of; None when that point is not in the ledger's history."""

    point: int | None
    versions: list[ObjectInfo] | None


def versions_since(catalog: IndexCatalog, since: int) -> CommittedVersions:
    """The versions the ledger rows committed after snapshot `since` are of: those whose newest
    row may have changed since (the ledger is only appended to)."""
    table = _ledger(catalog)
    head = table.current_snapshot() if table is not None else None
    if table is None or head is None:
        return CommittedVersions(None, None)
    appended = appended_since(table, head, since)
    if appended is None:
        return CommittedVersions(head.snapshot_id, None)
    found: dict[tuple[str, str, object], ObjectInfo] = {}
    for rows in added_rows(table, appended, VERSION_FIELDS):
        for row in rows.to_pylist():
            info = ObjectInfo(
                row["key"], row["etag"], row["size"], row["last_modified"], row["version_id"]
            )
            found[(info.key, info.etag, info.last_modified)] = info
    return CommittedVersions(head.snapshot_id, list(found.values()))


# The columns of a ledger row that name its object version.
VERSION_FIELDS = ("key", "etag", "size", "last_modified", "version_id")


def _ledger(catalog: IndexCatalog) -> Table | None:
    try:
        return catalog.table(LEDGER_TABLE, refresh=True)
    except NoSuchTableError:
        return None


def appended_since(table: Table, head: Snapshot, since: int | None) -> list[Snapshot] | None:
    """The append snapshots after `since` up to `head` that added data files, or None when
    `since` is not one of head's ancestors (no point, or expired)."""
    snapshots = snapshots_since(table, head, since)
    if snapshots is None:
        return None
    # A merge of manifests is an append that adds no file.
    return [
        s
        for s in snapshots
        if s.summary is not None
        and s.summary.operation == Operation.APPEND
        and int(s.summary.get("added-data-files") or 0) > 0
    ]


def added_files(table: Table, snapshot: Snapshot) -> list[str]:
    """The data files this snapshot added."""
    return [
        entry.data_file.file_path
        for manifest in snapshot.manifests(table.io)
        if manifest.added_snapshot_id == snapshot.snapshot_id
        for entry in manifest.fetch_manifest_entry(table.io)
        if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id
    ]


def added_rows(
    table: Table, snapshots: list[Snapshot], columns: Sequence[str]
) -> Iterator[pa.Table]:
    """The rows of the data files these snapshots added, in commit order: the columns asked
    for that each file has."""
    for snapshot in snapshots:
        for path in added_files(table, snapshot):
            with table.io.new_input(path).open() as stream:
                parquet = pq.ParquetFile(stream)
                present = [c for c in columns if c in parquet.schema_arrow.names]
                yield parquet.read(columns=present)
