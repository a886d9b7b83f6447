"""The ingest steps, plain Python, in the order a batch of dropped files takes them:

1. find what is new: the sensors, from the store's notifications and the ledger
   (pipelines/intake/);
2. snapshot: each file's GET and its immutable copy (`snapshot_file`);
3. normalize, through the file's source (`normalize_files`, pipelines/sources/);
4. write the batch's record objects, then its sets file, every file's summary and read
   (`write_files`);
5. commit each file's outcome to the ledger, one append for the batch (`process_batch`);
6. publish the index (`publish_resolving`).

A batch is committed to the ledger only once its record sets are durable: a crash before redoes
the batch, and a redone file finds its record set written (its sets file listed), or writes it
again in a batch of its own whose summary alone claims its rows, and adds no run twice. A crash
between the commit and the publish leaves record sets the index lacks, which the next publish
takes (the index catch-up sensor asks for one). `kindex ingest` takes steps 2-4 and 6 for files
on disk.
"""

from __future__ import annotations

import secrets
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, overload

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from pipelines.forked import usable_cpus, worker_context
from pipelines.index.bucket_format import RecordSet, SetsFileContent
from pipelines.index.faults import RECORD_FILES_WRITTEN, pause_point
from pipelines.index.known import awaiting_files, is_awaiting, known_manifests
from pipelines.index.layout import IndexLayout
from pipelines.index.listing import list_record_sets
from pipelines.index.local import PARQUET_CONTENT_TYPE, cache_bytes, cache_file, put_file
from pipelines.index.publish import IndexVersion, RecordObjects, publish_index
from pipelines.intake.incoming import upload_incoming
from pipelines.intake.ledger import FileEntry, FileState, Ledger, version_of
from pipelines.intake.snapshots import (
    SnapshotNotFound,
    VersionChanged,
    content_digest,
    list_reads,
    load_snapshot,
    put_by_snapshot,
    read_and_keep,
    read_snapshot,
    sets_file_reads,
)
from pipelines.records.manifests import first_schema_error
from pipelines.records.record_objects import (
    QUARANTINE_PREVIEW_COLUMNS,
    RECORD_FILES,
    SCHEMAS,
    SETS_FILE,
    PreviewRow,
    RecordSetContent,
    RecordSetSummary,
    object_names,
    parquet_bytes,
    preview,
    value_counts,
)
from pipelines.settings import Settings
from pipelines.sources import Source, SourceContext, source_of
from pipelines.sources.source import SourceObject
from pipelines.storage.base import NoSuchKey, ObjectInfo, ObjectStore
from pipelines.storage.s3 import S3Store, store_session

if TYPE_CHECKING:
    from pipelines.intake.snapshots import RegisteredReads, Snapshot, TakenSnapshot


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


SINGLE_PUT_LIMIT = 5 * 1024**3  # the largest object S3 takes in one PutObject


@overload
def utc_text(moment: datetime) -> str: ...
@overload
def utc_text(moment: None) -> None: ...
def utc_text(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def snapshot_data(store: ObjectStore, settings: Settings, snapshot: Snapshot) -> bytes:
    return read_snapshot(store, settings, snapshot)


@dataclass(slots=True)
class PreparedRecords:
    """A snapshot's bytes normalized: its record set's place, and its content; or the summary
    of the record set that exists already (then nothing was normalized)."""

    parser_version: str
    source: str
    prefix: str
    content: RecordSetContent | None
    existing: RecordSetSummary | None = None  # the summary of the record set written before
    registered: frozenset[str] = frozenset()  # the ids of the reads it has already


def process_snapshot(
    store: ObjectStore, settings: Settings, snapshot: Snapshot, taken: TakenSnapshot | None = None
) -> SnapshotRecords:
    """Normalize a snapshot's bytes and write its record objects (once per parser version):
    the batch steps over a batch of one, whose failure is raised. `taken`: the snapshot as this
    process just took it. Its bytes are not read again; if it kept them first, no record set of
    them can exist yet, and none is looked for."""
    work = snapshot_work(store, settings, snapshot, taken)
    with parts_folder(settings) as parts_dir:
        normalize_files(store, settings, [work], parts_dir)
        work.raise_failure()
        write_files(store, settings, [work])
        work.raise_failure()
    assert work.records is not None
    # Its ledger row names its sets file: what the next publish reads.
    Ledger.of(store, settings).append([work.result().entry])
    return work.records


def snapshot_work(
    store: ObjectStore, settings: Settings, snapshot: Snapshot, taken: TakenSnapshot | None = None
) -> FileWork:
    """A snapshot taken before, as a file of a batch past its snapshot step."""
    data = snapshot_data(store, settings, snapshot) if taken is None else taken.data
    entry = FileEntry.pending(store.bucket, known_info(snapshot))
    return FileWork(entry, snapshot, data, kept_now=taken is not None and taken.kept_now)


@contextmanager
def parts_folder(settings: Settings) -> Iterator[Path]:
    """An empty folder for the Parquet parts a source spools (a large file's runs), beside the
    local cache (on its file system): once uploaded, a part moves into the cache by a rename."""
    cache = IndexLayout.of(settings).cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".parts-", dir=cache) as folder:
        yield Path(folder)


def record_set_summary(
    snapshot: Snapshot, prepared: PreparedRecords, files: dict[str, list[str]]
) -> RecordSetSummary:
    """What the sets file says of a record set just written (`files`: its objects, by table)."""
    content = prepared.content
    assert content is not None
    quarantine, manifests = content.tables["quarantine"], content.tables["manifests"]
    return {
        "snapshot_digest": snapshot.digest,
        "parser_version": prepared.parser_version,
        "source": prepared.source,
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


UPLOAD_THREADS = 4
# A record set of at most this many source rows shares its batch's objects; a larger one has
# objects of its own, which a publish can take into the index as they are.
SHARED_ROWS_LIMIT = 100_000


def is_small(content: RecordSetContent) -> bool:
    return not content.parts and content.rows <= SHARED_ROWS_LIMIT


def batch_folder(layout: IndexLayout) -> str:
    """A new batch's folder for its shared objects and its sets file: named by when it was
    written (a prefix two batches wrote is the newest's), and unique."""
    written_at = f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    return f"{layout.batches_prefix}{written_at}-{secrets.token_hex(4)}/"


def put_shared_objects(
    store: ObjectStore, layout: IndexLayout, folder: str, contents: Sequence[RecordSetContent]
) -> list[dict[str, list[str]]]:
    """One object per table holding the rows of all these record sets (a batch's small files),
    written and cached; and, for each set, the keys its summary names, by table."""

    own_lineage = [c.tables["lineage"] for c in contents if not c.lineage_in_runs]
    tables = {
        name: pa.concat_tables([c.tables[name].cast(SCHEMAS[name]) for c in contents])
        for name in ("runs", "manifests", "quarantine")
    }
    if own_lineage:
        tables["lineage"] = pa.concat_tables([t.cast(SCHEMAS["lineage"]) for t in own_lineage])
    keys = {name: [folder + f"{name}.parquet"] if t.num_rows else [] for name, t in tables.items()}
    with ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="kindex-put") as puts:
        written = [
            puts.submit(_put_cached, store, layout, keys[name][0], parquet_bytes(table))
            for name, table in tables.items()
            if table.num_rows
        ]
        for put in written:
            put.result()
    lineage = keys.get("lineage", [])
    return [{**keys, "lineage": keys["runs"] if c.lineage_in_runs else lineage} for c in contents]


def put_own_objects(
    store: ObjectStore, layout: IndexLayout, prefix: str, content: RecordSetContent
) -> dict[str, list[str]]:
    """A large record set's objects in its own prefix, several at once (boto3 clients are
    thread-safe), parts first: those are encoded already, so they upload while the other tables
    are encoded. Parts are named by this write's attempt, which no other write makes. Each
    object is cached once uploaded. Returns the names the summary gives, by table."""
    attempt = secrets.token_hex(4)
    files = {
        name: object_names(
            name, len(content.parts[name]) if name in content.parts else None, attempt
        )
        for name in RECORD_FILES
        if not (name == "lineage" and content.lineage_in_runs)  # named below: in the runs
    }
    with ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="kindex-put") as puts:
        pending: list[Future[None]] = []
        for name, parts in content.parts.items():
            for key, part in zip([prefix + n for n in files[name]], parts, strict=True):
                pending.append(puts.submit(_put_part, store, key, part, layout.cached_path(key)))
        for name in [name for name in files if name not in content.parts]:
            data = parquet_bytes(content.tables[name])
            pending.append(puts.submit(_put_cached, store, layout, prefix + files[name][0], data))
        for future in pending:
            future.result()
    if content.lineage_in_runs:
        files["lineage"] = files["runs"]
    return files


def _put_cached(
    store: ObjectStore,
    layout: IndexLayout,
    key: str,
    data: bytes,
    content_type: str = PARQUET_CONTENT_TYPE,
) -> None:
    """PUT an object of a batch's record sets, then cache it: the publish that follows reads
    it."""
    store.put(key, data, content_type=content_type)
    cache_bytes(layout.cached_path(key), data)


def _put_part(store: ObjectStore, key: str, part: Path, cached: Path) -> None:
    """PUT a part, then move its file into the cache: it is named by its write's attempt, which
    no other write makes, so nothing else writes that cache entry."""
    put_file(store, key, part)
    cache_file(part, cached)


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


# A batch of at least this many files goes up from several processes, where there are CPUs for
# them: each small file is two requests, and botocore's work on each holds the GIL.
PROCESS_UPLOAD_FILES = 64


@contextmanager
def uploader(
    store: ObjectStore, settings: Settings
) -> Iterator[Callable[[Sequence[Path]], list[FileWork]]]:
    """How `kindex ingest` sends a batch of files up (`upload_files`): from this process, or
    split in order among one worker process per usable CPU (started with the first batch large
    enough). A worker makes the store again, with its own client: only a store that pickles
    (an S3Store) goes to one."""
    workers = usable_cpus() if isinstance(store, S3Store) else 1
    with ExitStack() as stack:
        pool: ProcessPoolExecutor | None = None

        def upload(paths: Sequence[Path]) -> list[FileWork]:
            nonlocal pool
            if workers < 2 or len(paths) < PROCESS_UPLOAD_FILES:
                return upload_files(store, settings, paths)
            if pool is None:
                context = worker_context(__name__)
                pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=context))
            size = -(-len(paths) // workers)
            chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
            parts = pool.map(upload_files, repeat(store), repeat(settings), chunks)
            return [work for part in parts for work in part]

        yield upload


def upload_files(store: ObjectStore, settings: Settings, paths: Sequence[Path]) -> list[FileWork]:
    """Steps 1-2 for files on disk, in order, from FILE_THREADS threads."""
    with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="kindex-upload") as pool:
        return list(pool.map(lambda path: uploaded_file(store, settings, path), paths))


def uploaded_file(store: ObjectStore, settings: Settings, path: Path) -> FileWork:
    """Upload a file to its incoming key and snapshot that version: the batch steps' first two
    for a file on disk. A file that fits one PUT is read once, and the bytes sent are the bytes
    hashed and parsed: they go up to the snapshot, and the incoming version is its copy on the
    server, so nothing is read back. A larger file streams up first and is read back."""

    if path.stat().st_size > SINGLE_PUT_LIMIT:
        info = upload_incoming(store, settings, path)
        taken = read_and_keep(store, settings, info.key, info.etag)
    else:
        data = path.read_bytes()
        taken = put_by_snapshot(store, settings, path, data, content_digest(data))
    entry = FileEntry.pending(store.bucket, known_info(taken.snapshot), batch=INGEST_BATCH)
    return FileWork(entry, taken.snapshot, taken.data, taken.kept_now)


INGEST_BATCH = "kindex-ingest"
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


def resolve_awaiting(
    store: ObjectStore, settings: Settings, batch: Sequence[SnapshotRecords] = ()
) -> list[SnapshotRecords]:
    """Process again the files whose rows wait for another file (a FlashInfer trace for its
    definition), of this batch and of the published index, now that more is indexed: a file
    whose record set comes out the same under what the index now holds is left as it is (its
    source's `version_of` says so without rebuilding it)."""

    waiting = {
        (f.snapshot_digest, f.source_key)
        for f in batch
        if any(is_awaiting(reason) for reason in f.quarantined_by_reason)
    }
    waiting.update(awaiting_files(store, settings))
    if not waiting:
        return []
    reads, registered = [], sets_file_reads(store, settings)
    for digest, key in sorted(waiting):
        with suppress(SnapshotNotFound):  # its read was lost with its batch: it is read again
            reads.append(load_snapshot(store, settings, digest, key, registered))
    works: dict[str, FileWork] = {}
    for snapshot in reads:  # one per content: the same bytes under two keys are one record set
        works.setdefault(snapshot.digest, snapshot_work(store, settings, snapshot))
    with parts_folder(settings) as parts_dir:
        normalize_files(store, settings, list(works.values()), parts_dir)
        # A file whose record set comes out the same under what the index holds now is left.
        changed = [work for work in works.values() if not work.written]
        for work in changed:
            work.raise_failure()
        write_files(store, settings, changed)
        for work in changed:
            work.raise_failure()
    results = [work.result() for work in changed]
    Ledger.of(store, settings).append([r.entry for r in results])  # their rows, new counts
    return [r.records for r in results if r.records is not None]


def publish_resolving(store: ObjectStore, settings: Settings) -> tuple[IndexVersion, int]:
    """Publish the index; then process again the files whose rows wait for what it now holds,
    and publish those too. Returns the version and how many files were resolved."""
    version = publish_index(store, settings)
    resolved = resolve_awaiting(store, settings)
    if resolved:
        version = publish_index(store, settings)
    return version, len(resolved)


def ingest_paths(
    paths: Sequence[Path | str],
    settings: Settings,
    progress: bool = True,
    store: ObjectStore | None = None,
) -> IngestSummary:
    """Upload each file to incoming/<name>, snapshot it, write its records, then publish."""
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
    with bar, uploader(store, settings) as upload:
        for batch in bounded_batches(sizes, [path.name for path in files]):
            bar.set_description(f"{files[batch[0]].name} and {len(batch) - 1} more")
            works = upload([files[i] for i in batch])
            with parts_folder(settings) as parts_dir:
                normalize_files(store, settings, works, parts_dir)
                write_files(store, settings, works)
            done += commit_and_publish(store, settings, INGEST_BATCH, works, publish=False).files
            bar.update(sum(sizes[i] for i in batch))
        records = [f.records for f in done if f.records is not None]
        # A file whose rows awaited another of the batch (a trace its definition) is listed
        # once, as it was processed again.
        resolved = {
            (r.source_key, r.snapshot_digest): r for r in resolve_awaiting(store, settings, records)
        }
        records = [resolved.pop((r.source_key, r.snapshot_digest), r) for r in records]
        records += resolved.values()
        bar.set_description("publishing index")
        index = publish_index(store, settings)
    failed = [f.entry for f in done if f.records is None]
    return IngestSummary(records, index, failed)


def runs_by_snapshot(
    store: ObjectStore,
    settings: Settings,
    records: Sequence[SnapshotRecords],
    columns: Sequence[str],
) -> dict[str, pa.Table]:
    """Columns of these record sets' runs, a table per snapshot digest, in source-line order:
    the rows each set claims of the objects it shares with its batch (`RecordObjects`, as a
    publish reads them), each object read once, from the local cache where writing the record
    set put it (from the bucket only when another process wrote it)."""

    wanted = dict.fromkeys([*columns, "snapshot_digest", "parser_version", "source_line"])
    schema = pa.schema([SCHEMAS["runs"].field(name) for name in wanted])
    sets = [r.record_set for r in records]
    objects = RecordObjects.fetch(store, IndexLayout.of(settings), sets, names=("runs",))
    if not objects.paths["runs"]:
        return {}
    con = duckdb.connect()
    try:
        runs = con.execute(
            f"SELECT * FROM ({objects.select('runs', schema)}) "
            "ORDER BY snapshot_digest, source_line"
        ).to_arrow_table()
    finally:
        con.close()
    by_snapshot: dict[str, pa.Table] = {}
    start = 0
    for counted in pc.value_counts(runs["snapshot_digest"]).to_pylist():  # in order of rows
        by_snapshot[counted["values"]] = runs.slice(start, counted["counts"])
        start += counted["counts"]
    return by_snapshot


# The schema check validates at most this many runs of a file (evenly spread over it): its cost
# stays flat however large the file.
SCHEMA_CHECKED_RUNS = 2000


@dataclass(slots=True)
class SchemaVerdict:
    checked: int
    of: int
    failures: list[str]


def schema_sample(manifests: pa.ChunkedArray) -> list[str]:
    """At most SCHEMA_CHECKED_RUNS of an Arrow column of manifests, evenly spread."""
    stride = max(1, -(-len(manifests) // SCHEMA_CHECKED_RUNS))
    return [str(m) for m in manifests.take(list(range(0, len(manifests), stride))).to_pylist()]


def schema_verdict(manifests: Sequence[str], limit: int = 10) -> SchemaVerdict:
    """Validate manifests (JSON texts) against their kernelindex schemas with a compiled
    validator (jsonschema-rs, the same JSON Schema 2020-12 verdicts as `jsonschema`); the
    failures' messages come from `pipelines.records.manifests.schema_errors`."""

    stride = max(1, -(-len(manifests) // SCHEMA_CHECKED_RUNS))
    chosen = manifests[::stride]
    failures: list[str] = []
    for text in chosen:
        manifest = orjson.loads(text)
        problem = first_schema_error(manifest)
        if problem is None:
            continue
        name = manifest.get("metadata", {}).get("name", "?")
        failures.append(f"{manifest.get('kind')} {name}: {problem[0]}: {problem[1]}")
        if len(failures) >= limit:
            break
    return SchemaVerdict(len(chosen), len(manifests), failures)


# -- a batch of dropped files -------------------------------------------------------------------

# A file costs a few small S3 requests, which wait on the network: several files at once.
FILE_THREADS = 8


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
    resolved: int = 0  # files whose rows awaited another file, processed again

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
            sum(r.resolved for r in results),
        )


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@dataclass(slots=True)
class FileWork:
    """One file of a batch on its way through the steps. `failed`: its ledger row, once a
    step failed it (or found it gone); the later steps pass it by."""

    entry: FileEntry
    snapshot: Snapshot | None = None
    data: bytes = b""
    kept_now: bool = False  # its bytes were kept just now: no record set of them can exist
    written: bool = False  # its record set exists: nothing to normalize or write
    source: Source | None = None
    prepared: PreparedRecords | None = None
    records: SnapshotRecords | None = None
    failed: FileEntry | None = None
    error: BaseException | None = None  # what failed it

    def fail(self, error: BaseException) -> None:
        self.error = error
        if isinstance(error, VersionChanged | NoSuchKey):
            reason = f"overwritten or deleted before it was read ({describe(error)})"
            self.failed = replace(self.entry, state=FileState.GONE, reason=reason, updated_at=None)
        else:
            self.failed = self.entry.failed(describe(error), datetime.now(UTC))

    @property
    def new_content(self) -> RecordSetContent:
        """The record set this file's bytes were normalized into, not written yet."""
        assert self.prepared is not None and self.prepared.content is not None
        return self.prepared.content

    def raise_failure(self) -> None:
        """Raise what failed this file, for a caller of one file that wants it raised."""
        if self.error is not None:
            raise self.error

    def result(self) -> FileResult:
        if self.failed is not None or self.records is None:
            return FileResult(self.failed or self.entry.failed("not processed", datetime.now(UTC)))
        return FileResult(done_entry(self.entry, self.records), self.records)


def process_batch(
    store: ObjectStore,
    settings: Settings,
    entries: Sequence[FileEntry],
    batch: str,
    *,
    publish: bool = True,
) -> BatchResult:
    """The steps over a batch of files, in order; one file's failure (its bytes, its key, an S3
    error) is its own ledger row, never its neighbours'."""

    files = [FileWork(replace(entry, batch=batch)) for entry in entries]
    # The batches' reads, listed once for the files the ledger says were read before.
    registered = (
        sets_file_reads(store, settings) if any(e.snapshot_digest for e in entries) else None
    )
    each_file(files, lambda work: snapshot_file(store, settings, work, registered))
    with parts_folder(settings) as parts_dir:
        normalize_files(store, settings, files, parts_dir)
        write_files(store, settings, files)
    return commit_and_publish(store, settings, batch, files, publish=publish)


def process_batches(
    store: ObjectStore, settings: Settings, entries: Sequence[FileEntry], batch: str
) -> Iterator[BatchResult]:
    """process_batch over files that may be more than a batch holds (a backfill of many
    windows, a glob): bounded batches, in order, named `batch` when there is one."""
    chunks = list(bounded_batches([entry.size for entry in entries]))
    for n, chunk in enumerate(chunks):
        name = batch if len(chunks) == 1 else f"{batch}-{n}"
        yield process_batch(store, settings, [entries[i] for i in chunk], name)


def commit_and_publish(
    store: ObjectStore, settings: Settings, batch: str, files: Sequence[FileWork], *, publish: bool
) -> BatchResult:
    """Steps 5 and 6: the batch's ledger rows in one append, then the index."""
    result = BatchResult(batch, [work.result() for work in files])
    Ledger.of(store, settings).append([f.entry for f in result.files])
    if publish and files:
        result.index, result.resolved = publish_resolving(store, settings)
    return result


def each_file(files: Sequence[FileWork], step: Callable[[FileWork], None]) -> None:
    """A step over each file not failed yet, on a few threads (a file's step is mostly small S3
    requests, which wait on the network); what a file's step raises fails that file alone."""

    def guarded(work: FileWork) -> None:
        try:
            step(work)
        except Exception as error:  # this file's alone; the others go on
            work.fail(error)

    todo = [work for work in files if work.failed is None]
    if len(todo) <= 1:
        for work in todo:
            guarded(work)
        return
    with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="kindex-file") as pool:
        for future in as_completed([pool.submit(guarded, work) for work in todo]):
            future.result()


def snapshot_file(
    store: ObjectStore,
    settings: Settings,
    work: FileWork,
    registered: Sequence[RegisteredReads] | None = None,
) -> None:
    """Step 2: the file's GET and its immutable copy (written once; its first read is recorded
    by the batch's sets file). A version processed before is not copied again: its read is
    loaded (`registered`: the batches' reads, as the batch listed them)."""

    entry = work.entry
    if entry.snapshot_digest is not None:
        known = [
            r
            for r in list_reads(store, settings, entry.key, registered)
            if r.digest == entry.snapshot_digest and version_of(known_info(r)) == entry.version
        ]
        if known:  # its newest read (another of the same version: a read by a concurrent batch)
            work.snapshot = known[-1]
            work.data = snapshot_data(store, settings, known[-1])
            return
    taken = read_and_keep(store, settings, entry.key, etag=entry.etag)
    work.snapshot, work.data, work.kept_now = taken.snapshot, taken.data, taken.kept_now


def normalize_files(
    store: ObjectStore, settings: Settings, files: Sequence[FileWork], parts_dir: Path
) -> None:
    """Step 3: each file's source and parser version, and the record sets not written yet,
    built a source at a time: a batch of small files of one source pays its fixed cost once.
    A source that reads the index takes its files in order instead, each seeing the manifests
    of the files before it (a bundle of runs after the bundle of their manifests, a trace after
    its definition), its version judged then."""
    layout = IndexLayout.of(settings)
    known = known_manifests(store, settings)
    context = SourceContext(known_digest=known, manifest_named=known.named)
    # Bytes kept before may have their record set written already (the same bytes under
    # another key, or a retry); bytes kept just now cannot.
    listing = None
    if any(work.failed is None and not work.kept_now for work in files):
        listing = list_record_sets(store, layout)

    def place(work: FileWork) -> None:
        assert work.snapshot is not None
        source = work.source or source_of(work.entry.key, work.data)
        version = source.version_of(work.data, source_context(context, work))
        if work.prepared is not None and work.prepared.parser_version == version:
            return
        prefix = layout.record_set_prefix(version, work.snapshot.digest)
        work.source = source
        work.prepared = PreparedRecords(version, source.name, prefix, None)
        if listing is not None and not work.kept_now and prefix in listing.summaries:
            [written] = listing.record_sets(store, layout, [prefix])
            work.prepared.existing = written.summary
            work.prepared.registered = frozenset(listing.reads.get(prefix, {}))
        work.written = work.prepared.existing is not None

    each_file(files, place)
    by_source: dict[str, list[FileWork]] = {}
    for work in files:
        if work.failed is None and work.source is not None:
            by_source.setdefault(work.source.name, []).append(work)
    for group in by_source.values():
        assert group[0].source is not None
        parts = [[w] for w in group] if group[0].source.reads_index else [group]
        for part in parts:
            if len(parts) > 1:
                each_file(part, place)  # what the files before it taught the index
            build_record_sets(
                [w for w in part if w.failed is None and not w.written], context, parts_dir
            )
            for work in part:
                if work.prepared is not None and work.prepared.content is not None:
                    known.learn(work.prepared.content.tables["manifests"])


def source_context(context: SourceContext, work: FileWork) -> SourceContext:
    assert work.snapshot is not None
    return replace(context, received_at=utc_text(work.snapshot.last_modified))


def build_record_sets(group: Sequence[FileWork], context: SourceContext, parts_dir: Path) -> None:
    """The record sets of a group of files of one source, in one call; if the call fails, each
    file on its own, so that the failure is the failing file's alone."""
    if not group:
        return
    source = group[0].source
    assert source is not None
    objects = [
        SourceObject(w.snapshot.digest, w.data, utc_text(w.snapshot.last_modified))
        for w in group
        if w.snapshot is not None
    ]
    try:
        folder = Path(tempfile.mkdtemp(prefix="batch-", dir=parts_dir))
        contents = source.record_sets(objects, context, folder)
    except Exception as error:
        if len(group) == 1:
            group[0].fail(error)
            return
        for work in group:  # each file on its own
            build_record_sets([work], context, parts_dir)
        return
    for work, content in zip(group, contents, strict=True):
        assert work.prepared is not None
        work.prepared.content = content


def write_files(store: ObjectStore, settings: Settings, files: Sequence[FileWork]) -> None:
    """Step 4: the record sets not written yet, then the batch's sets file: every file's record
    set summary and read, in one object written last, once the record objects are durable.
    Small sets share one object per table; a large one has objects of its own, and its failure
    is its file's alone."""
    layout = IndexLayout.of(settings)
    folder = batch_folder(layout)
    writers: dict[str, FileWork] = {}  # by record set: two keys of the same bytes, one set
    for work in files:
        if work.failed is None and work.prepared is not None and work.prepared.content:
            writers.setdefault(work.prepared.prefix, work)
    contents = {prefix: work.new_content for prefix, work in writers.items()}
    small = [prefix for prefix, content in contents.items() if is_small(content)]
    written: dict[str, dict[str, list[str]]] = {}  # prefix -> its objects, by table
    if small:
        try:
            shared = put_shared_objects(store, layout, folder, [contents[p] for p in small])
        except Exception as error:  # S3 gave up: these files fail, and are retried
            for prefix in small:
                writers[prefix].fail(error)
        else:
            written |= dict(zip(small, shared, strict=True))

    def put_own(work: FileWork) -> None:
        assert work.prepared is not None
        prefix = work.prepared.prefix
        written[prefix] = put_own_objects(store, layout, prefix, contents[prefix])

    each_file([work for prefix, work in writers.items() if prefix not in small], put_own)
    pause_point(RECORD_FILES_WRITTEN)
    sets_file = SetsFile(folder)
    for work in files:
        if work.failed is None and work.prepared is not None:
            writer = writers.get(work.prepared.prefix, work)
            if writer.error is not None:  # the same bytes under another key failed
                work.fail(writer.error)
            else:
                sets_file.add(work, written.get(work.prepared.prefix), writer is work)
    try:
        sets_file.put(store, layout)
    except Exception as error:  # S3 gave up: the batch's files fail, and are retried
        for work in sets_file.files:
            work.fail(error)
    for work in files:  # nothing after reads the bytes or the built tables again
        work.data = b""
        if work.prepared is not None:
            work.prepared.content = None


@dataclass(slots=True)
class SetsFile:
    """A batch's record set summaries and reads, as they go into its sets file."""

    folder: str
    summaries: dict[str, RecordSetSummary] = field(default_factory=dict)  # by prefix
    reads: list[orjson.Fragment] = field(default_factory=list)
    files: list[FileWork] = field(default_factory=list)

    def add(self, work: FileWork, objects: dict[str, list[str]] | None, writer: bool) -> None:
        """A file's read, and its record set's summary: new when `objects` were just written
        (`writer`: this file wrote them; another key of the same bytes finds them), else the
        one written before."""
        prepared, snapshot = work.prepared, work.snapshot
        assert prepared is not None and snapshot is not None
        if objects is None:
            assert prepared.existing is not None
            summary, reused = prepared.existing, True
        elif writer:
            summary, reused = record_set_summary(snapshot, prepared, objects), False
            self.summaries[prepared.prefix] = summary
        else:
            summary, reused = self.summaries[prepared.prefix], True
        read = snapshot.registered(prepared.parser_version, prepared.source)
        if read.read_id not in prepared.registered:  # else the same version, processed again
            entry = b'{"prefix":%s,"read":%s}' % (orjson.dumps(prepared.prefix), read.to_json())
            self.reads.append(orjson.Fragment(entry))
        self.files.append(work)
        work.records = records_from_summary(summary, snapshot.key, prepared.prefix, reused=reused)

    def put(self, store: ObjectStore, layout: IndexLayout) -> None:
        """Write the sets file, then name it in each of its files' ledger rows. It carries the
        summary of every record set its files name, those written before too: a publish reads
        only the sets files of the ledger rows committed since its version."""
        if not self.summaries and not self.reads:
            return
        key = self.folder + SETS_FILE
        summaries = dict(self.summaries)
        for work in self.files:
            prepared = work.prepared
            if prepared is not None and prepared.existing is not None:
                summaries.setdefault(prepared.prefix, prepared.existing)
        data = SetsFileContent.dumps(summaries, self.reads)
        _put_cached(store, layout, key, data, content_type="application/json")
        for work in self.files:
            work.entry = replace(work.entry, sets_file=key)


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


def known_info(snapshot: Snapshot) -> ObjectInfo:
    return ObjectInfo(
        snapshot.key, snapshot.etag, snapshot.size, snapshot.last_modified, snapshot.version_id
    )
