"""The ingest of a batch of dropped files, plain Python: the steps in order, as
pipelines/batch/ states them (find, snapshot, parse, normalize, write, commit), then the index
published once.

A batch is committed to the ledger only once its record sets are durable: a crash before redoes
the batch, and a redone file writes its record set again (no ledger row names the sets file of
the batch that died) in a batch of its own whose summary alone claims its rows, and adds no run
twice. A crash
between the commit and the publish leaves record sets the index lacks, which the next publish
takes (the index catch-up sensor asks for one). `kindex ingest` takes the same steps for files
on disk, and publishes once at its end.

A file whose rows wait for another (a FlashInfer trace for its definition) finds it among its
batch's files or in the index; one whose definition lands in a later batch is marked due again
by that batch (pipelines/batch/awaiting.py), and read again by the next.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from pipelines.batch.awaiting import landed_meanwhile, mark_due
from pipelines.batch.checks import (
    SCHEMA_CHECKED_RUNS,
    SchemaVerdict,
    runs_by_snapshot,
    schema_sample,
    schema_verdict,
)
from pipelines.batch.records import (
    BatchResult,
    FileResult,
    IngestSummary,
    SnapshotRecords,
    describe,
)
from pipelines.batch.sets_file import SetsFile
from pipelines.batch.stages import Failed, Found, Snapshotted, known_info
from pipelines.batch.steps import commit, each_file, normalize, offered, parse, snapshot, write
from pipelines.batch.uploads import (
    FILE_THREADS,
    INGEST_BATCH,
    PROCESS_UPLOAD_FILES,
    parts_folder,
    uploader,
)
from pipelines.index.publish import publish_index
from pipelines.intake.ledger import FileEntry
from pipelines.intake.snapshots import read_snapshot, sets_file_reads
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore
from pipelines.storage.s3 import store_session

if TYPE_CHECKING:
    from pipelines.intake.snapshots import Snapshot, TakenSnapshot

__all__ = [
    "BATCH_BYTES",
    "BATCH_FILES",
    "FILE_THREADS",
    "INGEST_BATCH",
    "PROCESS_UPLOAD_FILES",
    "SCHEMA_CHECKED_RUNS",
    "BatchResult",
    "FileResult",
    "IngestSummary",
    "SchemaVerdict",
    "SetsFile",
    "SnapshotRecords",
    "bounded_batches",
    "describe",
    "ingest_paths",
    "known_info",
    "process_batch",
    "process_batches",
    "process_snapshot",
    "runs_by_snapshot",
    "schema_sample",
    "schema_verdict",
]


def process_batch(
    store: ObjectStore,
    settings: Settings,
    entries: Sequence[FileEntry],
    batch: str,
    *,
    publish: bool = True,
) -> BatchResult:
    """The steps over a batch of files, in order; one file's failure (its bytes, its key, an S3
    error) is its own ledger row, never its neighbours'. When the batch brings what files
    written before wait for, those are marked due again; then the index is published, once."""
    found = [Found(replace(entry, batch=batch)) for entry in entries]
    # The batches' reads, looked up once for the files the ledger says were read before.
    registered = (
        sets_file_reads(store, settings) if any(e.snapshot_digest for e in entries) else None
    )
    snapshotted = each_file(found, lambda f: snapshot(store, settings, f, registered))
    return finish(store, settings, batch, snapshotted, publish=publish)


def finish(
    store: ObjectStore,
    settings: Settings,
    batch: str,
    files: Sequence[Snapshotted | Failed],
    *,
    publish: bool,
) -> BatchResult:
    """The steps after the snapshot, and the commit. Then files that wait for another are
    marked due again: every one the bucket holds when the batch's files offer others what they
    may wait for; this batch's own when what they wait for landed while it ran. Then the index,
    when `publish`."""
    parsed = each_file(files, parse)
    offers = offered(parsed)
    with parts_folder(settings) as parts_dir:
        written = write(store, settings, normalize(store, settings, parsed, parts_dir, offers))
    result = commit(store, settings, batch, written)
    landed = landed_meanwhile(store, settings, parsed, result.files)
    if offers or landed:
        result.due = mark_due(store, settings, landed, everywhere=bool(offers))
    if publish and files:
        result.index = publish_index(store, settings)
    return result


# A batch's files: enough that a batch pays its fixed costs (a Dagster run, a publish, a ledger
# commit, the checks' chart) once for many small files; its bytes bounded, since they stay in
# memory through its steps.
BATCH_FILES = 1000
BATCH_BYTES = 256 << 20


def bounded_batches(sizes: Sequence[int], names: Sequence[str] = ()) -> Iterator[list[int]]:
    """The files in order (their indexes), in batches of at most BATCH_FILES files and
    BATCH_BYTES bytes (a larger file alone). `names`: files of one name never share a batch
    (`kindex ingest` uploads both to one key: the second waits until the first is done)."""
    batch: list[int] = []
    held, seen = 0, set[str]()
    for i, size in enumerate(sizes):
        name = names[i] if names else None
        if batch and (
            len(batch) >= BATCH_FILES or held + size > BATCH_BYTES or (name and name in seen)
        ):
            yield batch
            batch, held, seen = [], 0, set()
        batch.append(i)
        held += size
        if name:
            seen.add(name)
    if batch:
        yield batch


def process_batches(
    store: ObjectStore, settings: Settings, entries: Sequence[FileEntry], batch: str
) -> Iterator[BatchResult]:
    """process_batch over files that may be more than a batch holds (a backfill of many
    windows, a glob): bounded batches, in order, named `batch` when there is one."""
    chunks = list(bounded_batches([entry.size for entry in entries]))
    for n, chunk in enumerate(chunks):
        name = batch if len(chunks) == 1 else f"{batch}-{n}"
        yield process_batch(store, settings, [entries[i] for i in chunk], name)


def process_snapshot(
    store: ObjectStore, settings: Settings, snapshot: Snapshot, taken: TakenSnapshot | None = None
) -> SnapshotRecords:
    """Normalize a snapshot's bytes and write its record objects (once per parser version):
    the batch steps over a batch of one, whose failure is raised, and whose ledger row is
    appended. `taken`: the snapshot as this process just took it. Its bytes are not read
    again; if it kept them first, no record set of them can exist yet, and none is looked
    for."""
    data = read_snapshot(store, settings, snapshot) if taken is None else taken.data
    entry = FileEntry.pending(store.bucket, known_info(snapshot))
    file = Snapshotted(entry, snapshot, data, kept_now=taken is not None and taken.kept_now)
    with parts_folder(settings) as parts_dir:
        [written] = write(store, settings, normalize(store, settings, [parse(file)], parts_dir))
    if isinstance(written, Failed):
        raise written.error
    # The commit step: its ledger row names its sets file, what the next publish reads.
    commit(store, settings, "", [written])
    return written.records


def ingest_paths(
    paths: Sequence[Path | str],
    settings: Settings,
    progress: bool = True,
    store: ObjectStore | None = None,
) -> IngestSummary:
    """Upload each file to incoming/<name>, snapshot it, write its records, then publish. Files
    marked due again by these batches (rows that awaited a definition one of them brought) are
    the last batch, before the one publish."""
    if store is None:  # the configured endpoint, or the embedded server (started if need be)
        with store_session(settings) as session_store:
            return ingest_paths(paths, settings, progress, session_store)
    # tqdm's monitor thread (it only nudges stalled bars) would make this process fork its
    # workers from a forkserver (pipelines/forked.py), which costs about half a second per file.
    tqdm.monitor_interval = 0
    files = [Path(path) for path in paths]
    # Counts the files' bytes, so that a big file weighs what it costs.
    sizes = [path.stat().st_size for path in files]
    bar = tqdm(
        total=sum(sizes),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not (progress and sys.stderr.isatty()),
    )
    done: list[FileResult] = []
    due: list[FileEntry] = []
    with bar, uploader(store, settings) as upload:
        for batch in bounded_batches(sizes, [path.name for path in files]):
            bar.set_description(f"{files[batch[0]].name} and {len(batch) - 1} more")
            uploaded = upload([files[i] for i in batch])
            result = finish(store, settings, INGEST_BATCH, uploaded, publish=False)
            done += result.files
            due += result.due
            bar.update(sum(sizes[i] for i in batch))
        if due:
            bar.set_description("files due again")
            versions = {entry.version: entry for entry in due}  # marked due by several batches
            again = process_batch(
                store, settings, list(versions.values()), INGEST_BATCH, publish=False
            )
            # a file of these batches read again is listed once, as it is now; one of an earlier
            # ingest, when its records changed
            ours = {f.entry.version for f in done}
            now = {
                f.entry.version: f
                for f in again.files
                if f.entry.version in ours or f.records is None or not f.records.reused
            }
            done = [now.pop(f.entry.version, f) for f in done] + list(now.values())
        bar.set_description("publishing index")
        index = publish_index(store, settings)
    records = [f.records for f in done if f.records is not None]
    failed = [f.entry for f in done if f.records is None]
    return IngestSummary(records, index, failed)
