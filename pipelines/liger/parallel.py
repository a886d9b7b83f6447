"""`kindex normalize` of a large CSV on every core, with output identical to the serial path.

The parent reads and splits records (the reader is cheap); worker processes normalize batches and
return each row's finished JSON line; the parent keeps input order, applies the one rule that
spans the file (a duplicate externalId: first one wins) and writes. Shipping finished lines, not
records, keeps the traffic between processes to bytes.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import BinaryIO

from pipelines.liger.normalize import Normalizer, duplicate_outcome, outcome_of
from pipelines.liger.read import CsvRecord, open_liger_csv

BATCH_ROWS = 2000
PARALLEL_MIN_BYTES = 8 * 2**20  # below this, starting workers costs more than it saves


@dataclass(frozen=True, slots=True)
class RowResult:
    line: int
    status: str
    reason: str | None
    metric: str | None
    external_id: str | None
    json_line: bytes | None  # None when the caller asked for counts only


_columns: tuple[str, ...] = ()
_normalizer: Normalizer | None = None


def _start_worker(columns: tuple[str, ...]) -> None:
    global _columns, _normalizer
    _columns, _normalizer = columns, Normalizer()


# Batches cross process boundaries as plain tuples: pickling dataclasses costs more than the work.
RecordTuple = tuple[int, str, list[str] | None, str | None]
ResultTuple = tuple[int, str, str | None, str | None, str | None, bytes | None]


def _normalize_batch(job: tuple[list[RecordTuple], bool]) -> list[ResultTuple]:
    records, with_lines = job
    assert _normalizer is not None
    results: list[ResultTuple] = []
    for line, raw, fields, error in records:
        outcome = outcome_of(CsvRecord(line, raw, fields, error), _columns, _normalizer)
        facts = outcome.facts
        results.append(
            (
                line,
                outcome.status,
                outcome.reason,
                facts.metric if facts else None,
                facts.external_id if facts else None,
                outcome.json_line() if with_lines else None,
            )
        )
    return results


def _batches(
    records: Iterator[CsvRecord], with_lines: bool
) -> Iterator[tuple[list[RecordTuple], bool]]:
    while batch := [(r.line, r.raw, r.fields, r.error) for r in islice(records, BATCH_ROWS)]:
        yield batch, with_lines


def worth_parallel(stream: BinaryIO) -> bool:
    try:
        size = os.fstat(stream.fileno()).st_size
    except (OSError, ValueError):
        return False
    return (os.cpu_count() or 1) > 1 and size >= PARALLEL_MIN_BYTES


def normalize_parallel(
    lines: Iterable[bytes], *, with_lines: bool = True, workers: int | None = None
) -> Iterator[RowResult]:
    """Row results in input order. Raises NotLigerCsv before yielding when the header is wrong."""
    csv_file = open_liger_csv(lines)
    raw_by_line: dict[int, str] = {}

    def remembered(records: Iterator[CsvRecord]) -> Iterator[CsvRecord]:
        # The parent keeps each row's raw text until its result returns, for duplicate outcomes.
        for record in records:
            raw_by_line[record.line] = record.raw
            yield record

    context = multiprocessing.get_context("spawn" if os.name != "posix" else "fork")
    seen: set[str] = set()
    with context.Pool(workers or os.cpu_count() or 2, _start_worker, (csv_file.columns,)) as pool:
        for batch in pool.imap(
            _normalize_batch, _batches(remembered(csv_file.records), with_lines)
        ):
            for values in batch:
                result = RowResult(*values)
                raw = raw_by_line.pop(result.line)
                if result.external_id is None:
                    yield result
                elif result.external_id in seen:
                    duplicate = duplicate_outcome(result.line, raw, result.external_id)
                    yield RowResult(
                        result.line,
                        duplicate.status,
                        duplicate.reason,
                        None,
                        None,
                        duplicate.json_line() if with_lines else None,
                    )
                else:
                    seen.add(result.external_id)
                    yield result
