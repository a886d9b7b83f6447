"""Files whose rows wait for another file (a FlashInfer trace for its definition): when a batch
brings what such files may wait for, the ledger marks them due again, and a later batch (the
ledger sensor's, or `kindex ingest`'s last) reads them like any other file. Where a definition
is found at normalize time is the source interface's (`pipelines.sources.offered_first`: the
batch's own files, then the index)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

from pipelines.index.known import awaiting_files
from pipelines.intake.ledger import FileEntry, FileState, Ledger
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore

DUE_AGAIN = "due again: a file it awaited landed"


def mark_due(
    store: ObjectStore, settings: Settings, waiting: Iterable[tuple[str, str]] = ()
) -> list[FileEntry]:
    """Mark due again, in one ledger append, the files whose rows wait for another: those the
    published index holds, and `waiting` ((snapshot digest, key) of files written since, not
    published yet). Returns their new rows: pending, their next attempt now."""
    wanted = set(waiting) | set(awaiting_files(store, settings))
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
