"""The Liger source's entry points: a CSV's outcomes, one per row (`kindex normalize`, a dry
run), and its record set; several files' record sets on every core.

A file is read batch by batch (pipelines/sources/liger/columnar.py). Real Liger files are small
and many: ingest reads a batch run's files together, a batch holding many files' rows, so that
they share a batch's fixed cost; past PARALLEL_FROM_BYTES, runs of files go to the processes of
a ProcessPoolExecutor. `kindex normalize` of one large file cuts it into parts instead, each a run
of batches on that same path in a process of its own (`write_outcomes`); a small file is one
part, in this process.
"""

from __future__ import annotations

import errno
import io
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson

from pipelines.forked import usable_cpus, worker_context
from pipelines.records import RowOutcome
from pipelines.records.record_objects import RecordSetContent
from pipelines.records.rules import Reason
from pipelines.sources.liger.columnar import (
    BATCH_ROWS,
    batch_outcomes,
    batches_of,
    count_outcomes,
    duplicate,
    normalized_batches,
    write_json_lines,
)
from pipelines.sources.liger.model import (
    PARSER_VERSION,
    Normalizer,
    parser_version,
    shared_normalizer,
)
from pipelines.sources.liger.read import NotLigerCsv, open_liger_csv
from pipelines.sources.liger.tables import FilesTables, files_record_tables
from pipelines.sources.seen_keys import SeenKeys

__all__ = [
    "PARSER_VERSION",
    "NotLigerCsv",
    "normalize_bytes",
    "normalize_lines",
    "parser_version",
    "record_set",
    "record_sets",
    "write_outcomes",
]


def normalize_lines(
    lines: Iterable[bytes], normalizer: Normalizer | None = None
) -> Iterator[RowOutcome]:
    """Normalize a Liger CSV given as binary lines (e.g. a file opened "rb"): streams, in
    batches, one outcome per row. Raises NotLigerCsv before yielding anything when the header
    is not Liger's."""
    batches = normalized_batches(lines, normalizer)
    return (outcome for batch in batches for outcome in batch_outcomes(batch))


def normalize_bytes(data: bytes, normalizer: Normalizer | None = None) -> Iterator[RowOutcome]:
    return normalize_lines(io.BytesIO(data), normalizer)


def record_set(data: bytes, snapshot_digest: str, parser_version: str) -> RecordSetContent:
    """A Liger CSV's record tables; raises NotLigerCsv."""
    return _contents([(data, snapshot_digest)], parser_version)[0]


PARALLEL_FROM_BYTES = 8 << 20


def record_sets(files: Sequence[tuple[bytes, str]], parser_version: str) -> list[RecordSetContent]:
    """The record sets of several (bytes, snapshot digest), in their order, each as record_set
    makes it alone; raises the first file's NotLigerCsv, if any. Small files are read together,
    in runs of batches that hold many files (`files_record_tables`); past PARALLEL_FROM_BYTES,
    runs of files are spread over every core the files can use."""
    datas = [data for data, _ in files]
    chunks = _chunks(datas, usable_cpus())
    # Worker processes cost more to start and feed than small files cost to normalize.
    if len(chunks) < 2 or sum(map(len, datas)) < PARALLEL_FROM_BYTES:
        return _contents(files, parser_version)
    context = worker_context(__name__)
    with ProcessPoolExecutor(min(len(chunks), usable_cpus()), mp_context=context) as pool:
        cut = [files[start:end] for start, end in chunks]
        # Each process hands back its files' tables whole: a slice of a table would be pickled
        # with all of its buffers.
        read = pool.map(_read, cut, repeat(parser_version))
        return [content for chunk in read for content in _split(chunk, parser_version)]


def _contents(files: Sequence[tuple[bytes, str]], parser_version: str) -> list[RecordSetContent]:
    return _split(_read(files, parser_version), parser_version)


def _read(files: Sequence[tuple[bytes, str]], parser_version: str) -> FilesTables:
    streams = [(io.BytesIO(data), digest) for data, digest in files]
    return files_record_tables(streams, parser_version)


def _split(read: FilesTables, parser_version: str) -> list[RecordSetContent]:
    """Each file's record set; raises the first file's NotLigerCsv, if any."""
    contents = []
    for file in range(len(read.rows)):
        rows, tables = read.of(file)
        # Each run's lineage row is its own (a run twice in a file has one externalId twice,
        # and the second is quarantined): the runs object holds the lineage, one object fewer.
        contents.append(RecordSetContent(rows, tables, lineage_in_runs=True))
    return contents


def _chunks(datas: Sequence[bytes], workers: int) -> list[tuple[int, int]]:
    """The files cut into consecutive runs, (start, end), about two per worker by bytes."""
    if workers < 2:
        return [(0, len(datas))]
    share = max(1, sum(map(len, datas)) // (2 * workers))
    chunks, start, size = [], 0, 0
    for i, data in enumerate(datas):
        size += len(data)
        if size >= share:
            chunks.append((start, i + 1))
            start, size = i + 1, 0
    if start < len(datas):
        chunks.append((start, len(datas)))
    return chunks


# --- `kindex normalize` of one file, in parts -----------------------------------------------
# A part is about this many bytes of CSV, cut at a line end; a file of one part (every real
# Liger file) is read in this process, as it would be without parts.
PART_BYTES = 4 * 2**20


def write_outcomes(
    path: Path,
    out: BinaryIO | None,
    progress: Callable[[int], object] | None = None,
    workers: int | None = None,
    part_bytes: int = PART_BYTES,
) -> Counter[str]:
    """Normalize a Liger CSV: write each row's JSON line to `out` (unless None), in input
    order; return the counts by "ok:<metric>" and "quarantined:<reason>". `progress` is told
    the bytes read as they are. Raises NotLigerCsv before writing anything.

    A file of several parts is normalized part by part in a ProcessPoolExecutor: each process
    writes its part's lines to a file of its own and tells the parent only its counts and the
    externalIds its part met first; the parent copies the parts' lines out in order, and
    quarantines a run whose externalId an earlier part had (first one wins, as in one pass)."""
    counts: Counter[str] = Counter()
    with path.open("rb") as stream:
        header = stream.readline()
        open_liger_csv([header])  # NotLigerCsv, before anything is written
        parts = _parts(stream, len(header), part_bytes)
    normalizer = shared_normalizer()  # built once, before the workers fork from this process
    workers = min(len(parts), usable_cpus() if workers is None else workers)
    if workers < 2:
        _in_process(path, header, parts[0], normalizer, out, SeenKeys(), counts, progress)
    else:
        with tempfile.TemporaryDirectory(dir=_scratch()) as folder:
            _in_pool(path, header, parts, workers, folder, out, counts, progress)
    if out is not None:
        out.flush()
    return counts


@dataclass(frozen=True, slots=True)
class _Cut:
    start: int  # byte offset of the part's first line
    size: int  # its bytes, to a line end (or the file's end)
    first_line: int  # the line number of its first line (the header is line 1)


def _parts(stream: BinaryIO, start: int, part_bytes: int) -> list[_Cut]:
    """The file after its header (`stream` just past it) cut into parts at line ends."""
    cuts, line = [], 2
    while data := stream.read(part_bytes):
        data += stream.readline()  # to the end of the line the read cut
        cuts.append(_Cut(start, len(data), line))
        start, line = start + len(data), line + data.count(b"\n")
    return cuts or [_Cut(start, 0, line)]


def _scratch() -> str | None:
    """Where parts' lines wait to be copied out: memory (/dev/shm) where there is one, since
    each is written and read once and never needs to reach a disk."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _in_process(
    path: Path,
    header: bytes,
    cut: _Cut,
    normalizer: Normalizer,
    out: BinaryIO | None,
    seen: SeenKeys,
    counts: Counter[str],
    progress: Callable[[int], object] | None,
) -> None:
    """From `cut` to the file's end in this process, checked against the externalIds `seen`."""
    with path.open("rb") as stream:
        stream.seek(cut.start)
        csv_file = open_liger_csv(chain([header], stream), cut.first_line)
        done = cut.start
        for batch in batches_of(csv_file, normalizer, BATCH_ROWS, seen):
            if out is not None:
                write_json_lines(batch, out)
            count_outcomes(batch, counts)
            if progress is not None:
                progress(stream.tell() - done)
                done = stream.tell()


@dataclass(slots=True)
class _Part:
    """What a part's process tells the parent. Its runs that stand (met first in the part) are
    listed by their externalIds' digests, 16 bytes each, with where their lines are."""

    counts: Counter[str]
    torn: bool  # the part ended inside a record: the cut was no record boundary
    batch_ends: list[int] = field(default_factory=list)  # bytes of lines after each batch
    digests: bytes = b""
    batches: list[np.ndarray] = field(default_factory=list)  # each standing run's batch,
    positions: list[np.ndarray] = field(default_factory=list)  # its row in the batch,
    memory: list[np.ndarray] = field(default_factory=list)  # and whether it is a memory run


class _FirstKeys(SeenKeys):
    """A part's externalIds, with the digests of those met first, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.firsts: list[bytes] = []

    def first_times_of_digests(self, digests: Sequence[bytes]) -> np.ndarray:
        first = super().first_times_of_digests(digests)
        self.firsts += compress(digests, first.tolist())
        return first


def _normalize_part(path: str, header: bytes, cut: _Cut, lines_path: str | None) -> _Part:
    """A part in a worker: its lines into `lines_path` (unless None); what the parent needs."""
    with open(path, "rb") as stream:
        stream.seek(cut.start)
        data = stream.read(cut.size)
    csv_file = open_liger_csv(chain([header], io.BytesIO(data)), cut.first_line)
    seen = _FirstKeys()
    part = _Part(Counter(), torn=False)
    with open(os.devnull if lines_path is None else lines_path, "wb", buffering=0) as out:
        for index, batch in enumerate(batches_of(csv_file, shared_normalizer(), BATCH_ROWS, seen)):
            if lines_path is not None:
                write_json_lines(batch, out)
                part.batch_ends.append(out.tell())
            count_outcomes(batch, part.counts)
            runs = batch.runs
            if runs is None:
                continue
            standing = np.array([p not in batch.others for p in runs.positions], dtype=bool)
            part.batches.append(np.full(int(standing.sum()), index, dtype=np.int32))
            part.positions.append(np.array(runs.positions, dtype=np.int32)[standing])
            memory = np.array([s.memory for s in runs.series], dtype=bool)
            part.memory.append(memory[runs.series_ids][standing])
    part.torn = csv_file.torn
    part.digests = b"".join(seen.firsts)
    return part


# Parts in flight at once: enough to keep every worker busy while the parent copies one out,
# few enough that the lines waiting in scratch files stay a few parts' worth.
def _in_flight(workers: int) -> int:
    return 2 * workers


def _in_pool(
    path: Path,
    header: bytes,
    cuts: list[_Cut],
    workers: int,
    folder: str,
    out: BinaryIO | None,
    counts: Counter[str],
    progress: Callable[[int], object] | None,
) -> None:
    seen = SeenKeys()
    pending: list[Future[_Part]] = []
    context = worker_context(__name__)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:

        def submit(i: int) -> None:
            lines = None if out is None else os.path.join(folder, f"part-{i}")
            pending.append(pool.submit(_normalize_part, str(path), header, cuts[i], lines))

        try:
            for i in range(min(len(cuts), _in_flight(workers))):
                submit(i)
            for i, cut in enumerate(cuts):
                part = pending[i].result()
                if part.torn and i < len(cuts) - 1:
                    # A quoted field runs across the cut (rare: no real Liger file has a line
                    # break in a field). The parts read so far stand; the rest is read in this
                    # process, from this part's start, which is a record's.
                    for future in pending[i + 1 :]:
                        future.cancel()
                    normalizer = shared_normalizer()
                    _in_process(path, header, cut, normalizer, out, seen, counts, progress)
                    return
                if len(pending) < len(cuts):
                    submit(len(pending))
                digests = part.digests
                keys = [digests[k : k + 16] for k in range(0, len(digests), 16)]
                again = np.flatnonzero(~seen.first_times_of_digests(keys))
                counts.update(part.counts)
                _requarantine(part, again, counts)
                if out is not None:
                    lines = os.path.join(folder, f"part-{i}")
                    _copy_part(lines, part, again, out)
                    os.unlink(lines)
                if progress is not None:
                    progress(cut.size)
        finally:
            for future in pending:
                future.cancel()


def _requarantine(part: _Part, again: np.ndarray, counts: Counter[str]) -> None:
    """Count the part's runs whose externalId an earlier part had as quarantined."""
    if not len(again):
        return
    memory = np.concatenate(part.memory)[again]
    counts["ok:memory"] -= int(memory.sum())
    counts["ok:latency"] -= int((~memory).sum())
    counts[f"quarantined:{Reason.DUPLICATE_EXTERNAL_ID}"] += len(again)


def _copy_part(lines_path: str, part: _Part, again: np.ndarray, out: BinaryIO) -> None:
    """Copy a part's lines to `out`, each line of a run in `again` (by index among the part's
    standing runs) replaced by its duplicate quarantine."""
    batches = np.concatenate(part.batches)[again] if len(again) else np.zeros(0, np.int32)
    positions = np.concatenate(part.positions)[again] if len(again) else batches
    starts = [0, *part.batch_ends]
    with open(lines_path, "rb", buffering=0) as source:
        done = 0
        for batch in np.unique(batches).tolist():
            start, end = starts[batch], starts[batch + 1]
            _copy(source, done, start, out)
            source.seek(start)
            text = source.read(end - start).split(b"\n")
            for position in positions[batches == batch].tolist():
                line = orjson.loads(text[position])
                external_id = line["records"][0]["manifest"]["spec"]["sourceNative"]["externalId"]
                text[position] = duplicate(line["source_line"], "", external_id).json_line()[:-1]
            out.write(b"\n".join(text))
            done = end
        _copy(source, done, starts[-1], out)


def _copy(source: BinaryIO, start: int, end: int, out: BinaryIO) -> None:
    """Bytes start..end of `source` to `out`: by sendfile where `out` is a file or a pipe, the
    bytes never passing through this process."""
    out.flush()
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # io.BytesIO and the like
        fd = -1
    while start < end and fd >= 0:
        try:
            sent = os.sendfile(fd, source.fileno(), start, end - start)
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise  # a closed pipe (`| head`) among them
            break  # an output sendfile cannot write to: copied below
        if not sent:
            break
        start += sent
    source.seek(start)
    while start < end:
        block = source.read(min(end - start, 2**20))
        out.write(block)
        start += len(block)
