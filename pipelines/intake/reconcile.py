"""Nothing dropped falls through unseen: the invariant, judged from the bucket alone.

Every object version under the incoming prefix has a snapshot and, for the current parser, a
record set (its quarantine rows included) that registered the read of that version. A version's
read is its key's newest recorded read with its ETag (pipelines/intake/snapshots.py: a read
record, `snapshots/reads/<key>/<hex>.json`, or a read a batch's sets file registered); a record
set's reads are in the sets file of the batch that wrote it (`records/batches/<batch>/sets.json`;
`records/<parser version>/<hex>/reads/<read id>.json` in homes written before) and its snapshot
is `snapshots/sha256/<hex>`. So a check costs a few listings, and a GET of each read record and
sets file that is new since the last check.

Also here: the snapshot of a given object version, looked up in the bucket (not in Dagster's
event log, whose queries are bounded), for one file or for ten thousand.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain

from pipelines.index.layout import IndexLayout
from pipelines.index.listing import list_record_sets
from pipelines.index.reads import read_id
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
