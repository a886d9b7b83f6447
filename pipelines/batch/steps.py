"""The steps of a batch, in the order a file takes them, each a function from one of its types
(pipelines/batch/stages.py) to the next: snapshot, parse, normalize, write, commit. A step over
several files (`each_file`) makes a failing file a `Failed`, which the later steps pass on."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from pipelines.batch.records import BatchResult, FileResult, done_entry, utc_text
from pipelines.batch.sets_file import SetsFile
from pipelines.batch.stages import (
    Failed,
    Found,
    Normalized,
    Parsed,
    Place,
    Prepared,
    Reused,
    Snapshotted,
    Written,
    known_info,
)
from pipelines.batch.uploads import (
    FILE_THREADS,
    batch_folder,
    is_small,
    put_own_objects,
    put_shared_objects,
)
from pipelines.batch.written import WrittenSets
from pipelines.index.faults import RECORD_FILES_WRITTEN, pause_point
from pipelines.index.known import KnownManifests, known_manifests
from pipelines.index.layout import IndexLayout
from pipelines.intake.ledger import FileEntry, Ledger, version_of
from pipelines.intake.snapshots import list_reads, read_and_keep, read_snapshot
from pipelines.settings import Settings
from pipelines.sources import (
    SourceContext,
    SourceObject,
    manifests_offered,
    offered_first,
    offering,
    source_of,
)
from pipelines.storage.base import ObjectStore

if TYPE_CHECKING:
    from pipelines.intake.snapshots import RegisteredReads
    from pipelines.sources import Offered


class OfFile(Protocol):
    @property
    def entry(self) -> FileEntry: ...


F = TypeVar("F", bound=OfFile)
G = TypeVar("G")


def each_file(files: Sequence[F | Failed], step: Callable[[F], G]) -> list[G | Failed]:
    """A step over each file not failed yet, in order, on a few threads (a file's step is mostly
    small S3 requests, which wait on the network); what a file's step raises fails that file
    alone."""

    def guarded(file: F) -> G | Failed:
        try:
            return step(file)
        except Exception as error:  # this file's alone; the others go on
            return Failed.of(file.entry, error)

    done: dict[int, G | Failed] = {i: f for i, f in enumerate(files) if isinstance(f, Failed)}
    todo = {i: f for i, f in enumerate(files) if not isinstance(f, Failed)}
    if len(todo) <= 1:
        done |= {i: guarded(f) for i, f in todo.items()}
    else:
        with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="kindex-file") as pool:
            futures = {pool.submit(guarded, f): i for i, f in todo.items()}
            for future in as_completed(futures):
                done[futures[future]] = future.result()
    return [done[i] for i in range(len(files))]


# -- 2. snapshot ---------------------------------------------------------------------------------


def snapshot(
    store: ObjectStore,
    settings: Settings,
    found: Found,
    registered: Sequence[RegisteredReads] | None = None,
) -> Snapshotted:
    """The file's GET and its immutable copy (written once; its first read is recorded by the
    batch's sets file). A version processed before is not copied again: its read is loaded
    (`registered`: the batches' reads, as the batch looked them up)."""

    entry = found.entry
    if entry.snapshot_digest is not None:
        known = [
            r
            for r in list_reads(store, settings, entry.key, registered)
            if r.digest == entry.snapshot_digest and version_of(known_info(r)) == entry.version
        ]
        if known:  # its newest read (another of the same version: a read by a concurrent batch)
            return Snapshotted(entry, known[-1], read_snapshot(store, settings, known[-1]))
    taken = read_and_keep(store, settings, entry.key, etag=entry.etag)
    return Snapshotted(entry, taken.snapshot, taken.data, taken.kept_now)


# -- 3. parse ------------------------------------------------------------------------------------


def parse(file: Snapshotted) -> Parsed:
    """The source that recognizes the file's bytes."""
    return Parsed(file, source_of(file.entry.key, file.data))


def offered(files: Sequence[Parsed | Failed]) -> Offered:
    """What the batch's files offer each other (a FlashInfer definition its traces name)."""
    return manifests_offered(
        (f.entry.key, f.file.data) for f in files if isinstance(f, Parsed) and offering(f.source)
    )


# -- 4. normalize --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Placed:
    """A parsed file whose record set is to be built, at its place."""

    parsed: Parsed
    place: Place

    @property
    def entry(self) -> FileEntry:
        return self.parsed.entry


def judged_version(parsed: Parsed, context: SourceContext) -> str:
    """The parser version the file's source gives its bytes under what `context` finds."""
    received = replace(context, received_at=utc_text(parsed.file.snapshot.last_modified))
    return parsed.source.version_of(parsed.file.data, received)


@dataclass(slots=True)
class _Lookups:
    """What normalizing looks up beyond a file's bytes: the index's manifests (and those of the
    files normalized before), and the record sets written before of the bytes kept before."""

    layout: IndexLayout
    context: SourceContext
    written: WrittenSets

    def place(self, parsed: Parsed) -> _Placed | Reused:
        """The file's parser version, as its source judges it now, and its record set's place;
        the record set itself when it is written already."""
        file = parsed.file
        version = judged_version(parsed, self.context)
        prefix = self.layout.record_set_prefix(version, file.snapshot.digest)
        place = Place(version, parsed.source.name, prefix)
        # Bytes kept before may have their record set written already (the same bytes under
        # another key, or a retry); bytes kept just now cannot.
        written = None if file.kept_now else self.written.get(prefix)
        if written is not None:
            return Reused(file, replace(place, registered=written.registered), written.summary)
        return _Placed(parsed, place)


def normalize(
    store: ObjectStore,
    settings: Settings,
    files: Sequence[Parsed | Failed],
    parts_dir: Path,
    offers: Offered | None = None,
) -> list[Prepared | Failed]:
    """Each file's parser version, and the record sets not written yet, built a source at a
    time: a batch of small files of one source pays its fixed cost once. A source that reads
    the index takes its files in order instead, each seeing the manifests of the files before it
    (a bundle of runs after the bundle of its manifests), its version judged then. What the
    batch's files offer each other (`offers`, a FlashInfer definition) is found first, in
    whichever order they come."""
    layout = IndexLayout.of(settings)
    known: KnownManifests = known_manifests(store, settings)
    named = offered_first(offered(files) if offers is None else offers, known.named)
    context = SourceContext(known_digest=known, manifest_named=named)
    kept_before = {
        f.file.snapshot.digest for f in files if isinstance(f, Parsed) and not f.file.kept_now
    }
    written = WrittenSets.of(store, settings, kept_before) if kept_before else WrittenSets()
    lookups = _Lookups(layout, context, written)

    done: dict[int, Prepared | Failed] = {}
    by_source: dict[str, list[tuple[int, Parsed]]] = {}
    for i, file in enumerate(files):
        if isinstance(file, Failed):
            done[i] = file
        else:
            by_source.setdefault(file.source.name, []).append((i, file))
    for group in by_source.values():
        parts = [[each] for each in group] if group[0][1].source.reads_index else [group]
        for part in parts:
            placed = each_file([parsed for _, parsed in part], lookups.place)
            to_build = [p for p in placed if isinstance(p, _Placed)]
            built = iter(build_record_sets(to_build, context, parts_dir))
            for (i, _), result in zip(part, placed, strict=True):
                prepared = next(built) if isinstance(result, _Placed) else result
                if isinstance(prepared, Normalized):  # what the files after it may name
                    known.learn(prepared.content.tables["manifests"])
                done[i] = prepared
    return [done[i] for i in range(len(files))]


def build_record_sets(
    group: Sequence[_Placed], context: SourceContext, parts_dir: Path
) -> list[Normalized | Failed]:
    """The record sets of a group of files of one source, in one call; if the call fails, each
    file on its own, so that the failure is the failing file's alone."""
    if not group:
        return []
    source = group[0].parsed.source
    objects = [
        SourceObject(f.snapshot.digest, f.data, utc_text(f.snapshot.last_modified))
        for f in (p.parsed.file for p in group)
    ]
    try:
        folder = Path(tempfile.mkdtemp(prefix="batch-", dir=parts_dir))
        contents = source.record_sets(objects, context, folder)
    except Exception as error:
        if len(group) == 1:
            return [Failed.of(group[0].entry, error)]
        return [result for p in group for result in build_record_sets([p], context, parts_dir)]
    return [
        Normalized(p.parsed.file, p.place, content)
        for p, content in zip(group, contents, strict=True)
    ]


# -- 5. write ------------------------------------------------------------------------------------


def write(
    store: ObjectStore, settings: Settings, files: Sequence[Prepared | Failed]
) -> list[Written | Failed]:
    """The record sets not written yet, then the batch's sets file: every file's record set
    summary and read, in one object written last, once the record objects are durable. Small
    sets share one object per table; a large one has objects of its own, and its failure is its
    file's alone."""
    layout = IndexLayout.of(settings)
    folder = batch_folder(layout)
    writers: dict[str, Normalized] = {}  # by record set: two keys of the same bytes, one set
    for file in files:
        if isinstance(file, Normalized):
            writers.setdefault(file.place.prefix, file)
    small = [prefix for prefix, file in writers.items() if is_small(file.content)]
    written: dict[str, dict[str, list[str]]] = {}  # prefix -> its objects, by table
    failures: dict[str, BaseException] = {}  # prefix -> why its objects are not written
    if small:
        try:
            shared = put_shared_objects(store, layout, folder, [writers[p].content for p in small])
        except Exception as error:  # S3 gave up: these files fail, and are retried
            failures |= dict.fromkeys(small, error)
        else:
            written |= dict(zip(small, shared, strict=True))
    own = [file for prefix, file in writers.items() if prefix not in small]
    put = each_file(own, lambda f: put_own_objects(store, layout, f.place.prefix, f.content))
    for file, put_own in zip(own, put, strict=True):
        if isinstance(put_own, Failed):
            failures[file.place.prefix] = put_own.error
        else:
            written[file.place.prefix] = put_own
    pause_point(RECORD_FILES_WRITTEN)

    sets_file = SetsFile(folder)
    results: list[Written | Failed] = []
    for file in files:
        if isinstance(file, Failed):
            results.append(file)
        elif file.place.prefix in failures:  # its objects (the same bytes' under another key)
            results.append(Failed.of(file.entry, failures[file.place.prefix]))
        else:
            wrote = isinstance(file, Normalized) and writers[file.place.prefix] is file
            objects = written[file.place.prefix] if wrote else None
            results.append(Written(file.entry, sets_file.add(file, objects)))
    try:
        key = sets_file.put(store, layout)
    except Exception as error:  # S3 gave up: the batch's files fail, and are retried
        return [Failed.of(r.entry, error) if isinstance(r, Written) else r for r in results]
    # Each row names its batch's sets file: what the next publish reads.
    return [
        Written(replace(r.entry, sets_file=key), r.records) if isinstance(r, Written) else r
        for r in results
    ]


# -- 6. commit -----------------------------------------------------------------------------------


def commit(
    store: ObjectStore, settings: Settings, batch: str, files: Sequence[Written | Failed]
) -> BatchResult:
    """The batch's ledger rows, in one append."""
    result = BatchResult(
        batch,
        [
            FileResult(done_entry(f.entry, f.records), f.records)
            if isinstance(f, Written)
            else FileResult(f.entry)
            for f in files
        ],
    )
    Ledger.of(store, settings).append([f.entry for f in result.files])
    return result
