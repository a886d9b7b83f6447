"""The Liger source's entry points: a CSV's outcomes, one per row (`kindex normalize`, a dry
run), and its record set; several files' record sets on every core.

A file is read batch by batch (pipelines/sources/liger/columnar.py). Real Liger files are small
and many, so the parallelism is over files: each file in one process of a ProcessPoolExecutor.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat

from pipelines.forked import usable_cpus, worker_context
from pipelines.index.record_objects import RecordSetContent
from pipelines.records import RowOutcome
from pipelines.sources.liger.columnar import batch_outcomes, normalized_batches
from pipelines.sources.liger.model import PARSER_VERSION, Normalizer, parser_version
from pipelines.sources.liger.read import NotLigerCsv
from pipelines.sources.liger.tables import record_tables

__all__ = [
    "PARSER_VERSION",
    "NotLigerCsv",
    "normalize_bytes",
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


PARALLEL_FROM_BYTES = 8 << 20


def record_sets(files: Sequence[tuple[bytes, str]], parser_version: str) -> list[RecordSetContent]:
    """The record sets of several (bytes, snapshot digest), in their order: one file per
    process, on every core the files can use."""
    workers = min(len(files), usable_cpus())
    datas, digests = [data for data, _ in files], [digest for _, digest in files]
    # Worker processes cost more to start and feed than small files cost to normalize.
    if workers < 2 or sum(map(len, datas)) < PARALLEL_FROM_BYTES:
        return list(map(record_set, datas, digests, repeat(parser_version)))
    context = worker_context(__name__)
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(record_set, datas, digests, repeat(parser_version)))
