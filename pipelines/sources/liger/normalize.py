"""The Liger source's entry points: a CSV's outcomes, one per row, and `kindex normalize`'s
lines of a file; its record set; several files' record sets on every core.

A file is read batch by batch (pipelines/sources/liger/columnar.py). Real Liger files are small
and many: the record sets of several files are built each in a process of a ProcessPoolExecutor.
`kindex normalize` of a large file cuts it into chunks of lines, each normalized in such a
process while this one applies the file's rule (first externalId wins) in order.
"""

from __future__ import annotations

import io
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain, islice, repeat
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pipelines.forked import collect_garbage_rarely, usable_cpus, worker_context
from pipelines.index.record_objects import RecordSetContent
from pipelines.intake.seen_keys import SeenKeys, digests_of
from pipelines.records import RowOutcome
from pipelines.sources.liger.columnar import (
    Lines,
    batch_outcomes,
    batches_of,
    count_outcomes,
    duplicate,
    lines_of,
    normalized_batches,
    write_json_lines,
    write_lines,
)
from pipelines.sources.liger.model import (
    PARSER_VERSION,
    Layout,
    Normalizer,
    parser_version,
    shared_normalizer,
)
from pipelines.sources.liger.read import (
    NotLigerCsv,
    open_liger_csv,
    read_records,
    whole_line_records,
)
from pipelines.sources.liger.tables import record_tables

__all__ = [
    "PARSER_VERSION",
    "NotLigerCsv",
    "normalize_bytes",
    "normalize_file",
    "normalize_lines",
    "parser_version",
    "record_set",
    "record_sets",
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
    rows, tables = record_tables(io.BytesIO(data), snapshot_digest, parser_version)
    # Each run's lineage row is its own (a run twice in a file has one externalId twice, and
    # the second is quarantined): the runs object holds the lineage, one object fewer to write.
    return RecordSetContent(rows, tables, lineage_in_runs=True)


def record_sets(files: Sequence[tuple[bytes, str]], parser_version: str) -> list[RecordSetContent]:
    """The record sets of several (bytes, snapshot digest), in their order: one file per
    process, on every core the files can use."""
    workers = min(len(files), usable_cpus())
    datas, digests = [data for data, _ in files], [digest for _, digest in files]
    if workers < 2:
        return list(map(record_set, datas, digests, repeat(parser_version)))
    context = worker_context(__name__)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(record_set, datas, digests, repeat(parser_version)))


# A file larger than this is normalized a chunk of CHUNK_LINES lines per process.
PARALLEL_BYTES = 4 << 20
CHUNK_LINES = 16_384


def normalize_file(
    path: Path, out: BinaryIO | None, progress: Callable[[int], object] = lambda done: None
) -> Counter[str]:
    """`kindex normalize`: a Liger CSV's lines written to `out` (unless None) in input order,
    and the counts by "ok:<metric>" and "quarantined:<reason>"; `progress` gets the bytes read
    so far. Raises NotLigerCsv. Chunks whose lines are each one record go to the processes;
    from the first line that is not, the rest is read here."""
    counts: Counter[str] = Counter()
    seen = SeenKeys()
    with path.open("rb") as stream:
        layout = Layout.of(open_liger_csv(stream).columns)
        lines: Iterator[bytes] = iter(stream)
        first_line = 2
        workers = usable_cpus()
        if workers > 1 and path.stat().st_size > PARALLEL_BYTES:
            context = worker_context(__name__)
            with ProcessPoolExecutor(
                workers, mp_context=context, initializer=collect_garbage_rarely
            ) as pool:
                pending: deque[tuple[Future[_Chunk], int, list[bytes]]] = deque()
                while chunk := list(islice(lines, CHUNK_LINES)):
                    if not whole_line_records(chunk):
                        lines = chain(chunk, lines)
                        break
                    future = pool.submit(
                        _normalize_chunk, layout, first_line, chunk, out is not None
                    )
                    pending.append((future, first_line, chunk))
                    first_line += len(chunk)
                    while len(pending) > workers:
                        _write_chunk(*pending.popleft(), seen, out, counts)
                        progress(stream.tell())
                while pending:
                    _write_chunk(*pending.popleft(), seen, out, counts)
                    progress(stream.tell())
        records = read_records(lines, first_line)
        for batch in batches_of(records, layout, shared_normalizer(), seen):
            if out is not None:
                write_json_lines(batch, out)
            count_outcomes(batch, counts)
            progress(stream.tell())
    if out is not None:
        out.flush()
    return counts


@dataclass(slots=True)
class _Chunk:
    """A chunk's outcomes: counts; its batches' lines (when written); and its runs: where each
    is (batch, row), its source line, externalId and whether it is a memory run."""

    counts: Counter[str]
    lines: list[Lines]
    where: list[tuple[int, int]]
    source_lines: list[int]
    external_ids: list[str]
    memory: list[bool]


def _normalize_chunk(layout: Layout, first_line: int, lines: list[bytes], write: bool) -> _Chunk:
    chunk = _Chunk(Counter(), [], [], [], [], [])
    records = read_records(lines, first_line)
    for number, batch in enumerate(batches_of(records, layout, shared_normalizer(), SeenKeys())):
        if write:
            chunk.lines.append(lines_of(batch))
        count_outcomes(batch, chunk.counts)
        runs = batch.runs
        if runs is None:
            continue
        stand = [i for i, p in enumerate(runs.positions) if p not in batch.others]
        chunk.where += [(number, runs.positions[i]) for i in stand]
        chunk.source_lines += runs.lines.take(stand).to_pylist()
        chunk.external_ids += runs.external_ids.take(stand).to_pylist()
        memory = [s.memory for s in runs.series]
        chunk.memory += [memory[runs.series_ids[i]] for i in stand]
    return chunk


def _write_chunk(
    future: Future[_Chunk],
    first_line: int,
    lines: list[bytes],
    seen: SeenKeys,
    out: BinaryIO | None,
    counts: Counter[str],
) -> None:
    """A chunk's lines and counts, a run whose externalId an earlier chunk had quarantined."""
    chunk = future.result()
    counts.update(chunk.counts)
    first = seen.first_times_of_digests(digests_of(i.encode() for i in chunk.external_ids))
    for i in np.flatnonzero(~first).tolist():
        line = chunk.source_lines[i]
        raw = lines[line - first_line].decode("utf-8").rstrip("\r\n")
        if out is not None:
            number, row = chunk.where[i]
            repeat = duplicate(line, raw, chunk.external_ids[i])
            chunk.lines[number].others[row] = repeat.json_line()
        counts["ok:memory" if chunk.memory[i] else "ok:latency"] -= 1
        counts["quarantined:duplicate_external_id"] += 1
    if out is not None:
        for batch_lines in chunk.lines:
            write_lines(batch_lines, out)
