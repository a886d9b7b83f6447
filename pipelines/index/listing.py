"""Every record set in the bucket, from a listing of the records prefix: what a publish read
before its versions named a ledger point, and what it reads once more to catch up an index
published before (pipelines/index/committed.py), or rebuilt.

A listing finds each batch's sets file, and the summary and read objects of homes written before
those files (`records/<parser_version>/<hex>/summary.json`, `…/reads/<read id>.json`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import orjson

from pipelines.index.bucket_format import ObjectRead, ReadJson, RecordSet, SetsFileContent, read_of
from pipelines.index.layout import IndexLayout
from pipelines.index.local import fetch_all
from pipelines.records.record_objects import READS_DIR, SETS_FILE, SUMMARY_FILE, RecordSetSummary
from pipelines.storage.base import ObjectStore


@dataclass(frozen=True, slots=True)
class Listed:
    """Where a summary or a read is: an object of its own (a home written before batch files),
    or entry `member` of a batch's sets file."""

    key: str
    member: int | None = None


@dataclass(slots=True)
class RecordSetListing:
    """The complete record sets in the bucket and the reads registered with them: each batch's
    sets file (its summaries and reads, written once its record objects are durable), and the
    summary and read objects of homes written before those files."""

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
        """The record sets at these prefixes, their summaries read from the cache or fetched."""
        places = [self.summaries[p] for p in prefixes]
        own = self._own(store, layout, places)
        return [
            RecordSet(
                prefix,
                cast(RecordSetSummary, orjson.loads(own[place.key]))
                if place.member is None
                else self._member_summary(place),
            )
            for prefix, place in zip(prefixes, places, strict=True)
        ]

    def _member_summary(self, place: Listed) -> RecordSetSummary:
        assert place.member is not None
        content = self.batch_files[place.key]
        return list(content.summaries.values())[place.member]

    def object_reads(
        self, store: ObjectStore, layout: IndexLayout, ids: Sequence[tuple[str, str]]
    ) -> list[ObjectRead]:
        """The reads of these (prefix, read id) pairs."""
        places = [self.reads[prefix][read] for prefix, read in ids]
        own = self._own(store, layout, places)
        return [
            read_of(cast(ReadJson, orjson.loads(own[place.key])))
            if place.member is None
            else self.batch_files[place.key].reads[place.member].read
            for place in places
        ]

    @staticmethod
    def _own(store: ObjectStore, layout: IndexLayout, places: Sequence[Listed]) -> dict[str, bytes]:
        """The bytes of the objects of their own among `places`, by key."""
        keys = [place.key for place in places if place.member is None]
        return {
            key: path.read_bytes()
            for key, path in zip(keys, fetch_all(store, layout, keys), strict=True)
        }


def list_record_sets(store: ObjectStore, layout: IndexLayout) -> RecordSetListing:
    """Every complete record set and read, from one listing of the records prefix and the
    batches' sets files (each fetched once: the cache keeps them, they never change). A prefix
    several batches wrote (its file processed again before the index had it) is the newest's."""
    listing = RecordSetListing()
    batches = layout.batches_prefix
    batch_keys = []
    for info in store.list(layout.records_prefix):
        key = info.key
        if key.endswith("/" + SETS_FILE) and key.startswith(batches):
            batch_keys.append(key)
        elif key.endswith("/" + SUMMARY_FILE):
            listing.summaries[key.removesuffix(SUMMARY_FILE)] = Listed(key)
        elif f"/{READS_DIR}/" in key and key.endswith(".json"):
            prefix, _, name = key.rpartition(f"{READS_DIR}/")
            listing.reads.setdefault(prefix, {})[name.removesuffix(".json")] = Listed(key)
    batch_keys.sort()  # named by when they were written
    for key, path in zip(batch_keys, fetch_all(store, layout, batch_keys), strict=True):
        content = SetsFileContent.loads(path.read_bytes(), key)
        listing.batch_files[key] = content
        for n, prefix in enumerate(content.summaries):
            listing.summaries[prefix] = Listed(key, n)
        for n, registered in enumerate(content.reads):
            places = listing.reads.setdefault(registered.prefix, {})
            places[registered.read.read_id] = Listed(key, n)
    return listing
