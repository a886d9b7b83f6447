"""Record sets written before, for a batch that reads bytes kept before (a retry, a backfill,
the same file dropped again or under another key): found without a listing of `records/`.

A record set is the index's or it is not yet. One not yet published is in a sets file the
ledger rows committed since the index's version name (`RegisteredReads` holds their summaries).
One the index holds is named by its reads in the index's `snapshots` table, and its summary is
in the sets file of a batch that processed one of those reads: that version's ledger row names
it (`sets_file`), read from the version's arrival window (`Ledger.seen`). So a lookup costs the
windows of the versions that read these bytes, one version per record set, never the history.
A record set not found (its batch killed before its ledger commit, or a row written before rows
named their sets file) is built and written again, in a batch whose summary alone claims its
rows: nothing is added twice.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from pipelines.batch.stages import known_info
from pipelines.index.bucket_format import SetsFileContent
from pipelines.index.layout import IndexLayout
from pipelines.index.listing import RecordSetListing, list_record_sets
from pipelines.index.local import fetch_all
from pipelines.intake.ledger import Ledger
from pipelines.intake.snapshots import RegisteredReads, Snapshot
from pipelines.records.record_objects import RecordSetSummary
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore


@dataclass(frozen=True, slots=True)
class WrittenSet:
    """A record set written before: its summary, and the ids of the reads it has already."""

    summary: RecordSetSummary
    registered: frozenset[str]


@dataclass(slots=True)
class WrittenSets:
    """The record sets written before of some snapshots' bytes, by prefix."""

    found: dict[str, WrittenSet] = field(default_factory=dict)

    def get(self, prefix: str) -> WrittenSet | None:
        return self.found.get(prefix)

    @classmethod
    def of(cls, store: ObjectStore, settings: Settings, digests: Collection[str]) -> WrittenSets:
        """Those of the snapshots `digests`, under any parser version."""
        layout = IndexLayout.of(settings)
        reads = RegisteredReads.of(store, settings)
        if reads.listed:  # an index published before ledger points: its listing, once
            return cls.of_listing(store, layout, list_record_sets(store, layout), digests)
        ids = {prefix: set(found) for prefix, found in reads.read_ids.items()}
        summaries = dict(reads.summaries)
        newest: dict[str, Snapshot] = {}  # a published read of each set without a summary yet
        for parser_version, read_id, read in reads.of_contents(digests):
            prefix = layout.record_set_prefix(parser_version, read.digest)
            ids.setdefault(prefix, set()).add(read_id)
            if prefix not in summaries and (
                prefix not in newest or read.order > newest[prefix].order
            ):
                newest[prefix] = read
        if newest:
            summaries |= _published_summaries(store, settings, layout, newest)
        return cls(
            {
                prefix: WrittenSet(summary, frozenset(ids.get(prefix, ())))
                for prefix, summary in summaries.items()
                if ids.get(prefix) and summary["snapshot_digest"] in digests
            }
        )

    @classmethod
    def of_listing(
        cls,
        store: ObjectStore,
        layout: IndexLayout,
        listing: RecordSetListing,
        digests: Collection[str],
    ) -> WrittenSets:
        found = {}
        for prefix in listing.summaries:
            if prefix not in listing.reads:  # a set counts once it has a read
                continue
            [written] = listing.record_sets(store, layout, [prefix])
            if written.summary["snapshot_digest"] in digests:
                found[prefix] = WrittenSet(written.summary, frozenset(listing.reads[prefix]))
        return cls(found)


def _published_summaries(
    store: ObjectStore, settings: Settings, layout: IndexLayout, reads: dict[str, Snapshot]
) -> dict[str, RecordSetSummary]:
    """The summaries of the published record sets at these prefixes, each from the sets file
    named by the ledger row of a version it read (`reads`): one ledger read of their windows."""
    rows = Ledger.of(store, settings).seen([known_info(read) for read in reads.values()])
    keys = sorted({row.sets_file for row in rows.values() if row.sets_file})
    found: dict[str, RecordSetSummary] = {}
    for key, path in zip(keys, fetch_all(store, layout, keys), strict=True):
        content = SetsFileContent.loads(path.read_bytes(), key)
        found |= {p: s for p, s in content.summaries.items() if p in reads and p not in found}
    return found
