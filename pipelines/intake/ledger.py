"""The file ledger: every object version seen under `incoming/`, its state, reason and attempts.

Per-file state lives here, not in Dagster: a Dagster run processes a batch of files and costs a
few events whatever its size, while each file keeps its own row. The ledger is an Iceberg table
(`file_ledger`) in the index's catalog, written only by appends: a sensor tick appends the
versions it found (`pending`), a batch appends what became of each of its files (`indexed`,
`quarantined`, `failed` with a reason and its attempts, or `gone`), and the `files` view (every
reader of the index has it, `kindex connect` too) shows each version's newest row. An append is
one commit per tick or batch, never per file.

A version is (bucket, key, ETag, LastModified): an upload of bytes the key held before (A, B, A)
is a version of its own, since the key holds A again and the index must judge it again.

The table is partitioned by arrival window (identity on `arrival_window`, a version's hour, the
same key Dagster's partitions and backfills use): every row of a version lies in the partition
of its LastModified, so the question a tick asks (have these versions been seen?) reads the
partitions of their hours only (`seen`). A version that stays open (failed and backed off, or
pending) can be older than any recent window: the table property OPEN_SINCE_PROPERTY holds a
window at or before the oldest open version's, and `due` reads from it on. An append of an
open row older than RECENT lowers it in the same commit; `due` raises it, only if no commit
came between its read and its write. A ledger written before it was partitioned is rewritten
into partitions once (`migrate`).

The ledger is derived from what kindex writes anyway: a lost one is rebuilt from the published
index's reads (the `snapshots` table) and a listing of `incoming/` (`rebuild`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import random
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import reduce
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    In,
    Or,
    StartsWith,
)
from pyiceberg.table.update import AssertRefSnapshotId, SetPropertiesUpdate

from pipelines.index.catalog import (
    FIELD_IDS_PROPERTY,
    MANIFEST_MERGE_PROPERTIES,
    SUMMARY_PREFIX,
    TABLE_PROPERTIES,
    Compaction,
    IndexCatalog,
    commit_retry,
    conformed,
)
from pipelines.index.catalog import LEDGER_TABLE as LEDGER_TABLE
from pipelines.index.committed import added_rows, appended_since
from pipelines.index.local import open_index
from pipelines.intake.reconcile import reconcile
from pipelines.records.record_objects import UTC_US
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo, ObjectStore
from pipelines.storage.errors import StorageUnreachable

if TYPE_CHECKING:
    from pyiceberg.table import DataScan, Table


# Arrival windows: the hour of an object version's LastModified (the store's clock). Dagster's
# partitions are these windows (assets/partitions.py), so their number grows with time, not with
# files; an hour is the unit a person backfills, and a fleet's hour is a batch-sized set of files.
WINDOW_FORMAT = "%Y-%m-%d-%H:%M"
WINDOW = timedelta(hours=1)
# The partition column: a version's arrival window (the hour its rows all share).
PARTITION_COLUMN = "arrival_window"
# The window at or before which every open (pending or failed) version lies: `due` reads from it.
OPEN_SINCE_PROPERTY = SUMMARY_PREFIX + "ledger.open-since"
# Versions younger than this are always read by `due` (it never moves OPEN_SINCE_PROPERTY past
# twice this ago), so an append of such a version needs no property; an older open one lowers it
# in its own commit. An hour: a batch runs minutes after its files arrive, and the windows `due`
# reads at rest are the last two or three.
RECENT = timedelta(hours=1)
# The ledger's snapshots are expired once it holds more than this many, by about one append in
# this many (an expiry is a commit of its own).
EXPIRE_ABOVE_SNAPSHOTS = 32
EXPIRE_EVERY_COMMITS = 8
# An expiry keeps the newest this many commits besides what versions and the next publish read:
# a ledger sensor's cursor or a failing-files check's point stays readable across a burst's
# commits between two of its looks (a batch makes several: its appends, their compactions).
KEEP_NEWEST_SNAPSHOTS = 32
# A window's data files (one per append that touched it) are merged past 4, the newest while each
# older is at most 8 times what is merged so far: a window holds at most 5 files however many
# commits it has had (a fleet's hour has 1,100), so what a tick reads of the newest window does
# not grow with them. About one append in three compacts, rewriting mostly the newest files.
LEDGER_COMPACTION = Compaction(above_files=4, size_ratio=8)
# The most open versions a reader keeps between looks (`OpenAt`, in the ledger sensor's cursor):
# a burst's thousands of pending files are read again from the ledger instead.
MAX_OPEN_KEPT = 500
FIRST_BACKOFF = timedelta(seconds=30)
MAX_BACKOFF = timedelta(hours=6)

LEDGER_SCHEMA = pa.schema(
    [
        ("bucket", pa.string()),
        ("key", pa.string()),
        ("etag", pa.string()),
        ("last_modified", UTC_US),
        ("size", pa.int64()),
        ("version_id", pa.string()),
        ("arrival_window", pa.string()),
        ("state", pa.string()),
        ("reason", pa.string()),
        ("attempts", pa.int32()),
        ("batch", pa.string()),
        ("snapshot_digest", pa.string()),
        ("runs", pa.int64()),
        ("quarantined", pa.int64()),
        ("updated_at", UTC_US),
        ("next_attempt_at", UTC_US),
        # The sets file its batch wrote (pipelines/index/bucket_format.py): what a publish
        # reads of the rows committed since its version.
        ("sets_file", pa.string()),
    ]
)
VERSION_COLUMNS = ("bucket", "key", "etag", "last_modified")
# A version's newest row. Rows appended in the same microsecond (never by one writer) fall back
# to the further state: done before failed before pending.
CURRENT_ROWS = f"""
    SELECT * FROM {{table}}
    QUALIFY row_number() OVER (
        PARTITION BY {", ".join(VERSION_COLUMNS)}
        ORDER BY updated_at DESC,
                 CASE state WHEN 'pending' THEN 2 WHEN 'failed' THEN 1 ELSE 0 END,
                 attempts DESC
    ) = 1
"""
# The `files` view every reader of the index has (pipelines/index/tables.py).
FILES_VIEW = CURRENT_ROWS.format(table=LEDGER_TABLE)


class FileState(StrEnum):
    PENDING = "pending"  # found, not processed yet (or being processed)
    INDEXED = "indexed"  # its record set is written: the index holds, or next publishes, it
    QUARANTINED = "quarantined"  # read, but not one row became a run: the quarantine says why
    FAILED = "failed"  # could not be processed; retried with backoff (`next_attempt_at`)
    GONE = "gone"  # overwritten or deleted before it was read: nothing left to process


DONE_STATES = frozenset({FileState.INDEXED, FileState.QUARANTINED, FileState.GONE})


def window_of(moment: datetime) -> str:
    """The arrival window (a Dagster partition key) of a LastModified."""
    start = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return start.strftime(WINDOW_FORMAT)


def window_start(window: str) -> datetime:
    return datetime.strptime(window, WINDOW_FORMAT).replace(tzinfo=UTC)


def _second(moment: datetime) -> datetime:
    """S3 lists LastModified to the second; notifications may carry more."""
    return moment.astimezone(UTC).replace(microsecond=0)


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One row of the ledger: a version and what became of it."""

    bucket: str
    key: str
    etag: str
    last_modified: datetime
    size: int
    version_id: str | None
    state: FileState
    reason: str | None = None
    attempts: int = 0
    batch: str | None = None
    snapshot_digest: str | None = None
    runs: int = 0
    quarantined: int = 0
    updated_at: datetime | None = None
    next_attempt_at: datetime | None = None
    sets_file: str | None = None

    @property
    def version(self) -> tuple[str, str, datetime]:
        return (self.key, self.etag, self.last_modified)

    @property
    def arrival_window(self) -> str:
        return window_of(self.last_modified)

    @property
    def info(self) -> ObjectInfo:
        return ObjectInfo(self.key, self.etag, self.size, self.last_modified, self.version_id)

    @classmethod
    def pending(cls, bucket: str, info: ObjectInfo, batch: str | None = None) -> FileEntry:
        return cls(
            bucket=bucket,
            key=info.key,
            etag=info.etag,
            last_modified=_second(info.last_modified),
            size=info.size,
            version_id=info.version_id,
            state=FileState.PENDING,
            batch=batch,
        )

    def failed(self, reason: str, now: datetime, rng: random.Random | None = None) -> FileEntry:
        """This version failed once more: its next attempt waits exponentially longer, with
        jitter so that many failing files do not come back in step."""
        attempts = self.attempts + 1
        wait = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (attempts - 1))
        wait *= (rng or random.Random()).uniform(0.8, 1.2)
        return replace(
            self,
            state=FileState.FAILED,
            reason=reason,
            attempts=attempts,
            updated_at=now,  # the wait counts from the failure, not from when it was found
            next_attempt_at=now + wait,
        )


ENTRY_FIELDS = tuple(field.name for field in fields(FileEntry))


def version_of(info: ObjectInfo) -> tuple[str, str, datetime]:
    return (info.key, info.etag, _second(info.last_modified))


class Ledger:
    """The ledger of one bucket, in the index's catalog."""

    def __init__(self, catalog: IndexCatalog, bucket: str, endpoint: str | None = None) -> None:
        self.catalog = catalog
        self.bucket = bucket
        self.endpoint = endpoint or "of the bucket"
        # The open versions at a ledger commit: the ledger sensor asks twice per tick.
        self._open: tuple[int, list[FileEntry]] | None = None

    @classmethod
    def of(cls, store: ObjectStore, settings: Settings) -> Ledger:
        endpoint = getattr(store, "endpoint_url", None)
        return cls(IndexCatalog.beside(store, settings), store.bucket, endpoint)

    # -- writing -------------------------------------------------------------------------

    def _table(self, *, refresh: bool = False) -> Table | None:
        try:
            return self.catalog.table(LEDGER_TABLE, refresh=refresh)
        except NoSuchTableError:
            return None

    def _created(self) -> Table:
        table = self._table(refresh=True)
        if table is None:
            self.catalog.catalog.create_namespace_if_not_exists(self.catalog.namespace)
            table = self.catalog.catalog.create_table_if_not_exists(
                (self.catalog.namespace, LEDGER_TABLE),
                schema=LEDGER_SCHEMA,
                properties=TABLE_PROPERTIES,
            )
        else:
            if table.properties.get(FIELD_IDS_PROPERTY) != "1":
                # Compaction by an older kindex merged files without field IDs: rewritten once.
                self.catalog.identify(LEDGER_TABLE)
            if "sets_file" not in table.schema().column_names:  # a ledger of an older kindex
                with self.catalog.table(LEDGER_TABLE, refresh=True).update_schema() as update:
                    update.union_by_name(LEDGER_SCHEMA)
            merging = MANIFEST_MERGE_PROPERTIES.items()
            missing = {k: v for k, v in merging if table.properties.get(k) != v}
            if missing:  # a ledger made by an older kindex: its appends merge from now on
                with self.catalog.table(LEDGER_TABLE, refresh=True).transaction() as transaction:
                    transaction.set_properties(missing)
        table = self.catalog.table(LEDGER_TABLE, refresh=True)
        if table.spec().is_unpartitioned():
            self.migrate()
            table = self.catalog.table(LEDGER_TABLE, refresh=True)
        return table

    @commit_retry
    def migrate(self) -> bool:
        """Once: partition an unpartitioned ledger (a new one, or one an older kindex wrote) by
        arrival window, its rows rewritten into their partitions and the oldest open version's
        window recorded, in one commit (a writer that came between makes it start again).
        Returns whether it did."""
        table = self.catalog.table(LEDGER_TABLE, refresh=True)
        if not table.spec().is_unpartitioned():
            return False
        rows = table.scan().to_arrow() if table.current_snapshot() is not None else None
        with table.transaction() as transaction:
            with transaction.update_spec() as spec:
                spec.add_identity(PARTITION_COLUMN)
            if rows is not None and rows.num_rows:
                transaction.overwrite(rows)  # in the table's schema, whatever columns it has
            open_windows = [e.arrival_window for e in _open_entries(rows)] if rows else []
            since = min(open_windows, default=window_of(datetime.now(UTC) - 2 * RECENT))
            transaction.set_properties({OPEN_SINCE_PROPERTY: since})
        return True

    def append(self, entries: Sequence[FileEntry]) -> None:
        """Append rows in one commit (stamped now), then compact the table if it is due."""
        self._write(entries, unseen_only=False)

    def append_unseen(self, entries: Sequence[FileEntry]) -> list[FileEntry]:
        """Append the rows of these versions found new, but of those the ledger holds a row of
        by now (another sensor's tick found them too, and wrote first). Checked at the head the
        commit is made on; a commit that lands in between makes pyiceberg commit this one again
        on the new head, unchecked: both batches then name the version, which belongs to the
        newer row's (`of_batch`). Returns the rows appended."""
        return self._write(entries, unseen_only=True)

    def _write(self, entries: Sequence[FileEntry], *, unseen_only: bool) -> list[FileEntry]:
        if not entries:
            return []
        try:
            return self._append(entries, unseen_only)
        except OSError as error:  # the Iceberg writer's S3 client (pyarrow) gave up
            raise StorageUnreachable(
                f"cannot reach the S3 endpoint {self.endpoint} (write the file ledger): {error}"
            ) from error

    # Writers are sensors and batch runs in other processes: a commit that lost the race
    # starts again from the table's new head.
    @commit_retry
    def _append(self, entries: Sequence[FileEntry], unseen_only: bool) -> list[FileEntry]:
        now = datetime.now(UTC)
        table = self._created()  # at the head, just read
        if unseen_only:
            known = self._seen_in(table, {entry.version for entry in entries})
            entries = [entry for entry in entries if entry.version not in known]
            if not entries:
                return []
        rows = rows_of(entries, now)
        windows = {str(row["arrival_window"]) for row in rows}
        open_windows = [e.arrival_window for e in entries if e.state not in DONE_STATES]
        since = table.properties.get(OPEN_SINCE_PROPERTY)
        lowered = min(open_windows, default=None)
        with table.transaction() as transaction:
            transaction.append(pa.Table.from_pylist(rows, schema=LEDGER_SCHEMA))
            # An open version older than RECENT: `due` may read from later on, so its window is
            # written whatever `since` says now (a `due` may raise it before this commit).
            if lowered is not None and lowered < window_of(now - RECENT):
                transaction.set_properties({OPEN_SINCE_PROPERTY: min(lowered, since or lowered)})
        # Each append adds a file to the partitions it touched: their number stays logarithmic.
        self.compact(windows)
        # About one append in EXPIRE_EVERY_COMMITS, whichever process makes it.
        if (
            len(table.metadata.snapshots) > EXPIRE_ABOVE_SNAPSHOTS
            and random.randrange(EXPIRE_EVERY_COMMITS) == 0
        ):
            self.expire()
        return list(entries)

    def compact(self, windows: Iterable[str] | None = None) -> bool:
        """Merge the ledger's small data files (one per append and partition) as the index's
        tables are, within each partition (of these windows only, when given)."""
        if self._table() is None:
            return False
        try:
            chosen = None if windows is None else set(windows)
            return self.catalog.compact(LEDGER_TABLE, chosen, LEDGER_COMPACTION)
        except Exception:  # maintenance: an append that won the race, an S3 fault; next time
            return False

    def expire(self) -> bool:
        """Forget the ledger's snapshots as the index's tables' are (`IndexCatalog.expire`):
        what the retained index versions were published over stays, for `--as-of`."""
        if self._table() is None:
            return False
        try:
            self.catalog.expire_table(LEDGER_TABLE, keep_newest=KEEP_NEWEST_SNAPSHOTS)
        except Exception:  # maintenance: a commit that won the race; next time
            return False
        return True

    # -- reading -------------------------------------------------------------------------

    def head(self) -> int | None:
        """The id of the ledger's newest commit: a reader that saw it has seen everything."""
        table = self._table(refresh=True)
        snapshot = table.current_snapshot() if table is not None else None
        return snapshot.snapshot_id if snapshot is not None else None

    def exists(self) -> bool:
        """Whether the ledger was made (a home older than the ledger has none)."""
        return self._table(refresh=True) is not None

    def create(self) -> None:
        self._created()

    def current(
        self,
        where: str = "",
        parameters: Sequence[object] = (),
        row_filter: BooleanExpression | None = None,
    ) -> list[FileEntry]:
        """Each version's newest row (the `files` view), filtered by a SQL condition on it.
        `row_filter`: only the rows (and the partitions and files) it may hold are read: a
        condition on a version's columns, which all its rows share."""
        table = self._table(refresh=True)
        if table is None or table.current_snapshot() is None:
            return []
        return self._current_of(self._scan(table, row_filter).to_arrow(), where, parameters)

    @staticmethod
    def _scan(table: Table, row_filter: BooleanExpression | None) -> DataScan:
        return table.scan(row_filter=row_filter if row_filter is not None else AlwaysTrue())

    def planned_files(self, row_filter: BooleanExpression | None = None) -> int:
        """How many data files a read with this filter scans (partitions and file statistics
        pruned): what `seen` and `due` cost."""
        table = self._table(refresh=True)
        if table is None or table.current_snapshot() is None:
            return 0
        return len(list(self._scan(table, row_filter).plan_files()))

    @staticmethod
    def _current_of(
        rows: pa.Table, where: str = "", parameters: Sequence[object] = ()
    ) -> list[FileEntry]:
        con = duckdb.connect()
        try:
            con.register(LEDGER_TABLE, rows)
            sql = f"SELECT * FROM ({CURRENT_ROWS.format(table=LEDGER_TABLE)})"
            if where:
                sql += f" WHERE {where}"
            found = con.execute(
                sql + " ORDER BY last_modified, key", list(parameters)
            ).to_arrow_table()
        finally:
            con.close()
        return [entry_of(row) for row in found.to_pylist()]

    def of_batch(self, batch: str, window: str | None = None) -> list[FileEntry]:
        """The versions a batch names; `window`: the arrival window its run is of (a batch holds
        one window's files), whose partition alone is read."""
        where = None if window is None else _in(PARTITION_COLUMN, [window])
        return self.current("batch = ?", [batch], where)

    def known_versions(
        self, keys: Iterable[str] | None = None
    ) -> dict[tuple[str, str, datetime], FileEntry]:
        """The newest row of each version (of these keys only, when given), in any partition:
        what a backfill or a full reconcile asks. A tick asks `seen`."""
        chosen = sorted(set(keys)) if keys is not None else None
        if chosen is not None and not chosen:
            return {}
        entries = (
            self.current("list_contains(?, key)", [chosen], _in("key", chosen))
            if chosen is not None
            else self.current()
        )
        return {entry.version: entry for entry in entries}

    def seen(self, versions: Iterable[ObjectInfo]) -> dict[tuple[str, str, datetime], FileEntry]:
        """The newest row of each of these versions the ledger holds: the question of a tick
        that found them. Read from the partitions of their arrival windows only (a version's
        rows all lie in its own), so it costs what the tick found, not the ledger's history; an
        old key's new upload is a new version in the new upload's window."""
        wanted = {version_of(v) for v in versions if not v.key.endswith("/")}
        table = self._table(refresh=True) if wanted else None
        if table is None:
            return {}
        return self._seen_in(table, wanted)

    def _seen_in(
        self, table: Table, wanted: set[tuple[str, str, datetime]]
    ) -> dict[tuple[str, str, datetime], FileEntry]:
        """`seen` at this table's head."""
        if not wanted or table.current_snapshot() is None:
            return {}
        found = self._current_of(
            self._scan(table, seen_filter(wanted)).to_arrow(),
            "list_contains(?, key)",
            [sorted({key for key, _, _ in wanted})],
        )
        return {e.version: e for e in found if e.version in wanted}

    def open_since(self) -> str | None:
        """The window `due` reads from (None: the whole ledger)."""
        table = self._table(refresh=True)
        return table.properties.get(OPEN_SINCE_PROPERTY) if table is not None else None

    def open_versions(self, *, refresh: bool = True) -> list[FileEntry]:
        """The versions whose newest row is pending or failed, read from OPEN_SINCE_PROPERTY's
        window on; the property is raised to the oldest of them (or to 2 x RECENT ago) when no
        commit came since the read. `refresh=False`: at the head this process last loaded (by
        `head()` just before: one read of the table's metadata, not one per question)."""
        table = self._table(refresh=refresh)
        if table is None or table.current_snapshot() is None:
            return []
        since = table.properties.get(OPEN_SINCE_PROPERTY)
        head = table.current_snapshot()
        if head is not None and self._open is not None and self._open[0] == head.snapshot_id:
            return list(self._open[1])
        rows = self._scan(table, open_filter(since)).to_arrow()
        found = _open_entries(rows)
        floor = window_of(datetime.now(UTC) - 2 * RECENT)
        raised = min([e.arrival_window for e in found] + [floor])
        if since is not None and raised > since and head is not None:
            requirement = AssertRefSnapshotId.model_validate(
                {"ref": "main", "snapshot-id": head.snapshot_id}
            )
            update = SetPropertiesUpdate(updates={OPEN_SINCE_PROPERTY: raised})
            # An append that came between fails this: a later look raises it.
            with contextlib.suppress(CommitFailedException):
                self.catalog.catalog.commit_table(table, (requirement,), (update,))
        if head is not None:
            self._open = (head.snapshot_id, found)
        return found

    def open_at_head(self, known: OpenAt | None = None) -> OpenAt | None:
        """The open versions at the head this process last loaded (by `head()` just before):
        from `known`, the open versions at an earlier commit, and the rows appended since then
        (`committed.added_rows`: the files the appends since added, wherever a compaction put
        their rows later), so a tick reads what came since, whatever a window holds; else, or
        when that commit is no longer in the ledger's history (its snapshots expired), read as
        `open_versions` reads. None: no ledger yet."""
        table = self._table()
        head = table.current_snapshot() if table is not None else None
        if table is None or head is None:
            return None
        appended = appended_since(table, head, known.point) if known is not None else None
        if known is None or appended is None:
            return OpenAt(head.snapshot_id, tuple(self.open_versions(refresh=False)))
        if not appended:  # only compactions since: the same rows
            return replace(known, point=head.snapshot_id)
        rows = [pa.Table.from_pylist(rows_of(known.entries), schema=LEDGER_SCHEMA)]
        for added in added_rows(table, appended, LEDGER_SCHEMA.names):
            batches = [conformed(batch, LEDGER_SCHEMA) for batch in added.to_batches()]
            rows.append(pa.Table.from_batches(batches, schema=LEDGER_SCHEMA))
        found = _open_entries(pa.concat_tables(rows))
        self._open = (head.snapshot_id, found)
        return OpenAt(head.snapshot_id, tuple(found))

    def due(
        self, now: datetime, stale_before: datetime, *, refresh: bool = True
    ) -> list[FileEntry]:
        """Versions to process (again), `due_among` the open versions read from the oldest open
        version's window on (`open_versions`), however long ago that was."""
        return due_among(self.open_versions(refresh=refresh), now, stale_before)

    def waiting(self, *, refresh: bool = True) -> bool:
        """Whether any version is pending or failed (read as `due` reads)."""
        return bool(self.open_versions(refresh=refresh))

    def select(
        self,
        *,
        patterns: Sequence[str] = (),
        quarantined: bool = False,
        windows: Collection[str] | None = None,
    ) -> list[FileEntry]:
        """The versions a backfill re-processes: of the keys matching any glob (or named
        exactly), each key's newest version; with `quarantined`, only versions with quarantine
        rows; with `windows`, the versions that arrived in those windows (a backfill's
        partitions).

        What is read is pruned by what the choice names (`select_filter`): the partitions of
        the windows asked for, and the data files whose keys may match a glob's literal prefix.
        A choice that names no window (a glob, `--quarantined`) reads every partition: a key's
        newest version, and a version's newest row (is it quarantined now?), may lie in any
        window, and only the rows tell which."""
        conditions, parameters = ["state <> 'gone'"], []
        if windows is not None:
            conditions.append("list_contains(?, arrival_window)")
            parameters.append(sorted(set(windows)))
        if quarantined:
            conditions.append("(quarantined > 0 OR state = 'quarantined')")
        entries = self.current(
            " AND ".join(conditions), parameters, select_filter(patterns, windows)
        )
        if patterns:
            entries = [e for e in entries if any(fnmatch.fnmatchcase(e.key, p) for p in patterns)]
            newest: dict[str, FileEntry] = {}
            for entry in entries:  # ordered by LastModified
                newest[entry.key] = entry
            entries = list(newest.values())
        return entries


def due_among(
    entries: Iterable[FileEntry], now: datetime, stale_before: datetime
) -> list[FileEntry]:
    """Of these open versions, the ones to process (again): failed ones whose backoff has
    passed, pending ones whose batch never reported (a run lost before it started, or killed),
    and pending ones marked due again (rows that awaited another file, which landed)."""
    return [
        e
        for e in entries
        if (
            e.state in (FileState.FAILED, FileState.PENDING)
            and e.next_attempt_at is not None
            and e.next_attempt_at <= now
        )
        or (
            e.state is FileState.PENDING
            and e.updated_at is not None
            and e.updated_at < stale_before
        )
    ]


@dataclass(frozen=True, slots=True)
class OpenAt:
    """The open (pending or failed) versions at a ledger commit (`point`, a snapshot id): what
    a reader keeps between looks to read only the rows appended since (`Ledger.open_at_head`).
    Kept in a sensor's cursor up to MAX_OPEN_KEPT versions; past that, not kept (the next look
    reads as `open_versions` does)."""

    point: int
    entries: tuple[FileEntry, ...]

    def to_json(self) -> dict[str, object] | None:
        if len(self.entries) > MAX_OPEN_KEPT:
            return None
        return {
            "point": self.point,
            "entries": [
                {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
                for row in rows_of(self.entries)
            ],
        }

    @classmethod
    def from_json(cls, data: object) -> OpenAt | None:
        if not isinstance(data, dict) or not isinstance(data.get("point"), int):
            return None
        rows = data.get("entries")
        if not isinstance(rows, list):
            return None
        times = {f.name for f in LEDGER_SCHEMA if pa.types.is_timestamp(f.type)}
        entries = [
            entry_of(
                {
                    k: datetime.fromisoformat(v) if k in times and isinstance(v, str) else v
                    for k, v in row.items()
                }
            )
            for row in rows
        ]
        return cls(data["point"], tuple(entries))


def rows_of(entries: Iterable[FileEntry], now: datetime | None = None) -> list[dict[str, object]]:
    """The ledger rows of these entries (in LEDGER_SCHEMA's columns), stamped `now` where they
    have no time yet."""
    return [
        {
            # Its fields are scalars: a shallow dict (asdict deep-copies each one).
            **{name: getattr(entry, name) for name in ENTRY_FIELDS},
            "state": str(entry.state),
            "arrival_window": entry.arrival_window,
            "updated_at": entry.updated_at or now,
        }
        for entry in entries
    ]


def glob_prefix(pattern: str) -> str:
    """What every key a glob matches starts with: the text before its first wildcard."""
    cut = min((i for i, c in enumerate(pattern) if c in "*?["), default=len(pattern))
    return pattern[:cut]


def select_filter(
    patterns: Sequence[str] = (), windows: Collection[str] | None = None
) -> BooleanExpression:
    """The scan a backfill's selection reads: the partitions of the windows it names (all when
    it names none), and the files whose key statistics admit a glob's literal prefix (when
    every glob has one)."""
    condition: BooleanExpression = AlwaysTrue()
    if windows is not None:
        condition = _in(PARTITION_COLUMN, sorted(set(windows)))
    prefixes = sorted({glob_prefix(p) for p in patterns})
    if prefixes and all(prefixes):
        starts = [_starts(p) for p in prefixes]
        condition = And(condition, reduce(Or, starts))
    return condition


def seen_filter(versions: Iterable[tuple[str, str, datetime]]) -> BooleanExpression:
    """The partitions (arrival windows) and keys of these versions, for a scan."""
    chosen = list(versions)
    windows = sorted({window_of(at) for _, _, at in chosen})
    return And(_in(PARTITION_COLUMN, windows), _in("key", sorted({k for k, _, _ in chosen})))


def open_filter(since: str | None) -> BooleanExpression:
    """The partitions `due` reads: from the window `since` on (None: all)."""
    if since is None:
        return AlwaysTrue()
    return GreaterThanOrEqual(PARTITION_COLUMN, since)  # type: ignore[call-arg,arg-type]


def _in(column: str, values: Sequence[str]) -> BooleanExpression:
    # pyiceberg's predicates are pydantic models whose fields mypy takes for the constructor's.
    return In(column, values)  # type: ignore[call-arg,arg-type]


def _starts(prefix: str) -> BooleanExpression:
    return StartsWith("key", prefix)  # type: ignore[call-arg,arg-type]


def _open_entries(rows: pa.Table) -> list[FileEntry]:
    """The versions of these rows whose newest row is pending or failed."""
    return Ledger._current_of(rows, "state IN ('pending', 'failed')")


def entry_of(row: dict[str, object]) -> FileEntry:
    fields = {name: row[name] for name in FileEntry.__dataclass_fields__}
    fields["state"] = FileState(str(row["state"]))
    return FileEntry(**fields)  # type: ignore[arg-type]


def new_versions(
    listing: Iterable[ObjectInfo], known: dict[tuple[str, str, datetime], FileEntry]
) -> Iterator[ObjectInfo]:
    """The listed versions the ledger has no row of."""
    for info in listing:
        if not info.key.endswith("/") and version_of(info) not in known:
            yield info


def rebuild(
    store: ObjectStore,
    settings: Settings,
    listing: Sequence[ObjectInfo],
    parser_versions: Iterable[str],
) -> list[FileEntry]:
    """The ledger of a home that has none (kindex before the ledger, or a ledger lost): each
    listed version the bucket shows processed (its read and a record set of one of the current
    `parser_versions`) is indexed or quarantined, with its counts from the published index; the
    rest are pending."""

    found = reconcile(store, settings, parser_versions, listing=listing)
    unprocessed = {version_of(m.info) for m in found.missing}
    counts = published_counts(settings)
    entries = []
    for info in listing:
        if info.key.endswith("/"):
            continue
        entry = FileEntry.pending(store.bucket, info, batch="rebuild")
        held = counts.get((info.key, info.etag))
        if version_of(info) not in unprocessed and held is not None:
            digest, runs, quarantined = held
            state = FileState.QUARANTINED if runs == 0 and quarantined else FileState.INDEXED
            entry = replace(
                entry,
                state=state,
                snapshot_digest=digest,
                runs=runs,
                quarantined=quarantined,
                attempts=1,
            )
        entries.append(entry)
    return entries


def published_counts(settings: Settings) -> dict[tuple[str, str], tuple[str, int, int]]:
    """(key, ETag) -> (snapshot digest, runs, quarantine rows) of each read the index holds."""

    try:
        con = open_index(settings)
    except Exception:  # no index yet: nothing was published
        return {}
    try:
        rows = con.execute(
            """SELECT source_key, etag, arg_max(snapshot_digest, taken_at),
                      arg_max(runs, taken_at), arg_max(quarantined, taken_at)
               FROM snapshots GROUP BY source_key, etag"""
        ).fetchall()
    finally:
        con.close()
    return {(key, etag): (digest, int(runs), int(q)) for key, etag, digest, runs, q in rows}


def unprocessed_versions(
    store: ObjectStore, settings: Settings, ledger: Ledger
) -> tuple[list[ObjectInfo], list[ObjectInfo]]:
    """The versions listed under `incoming/`, and those of them the ledger does not hold done
    (indexed, quarantined or gone): 0 at rest. A listing of the bucket and a read of the whole
    ledger: what a user asks for (`kindex reconcile --full`), never a step of each publish."""
    listing = [o for o in store.list(settings.incoming_prefix) if not o.key.endswith("/")]
    return listing, undone(listing, ledger.known_versions())


def undone(
    listing: Iterable[ObjectInfo], known: dict[tuple[str, str, datetime], FileEntry]
) -> list[ObjectInfo]:
    """The listed versions the ledger has no row of, or whose newest row is not done."""
    return [
        o
        for o in listing
        if not o.key.endswith("/")
        and ((entry := known.get(version_of(o))) is None or entry.state not in DONE_STATES)
    ]
