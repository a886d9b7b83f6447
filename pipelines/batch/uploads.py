"""What a batch sends up: its record objects (a batch's small record sets share one object per
table; a large one has objects of its own), each cached once uploaded, and, for `kindex ingest`,
the files on disk themselves."""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path

import pyarrow as pa

from pipelines.batch.stages import Snapshotted, known_info
from pipelines.forked import usable_cpus, worker_context
from pipelines.index.layout import IndexLayout
from pipelines.index.local import PARQUET_CONTENT_TYPE, cache_bytes, cache_file, put_file
from pipelines.intake.incoming import upload_incoming
from pipelines.intake.ledger import FileEntry
from pipelines.intake.snapshots import content_digest, put_by_snapshot, read_and_keep
from pipelines.records.record_objects import (
    RECORD_FILES,
    SCHEMAS,
    RecordSetContent,
    object_names,
    parquet_bytes,
)
from pipelines.settings import Settings
from pipelines.storage.base import ObjectStore
from pipelines.storage.s3 import S3Store

SINGLE_PUT_LIMIT = 5 * 1024**3  # the largest object S3 takes in one PutObject
UPLOAD_THREADS = 4
# A file costs a few small S3 requests, which wait on the network: several files at once.
FILE_THREADS = 8
# A record set of at most this many source rows shares its batch's objects; a larger one has
# objects of its own, which a publish can take into the index as they are.
SHARED_ROWS_LIMIT = 100_000


@contextmanager
def parts_folder(settings: Settings) -> Iterator[Path]:
    """An empty folder for the Parquet parts a source spools (a large file's runs), beside the
    local cache (on its file system): once uploaded, a part moves into the cache by a rename."""
    cache = IndexLayout.of(settings).cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".parts-", dir=cache) as folder:
        yield Path(folder)


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


# A batch of at least this many files goes up from several processes, where there are CPUs for
# them: each small file is two requests, and botocore's work on each holds the GIL.
PROCESS_UPLOAD_FILES = 64
INGEST_BATCH = "kindex-ingest"


@contextmanager
def uploader(
    store: ObjectStore, settings: Settings
) -> Iterator[Callable[[Sequence[Path]], list[Snapshotted]]]:
    """How `kindex ingest` sends a batch of files up (`upload_files`): from this process, or
    split in order among one worker process per usable CPU (started with the first batch large
    enough). A worker makes the store again, with its own client: only a store that pickles
    (an S3Store) goes to one."""
    workers = usable_cpus() if isinstance(store, S3Store) else 1
    with ExitStack() as stack:
        pool: ProcessPoolExecutor | None = None

        def upload(paths: Sequence[Path]) -> list[Snapshotted]:
            nonlocal pool
            if workers < 2 or len(paths) < PROCESS_UPLOAD_FILES:
                return upload_files(store, settings, paths)
            if pool is None:
                context = worker_context(__name__)
                pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=context))
            size = -(-len(paths) // workers)
            chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
            parts = pool.map(upload_files, repeat(store), repeat(settings), chunks)
            return [file for part in parts for file in part]

        yield upload


def upload_files(
    store: ObjectStore, settings: Settings, paths: Sequence[Path]
) -> list[Snapshotted]:
    """The first two steps (find, snapshot) for files on disk, in order, from FILE_THREADS
    threads."""
    with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="kindex-upload") as pool:
        return list(pool.map(lambda path: uploaded_file(store, settings, path), paths))


def uploaded_file(store: ObjectStore, settings: Settings, path: Path) -> Snapshotted:
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
    return Snapshotted(entry, taken.snapshot, taken.data, taken.kept_now)
