"""The types a file of a batch takes on its way through the steps (pipelines/batch/steps.py), in
order. Each is frozen: a step makes the next from it, and a file that fails at a step becomes a
`Failed`, its own ledger row, which no later step takes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pipelines.batch.records import SnapshotRecords, describe
from pipelines.intake.ledger import FileEntry, FileState
from pipelines.intake.snapshots import VersionChanged
from pipelines.storage.base import NoSuchKey, ObjectInfo

if TYPE_CHECKING:
    from pipelines.intake.snapshots import Snapshot
    from pipelines.records.record_objects import RecordSetContent, RecordSetSummary
    from pipelines.sources import Source


@dataclass(frozen=True, slots=True)
class Found:
    """A file version the batch is to process: its ledger row (read before, when the row names
    a snapshot digest)."""

    entry: FileEntry


@dataclass(frozen=True, slots=True)
class Snapshotted:
    """Its bytes, as kept in their immutable copy."""

    entry: FileEntry
    snapshot: Snapshot
    data: bytes
    kept_now: bool = False  # kept just now: no record set of these bytes can exist yet


class _OfSnapshotted:
    """A type past the snapshot step, whose ledger row is its snapshotted file's."""

    __slots__ = ()
    file: Snapshotted

    @property
    def entry(self) -> FileEntry:
        return self.file.entry


@dataclass(frozen=True, slots=True)
class Parsed(_OfSnapshotted):
    """The source that recognizes its bytes."""

    file: Snapshotted
    source: Source


@dataclass(frozen=True, slots=True)
class Place:
    """Where its record set is: the parser version its source judged, and its prefix."""

    parser_version: str
    source: str
    prefix: str
    registered: frozenset[str] = frozenset()  # the ids of the reads the record set has already


@dataclass(frozen=True, slots=True)
class Normalized(_OfSnapshotted):
    """Its record set, built, not written yet."""

    file: Snapshotted
    place: Place
    content: RecordSetContent


@dataclass(frozen=True, slots=True)
class Reused(_OfSnapshotted):
    """Its record set, written before (the same bytes under another key, or a retry): nothing
    to normalize or write."""

    file: Snapshotted
    place: Place
    summary: RecordSetSummary


Prepared = Normalized | Reused


@dataclass(frozen=True, slots=True)
class Written:
    """Its record set durable and named by the batch's sets file."""

    entry: FileEntry
    records: SnapshotRecords


@dataclass(frozen=True, slots=True)
class Failed:
    """A file a step failed: its ledger row (failed, retried with backoff; or gone), and why."""

    entry: FileEntry
    error: BaseException

    @classmethod
    def of(cls, entry: FileEntry, error: BaseException) -> Failed:
        if isinstance(error, VersionChanged | NoSuchKey):
            reason = f"overwritten or deleted before it was read ({describe(error)})"
            row = replace(entry, state=FileState.GONE, reason=reason, updated_at=None)
        else:
            row = entry.failed(describe(error), datetime.now(UTC))
        return cls(row, error)


def known_info(snapshot: Snapshot) -> ObjectInfo:
    """The object version a snapshot was taken of."""
    return ObjectInfo(
        snapshot.key, snapshot.etag, snapshot.size, snapshot.last_modified, snapshot.version_id
    )
