"""What a batch makes of its files: a record set's counts as its summary states them, and each
file's ledger row."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pipelines.index.bucket_format import RecordSet
from pipelines.index.known import is_awaiting
from pipelines.index.publish import IndexVersion
from pipelines.intake.ledger import FileEntry, FileState
from pipelines.records.record_objects import PreviewRow, RecordSetSummary


@dataclass(slots=True)
class SnapshotRecords:
    """What processing one snapshot produced (or found already written)."""

    snapshot_digest: str
    source_key: str
    parser_version: str
    source: str
    prefix: str  # the record set's prefix in the bucket
    rows: int
    runs: int
    runs_by_metric: dict[str, int]
    quarantined_by_reason: dict[str, int]
    manifests_by_kind: dict[str, int]
    reused: bool  # True when the record set existed: nothing was normalized or written
    record_set: RecordSet  # its summary, which names the objects holding its rows
    run_preview: list[PreviewRow] = field(default_factory=list)
    quarantine_preview: list[PreviewRow] = field(default_factory=list)

    @property
    def quarantined(self) -> int:
        return sum(self.quarantined_by_reason.values())

    @property
    def awaiting(self) -> bool:
        """Whether rows of it wait for another file (a trace for its definition)."""
        return any(is_awaiting(reason) for reason in self.quarantined_by_reason)


def records_from_summary(
    summary: RecordSetSummary, source_key: str, prefix: str, *, reused: bool
) -> SnapshotRecords:
    return SnapshotRecords(
        snapshot_digest=summary["snapshot_digest"],
        source_key=source_key,
        parser_version=summary["parser_version"],
        source=summary["source"],
        prefix=prefix,
        rows=summary["rows"],
        runs=summary["runs"],
        runs_by_metric=summary["runs_by_metric"],
        quarantined_by_reason=summary["quarantined_by_reason"],
        manifests_by_kind=summary["manifests_by_kind"],
        reused=reused,
        record_set=RecordSet(prefix, summary),
        run_preview=summary.get("run_preview", []),
        quarantine_preview=summary.get("quarantine_preview", []),
    )


@dataclass(slots=True)
class IngestSummary:
    files: list[SnapshotRecords]
    index: IndexVersion
    failed: list[FileEntry] = field(default_factory=list)  # files that could not be processed

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def runs_by_metric(self) -> dict[str, int]:
        return dict(sum((Counter(f.runs_by_metric) for f in self.files), Counter()))

    @property
    def quarantined_by_reason(self) -> dict[str, int]:
        return dict(sum((Counter(f.quarantined_by_reason) for f in self.files), Counter()))


@dataclass(slots=True)
class FileResult:
    """What one file of a batch became: its ledger row, and its records when it has them."""

    entry: FileEntry
    records: SnapshotRecords | None = None


@dataclass(slots=True)
class BatchResult:
    batch: str
    files: list[FileResult]
    index: IndexVersion | None = None
    # the ledger rows of files whose rows awaited what this batch brought, marked due again
    due: list[FileEntry] = field(default_factory=list)

    @property
    def requeued(self) -> int:
        return len(self.due)

    def count(self, state: FileState) -> int:
        return sum(1 for f in self.files if f.entry.state is state)

    @classmethod
    def merged(cls, batch: str, results: Sequence[BatchResult]) -> BatchResult:
        """The results of the batches one run took, as one (the newest index)."""
        indexes = [r.index for r in results if r.index is not None]
        return cls(
            batch,
            [file for r in results for file in r.files],
            indexes[-1] if indexes else None,
            [entry for r in results for entry in r.due],
        )


def done_entry(entry: FileEntry, records: SnapshotRecords) -> FileEntry:
    """A file's ledger row once its record set is written: quarantined when not one of its
    rows became a run, with the top reasons."""
    quarantine = Counter(records.quarantined_by_reason)
    # Rows that wait for another file (a trace for its definition) are not bad input: the file
    # is processed again once that file is indexed.
    unusable = [reason for reason in quarantine if not is_awaiting(reason)]
    state = FileState.QUARANTINED if records.runs == 0 and unusable else FileState.INDEXED
    return replace(
        entry,
        state=state,
        reason=", ".join(reason for reason, _ in quarantine.most_common(3)) or None,
        attempts=entry.attempts + 1,
        snapshot_digest=records.snapshot_digest,
        runs=records.runs,
        quarantined=records.quarantined,
        updated_at=None,  # stamped when the row is appended
        next_attempt_at=None,
    )


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def utc_text(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
