"""Nothing dropped falls through unseen: the invariant, judged from the bucket alone.

Every object version under the incoming prefix has a snapshot and, for the current parser, a
record set (its quarantine rows included) that registered the read of that version. Both are
visible in listings: a record set's reads are `records/<parser version>/<hex>/reads/<read id>.json`,
where the read id is a hash of the version's bucket, key, ETag and version id, and its snapshot
is `snapshots/sha256/<hex>`. So a check of thousands of objects costs a few listings, and GETs
only for versions that fail it (to say whether their snapshot exists).

Also here: the snapshot of a given object version, looked up in the bucket (not in Dagster's
event log, whose queries are bounded), for one file or for ten thousand.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pipelines.index.layout import IndexLayout
from pipelines.index.reads import ObjectRead
from pipelines.index.record_objects import READS_DIR, SUMMARY_FILE
from pipelines.sensor_cursor import ObjectVersionRef
from pipelines.settings import Settings
from pipelines.snapshots import Snapshot, list_reads, reads_prefix
from pipelines.storage.base import ObjectInfo, ObjectStore

LOOKUP_THREADS = 8
# Past this many versions, one listing of every read beats a listing per key.
BULK_LOOKUP_FROM = 64


def current_parser_versions() -> frozenset[str]:
    """The parser versions a record set made now would carry, one per source."""
    from pipelines.bundles.normalize import PARSER_VERSION as BUNDLE_PARSER_VERSION
    from pipelines.liger.normalize import parser_version

    return frozenset({parser_version(), BUNDLE_PARSER_VERSION})


def read_id_of(bucket: str, info: ObjectInfo) -> str:
    """The id under which a record set registers its read of this object version. The id
    depends only on the version's identity, so the other fields are placeholders."""
    epoch = datetime.fromtimestamp(0, UTC)
    return ObjectRead(
        "", bucket, info.key, info.etag, info.version_id, 0, epoch, epoch, "", ""
    ).read_id


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
    store: ObjectStore, settings: Settings, parser_versions: Iterable[str] | None = None
) -> Reconciliation:
    """Which object versions under the incoming prefix lack a snapshot or a current record set."""
    layout = IndexLayout.of(settings)
    versions = frozenset(parser_versions or current_parser_versions())
    objects = [o for o in store.list(settings.incoming_prefix) if not o.key.endswith("/")]
    read_hexes = _current_reads(store, layout, versions)
    snapshots = {o.key.rsplit("/", 1)[-1] for o in store.list(f"{settings.snapshot_prefix}sha256/")}
    failing = [o for o in objects if not _has(read_hexes, snapshots, store.bucket, o)]
    # A listing carries no version id; on a versioned bucket the read id needs the HEAD's.
    failing = [
        o
        for o in _with_version_ids(store, failing)
        if not _has(read_hexes, snapshots, store.bucket, o)
    ]
    refs = [ObjectVersionRef(o.key, o.etag) for o in failing]
    found = snapshots_of_versions(store, settings, refs)
    return Reconciliation(
        objects=len(objects),
        missing=[
            MissingVersion(o, has_snapshot=ref in found and found[ref].hex in snapshots)
            for o, ref in zip(failing, refs, strict=True)
        ],
    )


def _has(read_hexes: dict[str, str], snapshots: set[str], bucket: str, info: ObjectInfo) -> bool:
    snapshot_hex = read_hexes.get(read_id_of(bucket, info))
    return snapshot_hex is not None and snapshot_hex in snapshots


def _current_reads(
    store: ObjectStore, layout: IndexLayout, parser_versions: frozenset[str]
) -> dict[str, str]:
    """read id -> snapshot hex, for every complete record set of a current parser version."""
    reads: dict[str, str] = {}
    complete: set[str] = set()
    for version in parser_versions:
        base = f"{layout.records_prefix}{version}/"
        for info in store.list(base):
            snapshot_hex, _, rest = info.key.removeprefix(base).partition("/")
            if rest == SUMMARY_FILE:
                complete.add(snapshot_hex)
            elif rest.startswith(READS_DIR + "/") and rest.endswith(".json"):
                reads[rest.removeprefix(READS_DIR + "/").removesuffix(".json")] = snapshot_hex
    return {read_id: h for read_id, h in reads.items() if h in complete}


def _with_version_ids(store: ObjectStore, objects: Sequence[ObjectInfo]) -> list[ObjectInfo]:
    if not objects:
        return []
    with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
        heads = list(pool.map(lambda o: store.head(o.key), objects))
    return [
        head if head is not None and head.etag == o.etag and head.version_id else o
        for o, head in zip(objects, heads, strict=True)
    ]


def snapshots_of_versions(
    store: ObjectStore, settings: Settings, refs: Sequence[ObjectVersionRef]
) -> dict[ObjectVersionRef, Snapshot]:
    """The newest snapshot read of each object version (key and ETag prefix), where one exists.

    Few versions: a listing of each key's reads. Many: one listing of all reads, then a GET of
    the records of the keys asked about only, so the cost follows the bucket, not a query limit.
    """
    by_key: dict[str, list[ObjectVersionRef]] = defaultdict(list)
    for ref in refs:
        by_key[ref.key].append(ref)
    if not by_key:
        return {}
    if len(by_key) < BULK_LOOKUP_FROM:
        with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
            reads = [
                r
                for found in pool.map(lambda k: list_reads(store, settings, k), by_key)
                for r in found
            ]
    else:
        wanted = {reads_prefix(settings, key): key for key in by_key}
        record_keys = [
            o.key
            for o in store.list(reads_prefix(settings))
            if o.key.endswith(".json") and o.key.rsplit("/", 1)[0] + "/" in wanted
        ]
        with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
            reads = [r for r in pool.map(lambda k: _read_record(store, k), record_keys) if r]
    found: dict[ObjectVersionRef, Snapshot] = {}
    for read in sorted(reads, key=lambda r: (r.last_modified, r.read_at)):  # newest last
        for ref in by_key.get(read.key, []):
            if ref.matches(read.etag):
                found[ref] = read
    return found


def _read_record(store: ObjectStore, record_key: str) -> Snapshot | None:
    from pipelines.storage.base import NoSuchKey

    try:
        return Snapshot.from_json(store.get_bytes(record_key))
    except NoSuchKey:
        return None
