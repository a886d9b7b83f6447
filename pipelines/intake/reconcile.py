"""Nothing dropped falls through unseen: the invariant, judged from the bucket alone.

Every object version under the incoming prefix has a snapshot and, for the current parser, a
record set (its quarantine rows included) that registered the read of that version. A version's
read is its key's newest recorded read with its ETag (pipelines/intake/snapshots.py: a read
record, `snapshots/reads/<key>/<hex>.json`, or a read a batch's sets file registered); a record
set's reads are in the sets file of the batch that wrote it (`records/batches/<batch>/sets.json`;
`records/<parser version>/<hex>/reads/<read id>.json` in homes written before) and its snapshot
is `snapshots/sha256/<hex>`. So a check costs a few listings, and a GET of each read record and
sets file that is new since the last check.

Also here: what the reconcile sensor compares with the file ledger each tick (`changed_versions`),
which costs what changed, not what the bucket holds: the newest S3 Inventory report on AWS (a
daily manifest of every object, read once when a new one lands, and only its objects modified
since the report before); the embedded server's filer log since the last tick; elsewhere a
window of keys per tick (`StartAfter`). A full listing runs only when asked for (`full`).

And the snapshot of a given object version, looked up in the bucket (not in Dagster's event
log, whose queries are bounded), for one file or for ten thousand.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from itertools import chain
from urllib.parse import unquote

import pyarrow.parquet as pq

from pipelines.index.layout import IndexLayout
from pipelines.index.listing import list_record_sets
from pipelines.index.reads import read_id
from pipelines.intake.notifications import ChangeFeed, NotificationError
from pipelines.intake.notifications.gaps import LATE_VISIBILITY, changed_since
from pipelines.intake.snapshots import (
    Snapshot,
    load_reads,
    read_record_key,
    reads_prefix,
    sets_file_reads,
)
from pipelines.settings import Settings
from pipelines.storage.base import ObjectInfo, ObjectStore


def read_id_of(read: Snapshot) -> str:
    """The id under which a record set registers this read (pipelines/index/reads.py)."""
    return read_id(
        read.bucket, read.key, read.etag, read.version_id, read.last_modified, read.taken_at
    )


# Read records seen by earlier checks in this process, per bucket and record key: (record ETag,
# read). A sensor checks every minute; only records written since are fetched again.
_read_caches: dict[str, dict[str, tuple[str, Snapshot]]] = {}


@dataclass(frozen=True, slots=True)
class MissingVersion:
    """An object version that lacks what the invariant asks for."""

    info: ObjectInfo
    has_snapshot: bool  # False: not even read; True: read, but no current record set has it


@dataclass(slots=True)
class Reconciliation:
    objects: int = 0  # object versions listed under the incoming prefix
    missing: list[MissingVersion] = field(default_factory=list)

    @property
    def missing_count(self) -> int:
        return len(self.missing)


def reconcile(
    store: ObjectStore,
    settings: Settings,
    parser_versions: Iterable[str],
    listing: Sequence[ObjectInfo] | None = None,
) -> Reconciliation:
    """Which object versions under the incoming prefix lack a snapshot or a record set of one of
    `parser_versions` (the current ones: `pipelines.sources.current_parser_versions`).
    `listing`: the prefix's objects, where the caller listed them already."""
    layout = IndexLayout.of(settings)
    versions = frozenset(parser_versions)
    if listing is None:
        listing = list(store.list(settings.incoming_prefix))
    objects = [o for o in listing if not o.key.endswith("/")]
    read_hexes = _current_reads(store, layout, versions)
    snapshots = {o.key.rsplit("/", 1)[-1] for o in store.list(f"{settings.snapshot_prefix}sha256/")}
    reads = _reads_by_version(store, settings)
    missing = []
    for o in objects:
        read = reads.get((o.key, o.etag))
        if read is None or read.hex not in snapshots:
            missing.append(MissingVersion(o, has_snapshot=False))
        elif read_hexes.get(read_id_of(read)) != read.hex:
            missing.append(MissingVersion(o, has_snapshot=True))
    return Reconciliation(objects=len(objects), missing=missing)


def _reads_by_version(store: ObjectStore, settings: Settings) -> dict[tuple[str, str], Snapshot]:
    """For each (key, ETag) ever read, its newest read: of the read records and the sets files."""
    listed = {o.key: o.etag for o in store.list(reads_prefix(settings)) if o.key.endswith(".json")}
    read_cache = _read_caches.setdefault(store.bucket, {})
    for stale in read_cache.keys() - listed.keys():
        del read_cache[stale]
    changed = [k for k, etag in listed.items() if read_cache.get(k, ("",))[0] != etag]
    for read in load_reads(store, changed):
        record_key = read_record_key(settings, read.key, read.digest)
        if record_key in listed:
            read_cache[record_key] = (listed[record_key], read)
    recorded = [cached[1] for k in listed if (cached := read_cache.get(k)) is not None]
    registered = (
        read
        for by_key in sets_file_reads(store, settings)
        for reads in by_key.values()
        for read in reads
    )
    newest: dict[tuple[str, str], Snapshot] = {}
    for read in chain(recorded, registered):
        held = newest.get((read.key, read.etag))
        if held is None or read.order > held.order:
            newest[(read.key, read.etag)] = read
    return newest


def _current_reads(
    store: ObjectStore, layout: IndexLayout, parser_versions: frozenset[str]
) -> dict[str, str]:
    """read id -> snapshot hex, for every complete record set of a current parser version. A
    source may write a record set under its version and a suffix naming what the index held
    (`+defs-…`, a FlashInfer trace and the definitions it resolved): that is current too."""
    listing = list_record_sets(store, layout)
    reads: dict[str, str] = {}
    for prefix in listing.summaries:
        version, _, snapshot_hex = (
            prefix.removeprefix(layout.records_prefix).rstrip("/").rpartition("/")
        )
        if any(version == v or version.startswith(v + "+") for v in parser_versions):
            reads |= dict.fromkeys(listing.reads.get(prefix, {}), snapshot_hex)
    return reads


# -- what a reconcile tick compares with the ledger ---------------------------------------------

# Where S3 Inventory writes its reports for the incoming prefix, a prefix in the bucket:
# `<destination prefix>/<bucket>/<configuration id>/` (deploy/s3-inventory.json). Set, the
# newest report replaces the listing.
INVENTORY_VARIABLE = "KINDEX_S3_INVENTORY"
# Keys a tick lists where neither an inventory nor a filer log tells what changed: one page.
WALK_KEYS = 1000
# Filer polls per tick at most (each reads up to FEED_PAGE changes); the rest next tick.
FEED_POLLS = 20
FEED_PAGE = 1000
# A first tick reads the filer log from this long ago (a reconcile interval); later ticks from
# where the last one stopped, less the feed's own overlap.
FEED_OVERLAP = timedelta(minutes=15)


@dataclass(frozen=True, slots=True)
class ReconcileCursor:
    """Where the reconcile sensor's last tick left off."""

    missing: int | None = None  # versions found missing by the last tick (its observation)
    feed: str | None = None  # the filer log read up to (the feed's own cursor)
    inventory: str | None = None  # the manifest of the newest inventory report read
    inventory_at: str | None = None  # when that report began scanning (ISO)
    after: str | None = None  # the last key of the last window of keys listed

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> ReconcileCursor:
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        if isinstance(data, int):  # an older kindex's cursor: the missing count alone
            return cls(missing=data)
        if not isinstance(data, dict):
            return cls()
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class ReconcileStep:
    """What one tick compares with the ledger, where it came from, and the cursor after it."""

    versions: list[ObjectInfo]
    source: str  # "full", "inventory", "filer", "gap", "keys" or "none"
    cursor: ReconcileCursor
    objects_read: int = 0  # objects listed or read from an inventory, before any time filter


def changed_versions(
    store: ObjectStore,
    settings: Settings,
    cursor: ReconcileCursor,
    *,
    feed: ChangeFeed | None = None,
    full: bool = False,
    now: datetime | None = None,
) -> ReconcileStep:
    """The object versions a reconcile tick compares with the ledger. `full`: every object
    under the incoming prefix (a listing, only when a user asks). Else, with an inventory
    configured (INVENTORY_VARIABLE): a new report's objects modified since the report before,
    less LATE_VISIBILITY (none when no new report landed); with the filer feed: the changes
    its log holds since the last tick (a gap it reports is listed as the incoming sensor lists
    one); else the next WALK_KEYS keys after the last tick's."""
    now = now or datetime.now(UTC)
    prefix = settings.incoming_prefix
    if full:
        listing = [o for o in store.list(prefix) if not o.key.endswith("/")]
        return ReconcileStep(listing, "full", cursor, len(listing))
    inventory = os.environ.get(INVENTORY_VARIABLE)
    if inventory:
        return _inventory_step(store, settings, inventory, cursor)
    if feed is not None and feed.name == "filer":
        return _feed_step(store, settings, feed, cursor, now)
    return _walk_step(store, prefix, cursor)


def _walk_step(store: ObjectStore, prefix: str, cursor: ReconcileCursor) -> ReconcileStep:
    """The next window of keys, wrapping around at the end: every key is looked at once per
    pass, a tick costs one page whatever the bucket holds."""
    window: list[ObjectInfo] = []
    for info in store.list(prefix, start_after=cursor.after):
        window.append(info)
        if len(window) >= WALK_KEYS:
            break
    after = window[-1].key if len(window) >= WALK_KEYS else None
    versions = [o for o in window if not o.key.endswith("/")]
    return ReconcileStep(versions, "keys", replace(cursor, after=after), len(window))


def _feed_step(
    store: ObjectStore,
    settings: Settings,
    feed: ChangeFeed,
    cursor: ReconcileCursor,
    now: datetime,
) -> ReconcileStep:
    position = cursor.feed or feed.since(now - FEED_OVERLAP)
    found: dict[tuple[str, str, datetime], ObjectInfo] = {}
    source = "filer"
    for _ in range(FEED_POLLS):
        try:
            page = feed.poll(position, FEED_PAGE)
        except NotificationError:  # nothing consumed: the next tick reads from here again
            break
        if page.gap_since is not None:
            # The log may lack what the dead server held: the bucket shows it (once per gap).
            for info in changed_since(store, settings.incoming_prefix, page.gap_since):
                found.setdefault((info.key, info.etag, info.last_modified), info)
            source = "gap"
        for change in page.changes:
            if change.deleted or change.key.endswith("/") or not change.etag:
                continue
            if change.last_modified is None:
                continue
            info = ObjectInfo(change.key, change.etag, change.size or 0, change.last_modified)
            found.setdefault((info.key, info.etag, info.last_modified), info)
        position = page.cursor
        if not page.changes:
            break
    versions = list(found.values())
    return ReconcileStep(versions, source, replace(cursor, feed=position), len(versions))


@dataclass(frozen=True, slots=True)
class InventoryReport:
    """One S3 Inventory report: its manifest's key, when it began scanning, its data files."""

    manifest: str
    taken_at: datetime
    file_format: str  # CSV, ORC or Parquet
    file_schema: str
    files: list[str]


def newest_inventory(
    store: ObjectStore, prefix: str, after: str | None = None
) -> InventoryReport | None:
    """The newest report under an inventory prefix (`<...>/<YYYY-MM-DDTHH-MMZ>/manifest.json`;
    the timestamped folders sort in time), None before the first; `after`: the manifest key of
    the last one read (None: when there is no newer one)."""
    prefix = prefix.removeprefix("/").rstrip("/") + "/"
    manifests = [
        o.key
        # Report folders sort in time, before `data/`: none before the last one read is listed.
        for o in store.list(prefix, start_after=after)
        if o.key.endswith("/manifest.json") and o.key.count("/") == prefix.count("/") + 1
    ]
    if not manifests:
        return None
    key = max(manifests)
    manifest = json.loads(store.get_bytes(key))
    taken_at = datetime.fromtimestamp(int(manifest["creationTimestamp"]) / 1000, UTC)
    return InventoryReport(
        key,
        taken_at,
        str(manifest["fileFormat"]),
        str(manifest.get("fileSchema", "")),
        [str(f["key"]) for f in manifest["files"]],
    )


def inventory_objects(store: ObjectStore, report: InventoryReport) -> list[ObjectInfo]:
    """The objects a report lists (its CSV or Parquet data files, in the same bucket)."""
    objects: list[ObjectInfo] = []
    for key in report.files:
        data = store.get_bytes(key)
        if report.file_format.upper() == "CSV":
            objects += _inventory_csv(data, report.file_schema)
        elif report.file_format.lower() == "parquet":
            objects += _inventory_parquet(data)
        else:
            raise ValueError(f"{report.manifest}: inventory format {report.file_format} unread")
    return objects


def _inventory_csv(data: bytes, schema: str) -> list[ObjectInfo]:
    """A CSV report: no header, the columns the manifest's fileSchema names, keys URL-encoded."""
    columns = [c.strip() for c in schema.split(",")]
    text = gzip.decompress(data).decode() if data[:2] == b"\x1f\x8b" else data.decode()
    objects = []
    for row in csv.reader(io.StringIO(text)):
        fields = dict(zip(columns, row, strict=False))
        if fields.get("IsDeleteMarker") == "true" or fields.get("IsLatest") == "false":
            continue
        objects.append(
            ObjectInfo(
                unquote(fields["Key"]),
                fields["ETag"].strip('"'),
                int(fields.get("Size") or 0),
                datetime.fromisoformat(fields["LastModifiedDate"].replace("Z", "+00:00")),
            )
        )
    return objects


def _inventory_parquet(data: bytes) -> list[ObjectInfo]:
    """A Parquet report: snake_case columns (key, size, last_modified_date, e_tag)."""
    table = pq.read_table(io.BytesIO(data))
    names = set(table.column_names)
    objects = []
    for row in table.to_pylist():
        if row.get("is_delete_marker") or ("is_latest" in names and row.get("is_latest") is False):
            continue
        modified = row["last_modified_date"]
        if modified.tzinfo is None:
            modified = modified.replace(tzinfo=UTC)
        objects.append(
            ObjectInfo(
                str(row["key"]), str(row["e_tag"]).strip('"'), int(row["size"] or 0), modified
            )
        )
    return objects


def _inventory_step(
    store: ObjectStore, settings: Settings, prefix: str, cursor: ReconcileCursor
) -> ReconcileStep:
    report = newest_inventory(store, prefix, cursor.inventory)
    if report is None or report.manifest == cursor.inventory:
        return ReconcileStep([], "inventory", cursor)  # no new report: nothing to compare
    objects = inventory_objects(store, report)
    # What the report before covered was compared then: only what was modified since it began.
    floor = (
        datetime.fromisoformat(cursor.inventory_at) - LATE_VISIBILITY
        if cursor.inventory_at
        else None
    )
    versions = [
        o
        for o in objects
        if o.key.startswith(settings.incoming_prefix)
        and not o.key.endswith("/")
        and (floor is None or o.last_modified >= floor)
    ]
    after = replace(cursor, inventory=report.manifest, inventory_at=report.taken_at.isoformat())
    return ReconcileStep(versions, "inventory", after, len(objects))
