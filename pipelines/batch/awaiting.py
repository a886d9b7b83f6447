"""Files whose rows wait for another file (a FlashInfer trace for its definition). Where a
definition is found at normalize time is the source interface's (`pipelines.sources`
`offered_first`: the batch's own files, then the index). When a batch brings what such files
may wait for, it marks every waiting file due again in the ledger (those the index holds, and
those of the sets files the ledger rows committed since its version name: never a listing of
the record sets), and a later batch (the ledger sensor's, or `kindex ingest`'s last) reads them
like any other file. A batch that wrote waiting files itself asks again, once its record sets
are durable, whether what they wait for landed meanwhile (a batch running beside it): one of the
two always sees the other."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from pipelines.batch.records import FileResult
from pipelines.batch.stages import Failed, Parsed
from pipelines.batch.steps import judged_version
from pipelines.index.bucket_format import SetsFileContent
from pipelines.index.catalog import IndexCatalog, Version
from pipelines.index.committed import committed_after
from pipelines.index.known import awaiting_files, is_awaiting, known_manifests
from pipelines.index.layout import IndexLayout
from pipelines.index.listing import list_record_sets
from pipelines.index.local import fetch_all, load_current
from pipelines.index.publish import included
from pipelines.intake.ledger import FileEntry, FileState, Ledger
from pipelines.records.record_objects import RecordSetSummary
from pipelines.settings import Settings
from pipelines.sources import SourceContext
from pipelines.storage.base import ObjectStore

DUE_AGAIN = "due again: a file it awaited landed"


def landed_meanwhile(
    store: ObjectStore,
    settings: Settings,
    parsed: Sequence[Parsed | Failed],
    results: Sequence[FileResult],
) -> list[tuple[str, str]]:
    """(snapshot digest, key) of the files of this batch (`parsed`, and what became of them)
    whose rows wait, and whose source judges them another version now that the index, and the
    record sets written beside it, are asked again."""
    waiting = [
        (file, result.records)
        for file, result in zip(parsed, results, strict=True)
        if isinstance(file, Parsed) and result.records is not None and result.records.awaiting
    ]
    if not waiting:
        return []
    known = known_manifests(store, settings)
    context = SourceContext(known_digest=known, manifest_named=known.named)
    landed = []
    for file, records in waiting:
        if judged_version(file, context) != records.parser_version:
            landed.append((records.snapshot_digest, records.source_key))
    return landed


def unpublished_awaiting(store: ObjectStore, settings: Settings) -> list[tuple[str, str]]:
    """(snapshot digest, key) of each file whose rows wait, in a record set the index lacks:
    of the sets files named by the ledger rows committed since its version (an index published
    before versions named a ledger point: of the listing its next publish reads once)."""
    layout = IndexLayout.of(settings)
    catalog = IndexCatalog.beside(store, settings)
    version = Version.empty() if catalog.outdated() else catalog.current()
    committed = committed_after(catalog, version)
    if committed is None:
        return _listed_awaiting(store, settings, layout)
    found = []
    for key, path in zip(
        committed.sets_files, fetch_all(store, layout, committed.sets_files), strict=True
    ):
        content = SetsFileContent.loads(path.read_bytes(), key)
        waiting = {p for p, summary in content.summaries.items() if _awaits(summary)}
        reads = [r.read for r in content.reads if r.prefix in waiting]
        found += [(read.snapshot_digest, read.source_key) for read in reads]
    return found


def _awaits(summary: RecordSetSummary) -> bool:
    return any(is_awaiting(reason) for reason in summary["quarantined_by_reason"])


def _listed_awaiting(
    store: ObjectStore, settings: Settings, layout: IndexLayout
) -> list[tuple[str, str]]:
    listing = list_record_sets(store, layout)
    prefixes, _ = listing.unpublished(*included(store, layout, load_current(store, settings)))
    found = []
    for record_set in listing.record_sets(store, layout, prefixes):
        if _awaits(record_set.summary):
            ids = [(record_set.prefix, read) for read in listing.reads[record_set.prefix]]
            for read in listing.object_reads(store, layout, ids):
                found.append((record_set.summary["snapshot_digest"], read.source_key))
    return found


def mark_due(
    store: ObjectStore,
    settings: Settings,
    waiting: Iterable[tuple[str, str]] = (),
    *,
    everywhere: bool = True,
) -> list[FileEntry]:
    """Mark due again, in one ledger append, the files `waiting` ((snapshot digest, key)) and,
    `everywhere`, every file whose rows wait, published or not. Returns their new rows: pending,
    their next attempt now."""
    wanted = set(waiting)
    if everywhere:
        wanted |= set(awaiting_files(store, settings)) | set(unpublished_awaiting(store, settings))
    if not wanted:
        return []
    ledger = Ledger.of(store, settings)
    now = datetime.now(UTC)
    due = [
        replace(
            entry,
            state=FileState.PENDING,
            reason=DUE_AGAIN,
            batch=None,
            updated_at=None,
            next_attempt_at=now,
        )
        for entry in ledger.known_versions({key for _, key in wanted}).values()
        if (entry.snapshot_digest, entry.key) in wanted
        and entry.state in (FileState.INDEXED, FileState.QUARANTINED)
    ]
    ledger.append(due)
    return due
