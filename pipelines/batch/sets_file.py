"""A batch's sets file: the summary of each record set the batch wrote, and each file's read,
in one object written last, once the record objects are durable."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson

from pipelines.batch.records import SnapshotRecords, records_from_summary, utc_text
from pipelines.batch.stages import Normalized, Prepared, Reused
from pipelines.batch.uploads import _put_cached
from pipelines.index.bucket_format import SetsFileContent
from pipelines.index.layout import IndexLayout
from pipelines.records.record_objects import (
    QUARANTINE_PREVIEW_COLUMNS,
    SETS_FILE,
    RecordSetSummary,
    preview,
    value_counts,
)
from pipelines.storage.base import ObjectStore


def record_set_summary(file: Normalized, files: dict[str, list[str]]) -> RecordSetSummary:
    """What the sets file says of a record set just written (`files`: its objects, by table)."""
    content, place = file.content, file.place
    quarantine, manifests = content.tables["quarantine"], content.tables["manifests"]
    return {
        "snapshot_digest": file.file.snapshot.digest,
        "parser_version": place.parser_version,
        "source": place.source,
        "rows": content.rows,
        "runs": content.row_count("runs"),
        "lineage": content.row_count("lineage"),
        "files": files,
        "runs_by_metric": content.runs_by_metric(),
        "quarantined": quarantine.num_rows,
        "quarantined_by_reason": value_counts(quarantine, "reason"),
        "manifests_by_kind": value_counts(manifests, "kind"),
        "run_preview": content.run_preview(),
        "quarantine_preview": preview(quarantine, QUARANTINE_PREVIEW_COLUMNS),
        "written_at": utc_text(datetime.now(UTC)),
    }


@dataclass(slots=True)
class SetsFile:
    """A batch's record set summaries and reads, as they go into its sets file."""

    folder: str
    summaries: dict[str, RecordSetSummary] = field(default_factory=dict)  # by prefix
    reads: list[orjson.Fragment] = field(default_factory=list)
    # the summaries of record sets its files found written before: a publish reads only the
    # sets files of the ledger rows committed since its version, so each names what it needs
    reused: dict[str, RecordSetSummary] = field(default_factory=dict)

    def add(self, file: Prepared, objects: dict[str, list[str]] | None) -> SnapshotRecords:
        """A file's read, and its record set's summary: new when this file just wrote its
        `objects`; else the one written before (another key of the same bytes in this batch
        wrote them, or an earlier batch)."""
        place, snapshot = file.place, file.file.snapshot
        if isinstance(file, Reused):
            summary, reused = file.summary, True
            self.reused[place.prefix] = summary
        elif objects is not None:
            summary, reused = record_set_summary(file, objects), False
            self.summaries[place.prefix] = summary
        else:
            summary, reused = self.summaries[place.prefix], True
        read = snapshot.registered(place.parser_version, place.source)
        if read.read_id not in place.registered:  # else the same version, processed again
            self.reads.append(orjson.Fragment(SetsFileContent.read_entry(place.prefix, read)))
        return records_from_summary(summary, snapshot.key, place.prefix, reused=reused)

    def put(self, store: ObjectStore, layout: IndexLayout) -> str | None:
        """Write the sets file; its key, which each of its files' ledger rows names (None when
        the batch wrote nothing)."""
        if not self.summaries and not self.reads:
            return None
        key = self.folder + SETS_FILE
        data = SetsFileContent.dumps(self.reused | self.summaries, self.reads)
        _put_cached(store, layout, key, data, content_type="application/json")
        return key
