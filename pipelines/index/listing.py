"""Every record set in the bucket, from a listing of the records prefix: what a publish reads
once to catch up an index published before its versions named a ledger point
(pipelines/index/committed.py), or rebuilt.

A listing finds each batch's sets file. The summary and read objects of homes written before
those files (`records/<parser_version>/<hex>/summary.json`, `…/reads/<read id>.json`) are
rewritten once as a sets file (`migrate_legacy`), and deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import orjson

from pipelines.index.bucket_format import ObjectRead, ReadJson, RecordSet, SetsFileContent, read_of
from pipelines.index.layout import IndexLayout
from pipelines.index.local import cache_bytes, fetch_all
from pipelines.records.record_objects import READS_DIR, SETS_FILE, SUMMARY_FILE, RecordSetSummary
from pipelines.storage.base import NoSuchKey, ObjectStore


@dataclass(frozen=True, slots=True)
class Listed:
    """Where a summary or a read is: entry `member` of the batch sets file at `key`."""

    key: str
    member: int


@dataclass(slots=True)
class RecordSetListing:
    """The complete record sets in the bucket and the reads registered with them: each batch's
    sets file (its summaries and reads, written once its record objects are durable)."""

    summaries: dict[str, Listed] = field(default_factory=dict)  # prefix -> its summary
    reads: dict[str, dict[str, Listed]] = field(default_factory=dict)  # prefix -> read id ->
    batch_files: dict[str, SetsFileContent] = field(default_factory=dict)  # key -> its content

    def unpublished(
        self, included_sets: set[str], included_reads: set[tuple[str, str]]
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """What a publish adds to an index that holds these: the complete record sets it lacks,
        and the reads, as (prefix, read id), it lacks of complete sets. A record set counts once
        it has a read too: a set without one (a home written before batch files, its process
        killed between the summary and the read) has no source key yet."""
        sets = [
            prefix
            for prefix in sorted(self.summaries)
            if prefix not in included_sets and prefix in self.reads
        ]
        reads = sorted(
            (prefix, read)
            for prefix, ids in self.reads.items()
            if prefix in self.summaries
            for read in ids
            if (prefix, read) not in included_reads
        )
        return sets, reads

    def record_sets(
        self, store: ObjectStore, layout: IndexLayout, prefixes: Sequence[str]
    ) -> list[RecordSet]:
        """The record sets at these prefixes."""
        return [RecordSet(prefix, self._summary(self.summaries[prefix])) for prefix in prefixes]

    def _summary(self, place: Listed) -> RecordSetSummary:
        return list(self.batch_files[place.key].summaries.values())[place.member]

    def object_reads(
        self, store: ObjectStore, layout: IndexLayout, ids: Sequence[tuple[str, str]]
    ) -> list[ObjectRead]:
        """The reads of these (prefix, read id) pairs."""
        places = [self.reads[prefix][read] for prefix, read in ids]
        return [self.batch_files[place.key].reads[place.member].read for place in places]


# The sets file the objects of a home written before batch files become: named to sort before
# every batch's, so that a prefix a batch wrote since is the batch's.
LEGACY_SETS_FILE = "00000000T000000000000-legacy/" + SETS_FILE


def list_record_sets(store: ObjectStore, layout: IndexLayout) -> RecordSetListing:
    """Every complete record set and read, from one listing of the records prefix and the
    batches' sets files (each fetched once: the cache keeps them, they never change). A prefix
    several batches wrote (its file processed again before the index had it) is the newest's.
    The summary and read objects of a home written before batch files are migrated first."""
    listing = RecordSetListing()
    batches = layout.batches_prefix
    batch_keys, legacy = [], []
    for info in store.list(layout.records_prefix):
        key = info.key
        if key.endswith("/" + SETS_FILE) and key.startswith(batches):
            batch_keys.append(key)
        elif key.endswith("/" + SUMMARY_FILE) or (
            f"/{READS_DIR}/" in key and key.endswith(".json") and not key.startswith(batches)
        ):
            legacy.append(key)
    if legacy:
        batch_keys.append(migrate_legacy(store, layout, legacy))
    batch_keys = sorted(set(batch_keys))  # named by when they were written
    for key, path in zip(batch_keys, fetch_all(store, layout, batch_keys), strict=True):
        content = SetsFileContent.loads(path.read_bytes(), key)
        listing.batch_files[key] = content
        for n, prefix in enumerate(content.summaries):
            listing.summaries[prefix] = Listed(key, n)
        for n, registered in enumerate(content.reads):
            places = listing.reads.setdefault(registered.prefix, {})
            places[registered.read.read_id] = Listed(key, n)
    return listing


def migrate_legacy(store: ObjectStore, layout: IndexLayout, keys: Sequence[str]) -> str:
    """Rewrite the summary and read objects of a home written before batch files (a
    `summary.json` and `reads/<read id>.json` in each record set's prefix) as one sets file,
    then delete them: from then on, the sets file is all there is to read. Run again after a
    crash between the two, it writes the same sets file again. Returns its key."""
    summaries: dict[str, RecordSetSummary] = {}
    reads: list[bytes] = []
    for key, path in zip(keys, fetch_all(store, layout, keys), strict=True):
        data = path.read_bytes()
        if key.endswith("/" + SUMMARY_FILE):
            summaries[key.removesuffix(SUMMARY_FILE)] = cast(RecordSetSummary, orjson.loads(data))
        else:
            prefix = key.rpartition(f"{READS_DIR}/")[0]
            read = read_of(cast(ReadJson, orjson.loads(data)))
            reads.append(SetsFileContent.read_entry(prefix, read))
    if keys and (existing := _legacy_sets_file(store, layout)) is not None:
        # Migrated before, and objects left: their entries join those written then.
        summaries = existing.summaries | summaries
        reads = [SetsFileContent.read_entry(r.prefix, r.read) for r in existing.reads] + reads
    target = layout.batches_prefix + LEGACY_SETS_FILE
    data = SetsFileContent.dumps(summaries, reads)
    store.put(target, data, content_type="application/json")
    cache_bytes(layout.cached_path(target), data)
    for key in keys:
        store.delete(key)
    return target


def _legacy_sets_file(store: ObjectStore, layout: IndexLayout) -> SetsFileContent | None:
    key = layout.batches_prefix + LEGACY_SETS_FILE
    try:
        return SetsFileContent.loads(store.get_bytes(key), key)
    except NoSuchKey:
        return None
