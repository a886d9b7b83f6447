"""The record tables of a large Liger CSV built on every core, identical to the serial builder's.

The parent splits the CSV into batches of records (the reader is cheap); worker processes
normalize a batch and build its record tables (the expensive part: digests, JSON, Arrow). The
parent keeps input order and applies the rules that span the file: a run or manifest already met
in an earlier batch is not repeated (its lineage rows stay), and a duplicate externalId (first one
wins) makes the parent rebuild that batch itself with the file's state, which is rare.
"""

from __future__ import annotations

import io
import multiprocessing
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

import pyarrow as pa

from pipelines.forked import default_signals, usable_cpus
from pipelines.index.record_objects import RecordSetBuilder
from pipelines.liger.normalize import Layout, Normalizer, duplicate_outcome, outcome_of
from pipelines.liger.read import CsvRecord, open_liger_csv

BATCH_ROWS = 4000
PARALLEL_MIN_BYTES = 8 * 2**20  # below this, starting workers costs more than it saves
# Measured on 2 cores, 100k rows: quiet, 2 workers 25k rows/s against 18.5k serial; with the
# cores busy with other work, 11k against 11k (the parent's reading and merging take a share).
PARALLEL_MIN_CPUS = 2

# Records cross process boundaries as plain tuples: pickling dataclasses costs more than the work.
RecordTuple = tuple[int, str, list[str] | None, str | None]


@dataclass(slots=True)
class BatchTables:
    rows: int
    tables: dict[str, pa.Table]
    external_ids: list[str]  # of the batch's rows with run facts, in order


_columns: tuple[str, ...] = ()
_normalizer: Normalizer | None = None
_job: tuple[str, str] = ("", "")  # snapshot digest, parser version


def _start_worker(columns: tuple[str, ...], job: tuple[str, str]) -> None:
    global _columns, _normalizer, _job
    default_signals()
    _columns, _normalizer, _job = columns, Normalizer(), job


def _build_batch(records: list[RecordTuple]) -> BatchTables:
    assert _normalizer is not None
    builder = RecordSetBuilder(*_job)
    external_ids = []
    layout = Layout.of(_columns)
    for values in records:
        outcome = outcome_of(CsvRecord(*values), layout, _normalizer)
        if outcome.facts is not None:
            external_ids.append(outcome.facts.external_id)
        builder.add(outcome)
    return BatchTables(builder.rows, builder.tables(), external_ids)


def worth_parallel(size: int) -> bool:
    return usable_cpus() >= PARALLEL_MIN_CPUS and size >= PARALLEL_MIN_BYTES


@dataclass(slots=True)
class FileState:
    """What the rules that span the file need to know about the batches merged so far."""

    snapshot_digest: str
    parser_version: str
    rows: int = 0
    external_ids: set[str] = field(default_factory=set)
    runs: set[str] = field(default_factory=set)
    manifests: set[str] = field(default_factory=set)
    parts: dict[str, list[pa.Table]] = field(
        default_factory=lambda: {n: [] for n in ("runs", "manifests", "quarantine", "lineage")}
    )

    def merge(self, batch: BatchTables) -> None:
        self.rows += batch.rows
        self.external_ids.update(batch.external_ids)
        runs = _not_seen(batch.tables["runs"], "run_digest", self.runs)
        manifests = _not_seen(batch.tables["manifests"], "digest", self.manifests)
        for name, table in (
            ("runs", runs),
            ("manifests", manifests),
            ("quarantine", batch.tables["quarantine"]),
            ("lineage", batch.tables["lineage"]),
        ):
            self.parts[name].append(table)

    def rebuild(
        self, records: list[RecordTuple], columns: tuple[str, ...], normalizer: Normalizer
    ) -> BatchTables:
        """The batch built here, knowing the file so far: duplicates become quarantine rows."""
        builder = RecordSetBuilder(self.snapshot_digest, self.parser_version)
        builder.seen_runs, builder.seen_manifests = set(self.runs), set(self.manifests)
        seen = set(self.external_ids)
        layout = Layout.of(columns)
        for values in records:
            record = CsvRecord(*values)
            outcome = outcome_of(record, layout, normalizer)
            external_id = outcome.facts.external_id if outcome.facts is not None else None
            if external_id is not None:
                if external_id in seen:
                    outcome = duplicate_outcome(record.line, record.raw, external_id)
                else:
                    seen.add(external_id)
            builder.add(outcome)
        return BatchTables(builder.rows, builder.tables(), sorted(seen - self.external_ids))

    def tables(self, empty: dict[str, pa.Table]) -> dict[str, pa.Table]:
        return {
            name: pa.concat_tables(parts) if parts else empty[name]
            for name, parts in self.parts.items()
        }


def _not_seen(table: pa.Table, column: str, seen: set[str]) -> pa.Table:
    """The rows of `table` whose `column` is not in `seen`; adds the kept values to `seen`."""
    keep = []
    for value in table.column(column).to_pylist():
        keep.append(value not in seen)
        seen.add(value)
    return table if all(keep) else table.filter(pa.array(keep, pa.bool_()))


def _worker_context() -> multiprocessing.context.BaseContext:
    """Workers come from a forkserver where there is one: this runs inside Dagster runs, whose
    threads may hold a lock at the moment of a plain fork and leave the child waiting forever."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # workers start with the pipeline imported
    return context


def _has_duplicates(batch: BatchTables, seen: set[str]) -> bool:
    ids = batch.external_ids
    return len(set(ids)) != len(ids) or not seen.isdisjoint(ids)


def _batches(records: Iterator[CsvRecord]) -> Iterator[list[RecordTuple]]:
    while batch := [(r.line, r.raw, r.fields, r.error) for r in islice(records, BATCH_ROWS)]:
        yield batch


def build_tables_parallel(
    data: bytes, snapshot_digest: str, parser_version: str, workers: int | None = None
) -> tuple[int, dict[str, pa.Table]]:
    """(rows, record tables) of a Liger CSV, equal to feeding its outcomes to RecordSetBuilder.
    Raises NotLigerCsv when the header is not Liger's."""
    csv_file = open_liger_csv(io.BytesIO(data))  # split as the serial path splits
    state = FileState(snapshot_digest, parser_version)
    pending: deque[list[RecordTuple]] = deque()

    def submitted() -> Iterator[list[RecordTuple]]:
        for batch in _batches(csv_file.records):
            pending.append(batch)  # kept until its result is merged, for a rebuild
            yield batch

    context = _worker_context()
    parent_normalizer: Normalizer | None = None
    job = (snapshot_digest, parser_version)
    with context.Pool(workers or usable_cpus(), _start_worker, (csv_file.columns, job)) as pool:
        for result in pool.imap(_build_batch, submitted()):
            records = pending.popleft()
            if _has_duplicates(result, state.external_ids):
                parent_normalizer = parent_normalizer or Normalizer()
                result = state.rebuild(records, csv_file.columns, parent_normalizer)
            state.merge(result)
    empty = RecordSetBuilder(snapshot_digest, parser_version).tables()
    return state.rows, state.tables(empty)
