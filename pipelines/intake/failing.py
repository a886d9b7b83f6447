"""The ledger's failing files: each version whose newest row is failed, or quarantined (not one
of its rows became a run), what the index's `no_failing_files` check reports.

A file quarantined long ago stays failing, in whatever window it arrived, so a read of the
failing rows would read every window. Instead each look carries its answer forward: the failing
set at a ledger point, kept in the bucket (FAILING_FILES under the index prefix). The next look
reads the versions the rows committed since that point are of (pipelines/index/committed.py),
their newest rows from their windows only (`Ledger.seen`), and replaces what the set said of
them: a version no row was committed for since keeps the row it had. So a look costs what the
ledger took since the last one, plus the failing set itself. The ledger is read whole only when
there is no set yet, or its point left the ledger's history (its snapshots expired).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.index.committed import versions_since
from pipelines.intake.ledger import (
    LEDGER_SCHEMA,
    FileEntry,
    FileState,
    Ledger,
    entry_of,
    rows_of,
)
from pipelines.settings import Settings
from pipelines.storage.base import NoSuchKey, ObjectStore

FAILING_STATES = (FileState.FAILED, FileState.QUARANTINED)
FAILING_FILES = "checks/failing-files.parquet"
POINT_METADATA = b"kindex.ledger-point"


@dataclass(frozen=True, slots=True)
class Failing:
    """The failing versions' newest rows at a ledger point, oldest version first."""

    point: int | None
    files: list[FileEntry]


def failing_files(store: ObjectStore, settings: Settings, ledger: Ledger) -> Failing:
    """The failing files now: the set carried from the last look, brought up to the ledger's
    head; the whole ledger's failing rows when nothing is carried."""
    key = settings.index_prefix + FAILING_FILES
    carried = _load(store, key)
    if carried is not None and carried.point is not None:
        since = versions_since(ledger.catalog, carried.point)
        if since.versions is not None:
            if since.point == carried.point:
                return carried
            now = ledger.seen(since.versions)
            kept = [entry for entry in carried.files if entry.version not in now]
            changed = [entry for entry in now.values() if entry.state in FAILING_STATES]
            found = Failing(since.point, _ordered([*kept, *changed]))
            _save(store, key, found)
            return found
    head = ledger.head()  # before the rows: what is committed after is read by the next look
    states = [str(state) for state in FAILING_STATES]
    found = Failing(head, ledger.current("list_contains(?, state)", [states]))
    if head is not None:
        _save(store, key, found)
    return found


def _ordered(entries: Sequence[FileEntry]) -> list[FileEntry]:
    """In the order `Ledger.current` gives them."""
    return sorted(entries, key=lambda e: (e.last_modified, e.key))


def _save(store: ObjectStore, key: str, failing: Failing) -> None:
    table = pa.Table.from_pylist(rows_of(failing.files), schema=LEDGER_SCHEMA)
    table = table.replace_schema_metadata({POINT_METADATA: str(failing.point).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    store.put(key, sink.getvalue().to_pybytes(), content_type="application/vnd.apache.parquet")


def _load(store: ObjectStore, key: str) -> Failing | None:
    try:
        data = store.get_bytes(key)
    except NoSuchKey:
        return None
    try:
        table = pq.read_table(pa.BufferReader(data))
    except pa.ArrowException:  # cut short or not Parquet: read the ledger again
        return None
    point = (table.schema.metadata or {}).get(POINT_METADATA)
    if point is None or set(table.column_names) != set(LEDGER_SCHEMA.names):
        return None  # not one this kindex wrote: read the ledger again
    return Failing(int(point), [entry_of(row) for row in table.to_pylist()])
