"""A large Liger CSV normalized on every core, its outcomes still in input order.

The file's data lines are cut into segments of about SEGMENT_BYTES at line ends. Worker w of N
(processes: pipelines/forked.py) normalizes segments w, w+N, w+2N…
(pipelines/sources/liger/columnar.py),
reading them from the file itself (or, forked from an ingest, from the bytes it holds): with
Arrow's CSV parser when every line of the segment is a plain RFC 4180 record
(read.record_columns), else with the streaming reader. Then a token goes
round the ring of workers in segment order; whoever holds it:

- learns where its segment really starts: a record of the previous segment may run past the cut
  (a quoted field across lines), and then the segment is read again from where that record ended;
- learns which externalIds the segments since its own last one showed first (16-byte digests),
  so a duplicate is judged against the whole file so far, as the serial path judges it;
- writes its lines to the shared output (or counts them), and passes the token on.

For `kindex normalize`, nothing but the token crosses processes: the lines go straight from each
worker to the output (their parts built before the token came). For an ingest, each worker
builds its segments' record tables (pipelines/sources/liger/tables.py): it encodes the runs itself
into
Parquet parts of the record set (whose lineage is those parts' columns), and writes the
manifests and quarantine rows as Arrow IPC files, which the parent maps and merges in segment
order.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import mmap
import multiprocessing
import os
import queue
import shutil
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import compress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.curation import load
from pipelines.forked import (
    WorkerContext,
    collect_garbage_rarely,
    default_signals,
    reuse_freed_memory,
    stop,
    usable_cpus,
    worker_context,
)
from pipelines.index.record_objects import (
    ROW_GROUP_ROWS,
    SCHEMAS,
    PartFacts,
    RecordSetContent,
    parquet_options,
)
from pipelines.intake.seen_keys import SeenKeys, digests_of
from pipelines.sources.liger.columnar import (
    Batch,
    count_outcomes,
    external_ids,
    normalize_batch,
    prepare_lines,
    quarantine_repeats,
    utf8_slices,
    write_json_lines_to,
)
from pipelines.sources.liger.normalize import Layout, Normalizer, shared_normalizer
from pipelines.sources.liger.read import (
    CsvRecord,
    RecordColumns,
    open_liger_csv,
    record_columns,
    segment_records,
)
from pipelines.sources.liger.tables import NAMES, BatchTables, FileTables, batch_tables

SEGMENT_BYTES = 4 << 20  # ~16,000 Liger rows: per-batch costs fade, memory stays ~100 MB per worker
PARALLEL_MIN_BYTES = 8 << 20  # below this, forking costs more than it saves
PIPE_BYTES = 1 << 20  # a token must not block its sender (F_SETPIPE_SZ)
BROKEN_PIPE = 3  # a worker's exit status when the output was closed (`| head`)
DONE, TABLES = "done", "tables"  # a worker's messages: its end, or one segment's tables


@dataclass(frozen=True, slots=True)
class Segment:
    start: int  # byte offset of its first line
    end: int  # byte offset after its last line
    line: int  # the file line number of its first line


@dataclass(frozen=True, slots=True)
class Token:
    start: int  # where the segment's first record really starts
    line: int
    recent: tuple[bytes, ...]  # first-seen externalId digests of the last N-1 segments
    snapshot_digest: str  # of the bytes read, for the tables: known once the workers run


def worth_relay(size: int) -> bool:
    """Whether a file of `size` bytes is normalized faster on every core than on one."""
    return usable_cpus() >= 2 and size >= PARALLEL_MIN_BYTES


def segments_of(
    stream: io.BufferedIOBase, segment_bytes: int = SEGMENT_BYTES
) -> tuple[tuple[str, ...], list[Segment]]:
    """The header's columns and the data segments of a file open from its start. Raises
    NotLigerCsv."""
    header = stream.readline()
    columns = open_liger_csv([header]).columns
    size = stream.seek(0, os.SEEK_END)
    buffer = bytearray(1 << 20)  # one buffer for every read: no fresh memory to fault in
    segments = []
    start, line = len(header), 2
    while start < size:
        stream.seek(start + segment_bytes)
        stream.readline()  # on to the next line end
        end = min(stream.tell(), size)
        segments.append(Segment(start, end, line))
        stream.seek(start)
        line += _count_lines(stream, end - start, buffer)
        start = end
    return columns, segments


NEWLINE = ord("\n")


def _count_lines(stream: io.BufferedIOBase, length: int, buffer: bytearray) -> int:
    """The line ends in the next `length` bytes of the stream, read into `buffer`."""
    lines = 0
    while length > 0:
        read = stream.readinto(memoryview(buffer)[: min(length, len(buffer))])
        if not read:
            break
        data = np.frombuffer(buffer, dtype=np.uint8, count=read)
        lines += int(np.count_nonzero(data == NEWLINE))
        length -= read
    return lines


def normalize_file(
    path: Path,
    out: BinaryIO | None,
    workers: int | None = None,
    segment_bytes: int | None = None,
) -> Counter[str]:
    """Write the file's `kindex normalize` lines to `out` (or, when None, only count them):
    returns counts by "ok:<metric>" and "quarantined:<reason>"."""
    if out is not None:
        out.flush()
    fd = out.fileno() if out is not None else None
    # Lines go straight to the caller's file descriptor, which only a forked child shares.
    context = worker_context(__name__) if fd is None else multiprocessing.get_context("fork")
    # No tables: the tokens carry no snapshot digest, and nothing stops the workers early.
    counts = _run(
        Input(FileInput(path), context),
        Sink(fd, None),
        workers,
        segment_bytes,
        lambda i, t: None,
        lambda: "",
    )
    assert counts is not None
    return counts


# The snapshot digest of the bytes a relay reads, or a function giving it (or None: build
# nothing) once the workers run, so that hashing the bytes (0.15 s for 1M rows) and what else
# the caller does then (checking whether the record set exists) overlap their first segments.
SnapshotDigest = str | Callable[[], str | None]


def record_set_file(
    csv: Path | bytes,
    snapshot_digest: SnapshotDigest,
    parser_version: str,
    workers: int | None = None,
    segment_bytes: int | None = None,
    *,
    parts_dir: Path,
) -> RecordSetContent | None:
    """The record set of a file (its path, or its bytes held in memory), with the tables
    tables.record_tables builds on one core; None when `snapshot_digest`, a function, gave None.

    Runs (a row per CSV row) are encoded by the workers themselves: each writes a Parquet part
    into `parts_dir` (an empty folder, which the caller keeps until it has used them: an ingest
    moves them into its cache), a row group per few segments, so the encoding runs on every core.
    Their rows are the serial table's rows, in another order (by worker, then segment): a run is
    unique within a file without merging, as its digest covers its externalId, which a
    duplicate check makes unique.
    The lineage table is not written apart: its rows are the runs' own (snapshot, parser, line,
    digest), read from the runs parts. Manifests (one row per distinct record, kept at its first
    row) and quarantine rows are spooled by each worker as Arrow IPC files, which this process
    maps and merges in segment order. A `snapshot_digest` function is called once the workers
    run: it may start threads (threads started before would make them start from a
    forkserver, slower).

    Forked workers read bytes where this process holds them (a fork shares its memory, copied
    only on write); workers from a forkserver (this process runs threads) need a file, so the
    bytes are written to a temporary one first (in shared memory where it has room)."""
    context = worker_context(__name__)
    if isinstance(csv, Path):
        source, size = Input(FileInput(csv), context), csv.stat().st_size
    elif isinstance(context, multiprocessing.context.ForkContext):
        source, size = Input(lambda: io.BytesIO(csv), context), len(csv)  # shares, copies nothing
    else:
        with tempfile.TemporaryDirectory(
            prefix="kindex-ingest-", dir=_spool_dir(len(csv))
        ) as workdir:
            path = Path(workdir) / "snapshot.csv"
            path.write_bytes(csv)
            return record_set_file(
                path, snapshot_digest, parser_version, workers, segment_bytes, parts_dir=parts_dir
            )
    digest = snapshot_digest if callable(snapshot_digest) else lambda: snapshot_digest
    return _record_set(source, size, digest, parser_version, workers, segment_bytes, parts_dir)


def _record_set(
    source: Input,
    size: int,
    snapshot_digest: Callable[[], str | None],
    parser_version: str,
    workers: int | None,
    segment_bytes: int | None,
    parts_dir: Path,
) -> RecordSetContent | None:
    kept = tuple(name for name in BUILT if name not in ENCODED)
    merged = InOrder(FileTables(names=kept))
    spool_dir = _spool_dir(size * SPOOL_BYTES_PER_CSV_BYTE)
    with tempfile.TemporaryDirectory(prefix="kindex-tables-", dir=spool_dir) as spool:
        job = Job(parser_version, Path(spool), parts_dir)
        sink = Sink(None, job)
        if _run(source, sink, workers, segment_bytes, merged.add, snapshot_digest) is None:
            return None
    parts = {name: sorted(parts_dir.glob(f"{name}-*.parquet")) for name in ENCODED}
    return RecordSetContent(
        merged.tables.rows, merged.tables.tables(), parts, merged.facts, lineage_in_runs=True
    )


# Record tables take ~10 bytes per byte of a Liger CSV (a run's manifest alone is ~1.2 KB).
SPOOL_BYTES_PER_CSV_BYTE = 16
SHARED_MEMORY = Path("/dev/shm")


def _spool_dir(needed: int) -> str | None:
    """Where to write `needed` bytes of temporary files (spooled tables, or the bytes workers from
    a forkserver read): shared memory when it has room (writing there is ~3x cheaper than to a
    disk's page cache: no journal, no writeback), else the temporary directory."""
    try:
        roomy = SHARED_MEMORY.is_dir() and shutil.disk_usage(SHARED_MEMORY).free >= needed
    except OSError:
        return None
    return str(SHARED_MEMORY) if roomy and os.access(SHARED_MEMORY, os.W_OK) else None


ENCODED = ("runs",)  # the tables workers write as Parquet parts themselves
PART_GROUP_ROWS = 60_000  # ~4 segments; kept until written: ~80 MB more at a worker's peak
# The tables workers build: not the lineage, as a run's lineage row is its own (snapshot, line),
# which its runs part holds (record_objects.RecordSetContent.lineage_in_runs).
BUILT = tuple(name for name in NAMES if name != "lineage")


@dataclass(frozen=True, slots=True)
class Job:
    """Record tables to build: by which parser, spooled where, with their Parquet parts where
    (of which snapshot: the tokens say)."""

    parser_version: str
    spool: Path
    parts: Path


class PartWriters:
    """A worker's Parquet part of each ENCODED table, `<table>-<worker>.parquet` in the job's
    parts folder: a row group per PART_GROUP_ROWS rows or so (a few segments: each row group
    costs its ~55 columns a fixed share, and readers scan few large ones faster). Opened at
    once, so every worker leaves a part."""

    def __init__(self, job: Job, worker: int) -> None:
        self.job = job
        self.writers = {
            name: pq.ParquetWriter(
                str(job.parts / f"{name}-{worker:03d}.parquet"),
                SCHEMAS[name],
                **parquet_options(SCHEMAS[name]),
            )
            for name in ENCODED
        }
        self.waiting: dict[str, list[pa.Table]] = {name: [] for name in ENCODED}

    def write(self, tables: BatchTables) -> tuple[BatchTables, PartFacts]:
        """Write the segment's ENCODED tables (once they fill a row group): the rest of them,
        and the facts of those."""
        encoded = {name: tables.tables[name] for name in ENCODED}
        for name, table in encoded.items():
            self.waiting[name].append(table)
            if sum(t.num_rows for t in self.waiting[name]) >= PART_GROUP_ROWS:
                self._flush(name)
        rest = {name: t for name, t in tables.tables.items() if name not in ENCODED}
        return BatchTables(tables.rows, rest), PartFacts.of(encoded)

    def _flush(self, name: str) -> None:
        if self.waiting[name]:
            table = pa.concat_tables(self.waiting[name])
            self.writers[name].write_table(table, row_group_size=ROW_GROUP_ROWS)
            self.waiting[name] = []

    def close(self) -> None:
        for name, writer in self.writers.items():
            self._flush(name)
            writer.close()

    def __enter__(self) -> PartWriters:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _part_writers(job: Job | None, worker: int) -> PartWriters | contextlib.nullcontext[None]:
    """A worker's part writers when it builds record tables (closed on leaving)."""
    return PartWriters(job, worker) if job is not None else contextlib.nullcontext()


# A segment's rows read, the file of each spooled table, and the facts of its encoded ones.
Spooled = tuple[int, dict[str, Path], PartFacts]


def spool_tables(tables: BatchTables, folder: Path, index: int, facts: PartFacts) -> Spooled:
    """Write a segment's tables as Arrow IPC files."""
    files = {}
    for name, table in tables.tables.items():
        files[name] = folder / f"{index:08d}-{name}.arrow"
        with pa.OSFile(str(files[name]), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
            out.write_table(table)
    return tables.rows, files, facts


def unspool_tables(rows: int, files: dict[str, Path]) -> BatchTables:
    """A segment's tables back from their files, memory-mapped (not copied)."""
    return BatchTables(rows, {name: _mapped_table(path) for name, path in files.items()})


def _mapped_table(path: Path) -> pa.Table:
    """An Arrow IPC file's table, its buffers in a map of the file. On Linux the map is filled
    at once (MAP_POPULATE), while the workers still run: faulting pages in one by one later, on
    first touch, cost more (merging a 1M-row file's tables: 0.25 -> 0.18 s of CPU)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if not populate:
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    with path.open("rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
    return pa.ipc.open_file(pa.py_buffer(mapped)).read_all()


@dataclass(slots=True)
class InOrder:
    """Segments' tables and facts merged in segment order, whatever order they arrive in."""

    tables: FileTables
    facts: PartFacts = field(default_factory=PartFacts)
    merged: int = 0
    waiting: dict[int, tuple[BatchTables, PartFacts]] = field(default_factory=dict)

    def add(self, index: int, spooled: Spooled) -> None:
        rows, files, facts = spooled
        self.waiting[index] = unspool_tables(rows, files), facts
        while self.merged in self.waiting:
            tables, facts = self.waiting.pop(self.merged)
            self.tables.merge(tables)
            self.facts.add(facts)
            self.merged += 1


@dataclass(frozen=True, slots=True)
class Sink:
    """Where a worker's segments go: JSON lines to a file descriptor, in order (fd), or record
    tables to the parent (job); or only counted."""

    fd: int | None
    job: Job | None


@dataclass(frozen=True, slots=True)
class Input:
    """The CSV the workers read: how each opens it, and how they start (a forked worker may
    open what this process holds in memory; others need a file)."""

    opener: Callable[[], io.BufferedIOBase]  # picklable unless the context forks
    context: WorkerContext


@dataclass(frozen=True, slots=True)
class FileInput:
    """Opens a file for reading (picklable, for workers from a forkserver)."""

    path: Path

    def __call__(self) -> io.BufferedIOBase:
        return self.path.open("rb")


def _run(
    source: Input,
    sink: Sink,
    workers: int | None,
    segment_bytes: int | None,
    on_tables: Callable[[int, Spooled], None],
    snapshot_digest: Callable[[], str | None],
) -> Counter[str] | None:
    """Run the workers: their counts, or None when `snapshot_digest` (called once they run)
    gave None, and they were stopped."""
    with source.opener() as stream:
        columns, segments = segments_of(stream, segment_bytes or SEGMENT_BYTES)
    count = min(workers or usable_cpus(), max(len(segments), 1))
    load()  # read the curation once, before forking
    context = source.context
    pipes = [context.Pipe(duplex=False) for _ in range(count)]
    for _, sender in pipes:
        if hasattr(fcntl, "F_SETPIPE_SZ"):  # Linux; elsewhere a token may wait for its reader
            fcntl.fcntl(sender.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    results = context.Queue()
    processes = [
        context.Process(
            target=_worker,
            args=(
                w,
                count,
                source.opener,
                columns,
                segments,
                sink,
                pipes[w][0],
                pipes[(w + 1) % count][1],
                results,
            ),
        )
        for w in range(count)
    ]
    for process in processes:
        process.start()
    try:
        digest = snapshot_digest()
        if digest is None:
            return None
        if segments:
            pipes[0][1].send(Token(segments[0].start, segments[0].line, (), digest))
        return _collect(results, processes, on_tables)
    finally:
        stop(processes)


def _collect(
    results: Any, processes: list[Any], on_tables: Callable[[int, Spooled], None]
) -> Counter[str]:
    counts: Counter[str] = Counter()
    reported = 0
    while reported < len(processes):
        try:
            kind, status, partial = results.get(timeout=1)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a normalize worker died") from None
            continue
        if kind == TABLES:
            on_tables(status, partial)
            continue
        reported += 1
        if status == BROKEN_PIPE:
            raise BrokenPipeError
        if status != 0:
            raise RuntimeError(f"a normalize worker failed:\n{partial}")
        counts.update(partial)
    return counts


def _worker(
    w: int,
    count: int,
    open_input: Callable[[], io.BufferedIOBase],
    columns: tuple[str, ...],
    segments: list[Segment],
    sink: Sink,
    receive: Connection,
    send: Connection,
    results: Any,
) -> None:
    default_signals()
    collect_garbage_rarely()
    reuse_freed_memory()
    counts: Counter[str] = Counter()
    layout = Layout.of(columns)
    try:
        with open_input() as stream, _part_writers(sink.job, w) as parts:
            _relay(w, count, stream, layout, segments, sink, receive, send, results, counts, parts)
        results.put((DONE, 0, counts))
    except BrokenPipeError:
        results.put((DONE, BROKEN_PIPE, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the command
        results.put((DONE, 1, traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # no atexit handlers or stdio flushes of the parent's state


def _relay(
    w: int,
    count: int,
    stream: io.BufferedIOBase,
    layout: Layout,
    segments: list[Segment],
    sink: Sink,
    receive: Connection,
    send: Connection,
    results: Any,
    counts: Counter[str],
    parts: PartWriters | None,
) -> None:
    normalizer = shared_normalizer()
    seen = SeenKeys()
    for index in range(w, len(segments), count):
        segment = segments[index]
        prepared = _prepare(stream, segment.start, segment.end, segment.line, layout, normalizer)
        if sink.fd is not None:  # the lines' parts, built before waiting for the turn to write
            prepare_lines(prepared.batch)
        token: Token = receive.recv()
        for digests in token.recent:
            seen.add_digests(digests)
        if token.start != segment.start:  # the previous segment's last record ran into this one
            start = max(token.start, segment.start)
            prepared = _prepare(
                stream, start, max(start, segment.end), token.line, layout, normalizer
            )
        first = seen.first_times_of_digests(prepared.digests)
        quarantine_repeats(
            prepared.batch, prepared.records, prepared.positions, prepared.ids, first
        )
        if sink.fd is not None:
            write_json_lines_to(sink.fd, prepared.batch)
        if index + 1 < len(segments):
            mine = b"".join(compress(prepared.digests, first))
            recent = (*token.recent, mine)[-(count - 1) :] if count > 1 else ()
            send.send(Token(prepared.end, prepared.next_line, recent, token.snapshot_digest))
        # Counts and tables are built after the token went on: they need no order here. An
        # ingest counts from its tables (PartFacts), not from these.
        if parts is None:
            count_outcomes(prepared.batch, counts)
        else:
            job = parts.job
            tables = batch_tables(prepared.batch, token.snapshot_digest, job.parser_version, BUILT)
            rest, facts = parts.write(tables)
            results.put((TABLES, index, spool_tables(rest, job.spool, index, facts)))


@dataclass(slots=True)
class _Prepared:
    batch: Batch
    records: list[CsvRecord] | RecordColumns
    positions: list[int]
    ids: pa.Array  # externalIds
    digests: list[bytes]
    end: int  # where the next record starts
    next_line: int


def _prepare(
    stream: io.BufferedIOBase,
    start: int,
    end: int,
    line: int,
    layout: Layout,
    normalizer: Normalizer,
) -> _Prepared:
    stream.seek(start)
    data = stream.read(end - start)
    records: list[CsvRecord] | RecordColumns | None = record_columns(data, line, layout.width)
    taken: list[bytes] = []  # lines after the segment that its last record took
    if records is not None:  # every line is a whole record: Arrow read them
        next_line = line + len(records)
    else:
        lines = list(io.BytesIO(data))  # split at "\n" only, as files are
        stream.seek(end)
        records, taken = segment_records(lines, line, _lines_after(stream))
        next_line = line + len(lines) + len(taken)
    batch = normalize_batch(records, layout, normalizer)
    positions, ids = external_ids(batch)
    return _Prepared(
        batch,
        records,
        positions,
        ids,
        digests_of(utf8_slices(ids)),
        end + sum(len(t) for t in taken),
        next_line,
    )


def _lines_after(stream: io.BufferedIOBase) -> Iterator[bytes]:
    yield from iter(stream.readline, b"")
