"""Step 5, batched: a batch's record tables (runs, manifests, quarantine, lineage), equal to
feeding its outcomes to RecordSetBuilder in input order (tests/test_liger_tables.py).

Plain runs (pipelines/sources/liger/columnar.py) become table columns straight from the batch:
Python
runs once per distinct series and workload, Arrow does the rest. Every other row goes through
RecordSetBuilder as before. Both parts carry each table row's place in the batch (the row's
position, then the record's slot in that row), are merged in input order, and a run or manifest
met twice keeps its first row, as the builder keeps it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.index.record_objects import (
    MEASURED_FIELDS,
    SCHEMAS,
    SERIES_FIELDS,
    UTC_US,
    RecordSetBuilder,
)
from pipelines.records import Record, RowOutcome
from pipelines.sources.liger.columnar import (
    BATCH_ROWS,
    Batch,
    PlainRuns,
    normalized_batches,
)
from pipelines.sources.liger.normalize import Normalizer, Series, Workload

NAMES = ("runs", "manifests", "quarantine", "lineage")
# A plain row's records after its run, in RowOutcome.records order: operation, project,
# implementation (its series'), its workload, then protocol and environment (its series').
WORKLOAD_SLOT = 3


@dataclass(slots=True)
class BatchTables:
    rows: int
    tables: dict[str, pa.Table]


def record_tables(
    stream: BinaryIO,
    snapshot_digest: str,
    parser_version: str,
    normalizer: Normalizer | None = None,
    rows: int = BATCH_ROWS,
) -> tuple[int, dict[str, pa.Table]]:
    """(rows read, record tables) of a whole Liger CSV, batch by batch; raises NotLigerCsv."""
    merged = FileTables()
    for batch in normalized_batches(stream, normalizer, rows):
        merged.merge(batch_tables(batch, snapshot_digest, parser_version))
    return merged.rows, merged.tables()


@dataclass(slots=True)
class FileTables:
    """Batch tables merged in file order: a run or manifest that an earlier batch had keeps
    that batch's row (its lineage rows stay), as RecordSetBuilder keeps the first.

    Manifests (at most one per distinct record, fewer than runs) are checked batch by batch
    against the digests merged so far, while later batches are still being built (the relay's
    workers run meanwhile); runs, one per row, once at the end, vectorized."""

    names: tuple[str, ...] = NAMES  # the tables merged here (a batch may hold only those)
    rows: int = 0
    parts: dict[str, list[pa.Table]] = field(init=False)
    manifest_digests: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.parts = {name: [] for name in self.names}

    def merge(self, batch: BatchTables) -> None:
        self.rows += batch.rows
        for name in self.names:
            table = batch.tables[name]
            self.parts[name].append(self._new_manifests(table) if name == "manifests" else table)

    def _new_manifests(self, table: pa.Table) -> pa.Table:
        """The batch's manifests (each once) that no earlier batch had."""
        digests = table.column("digest").to_pylist()
        new = [digest not in self.manifest_digests for digest in digests]
        self.manifest_digests.update(digests)
        return table if all(new) else table.filter(new)

    def tables(self) -> dict[str, pa.Table]:
        tables = {
            name: pa.concat_tables(parts) if parts else SCHEMAS[name].empty_table()
            for name, parts in self.parts.items()
        }
        if "runs" in tables:
            tables["runs"] = _first_seen(tables["runs"], "run_digest")
        return tables


@dataclass(slots=True)
class _Part:
    """Rows of one table with, for each, its row's position in the batch and its slot."""

    table: pa.Table
    positions: np.ndarray
    slots: np.ndarray


def batch_tables(
    batch: Batch, snapshot_digest: str, parser_version: str, names: tuple[str, ...] = NAMES
) -> BatchTables:
    """The batch's record tables of those `names`, in input order; duplicate externalIds are
    the caller's."""
    others = _other_parts(batch, snapshot_digest, parser_version)
    plain = (
        _plain_parts(batch.runs, batch.others, snapshot_digest, parser_version, names)
        if batch.runs is not None
        else {}
    )
    tables = {
        name: _merged(name, [p for p in (plain.get(name), others[name]) if p is not None])
        for name in names
    }
    return BatchTables(batch.size, tables)


def _other_parts(batch: Batch, snapshot_digest: str, parser_version: str) -> dict[str, _Part]:
    builder = RecordSetBuilder(snapshot_digest, parser_version)
    columns = {
        "runs": builder.runs["run_digest"],
        "manifests": builder.manifests["digest"],
        "quarantine": builder.quarantine["source_line"],
        "lineage": builder.lineage["run_digest"],
    }
    places: dict[str, tuple[list[int], list[int]]] = {name: ([], []) for name in NAMES}
    for position in sorted(batch.others):
        before = {name: len(column) for name, column in columns.items()}
        builder.add(batch.others[position])
        for name, column in columns.items():
            added = len(column) - before[name]
            places[name][0].extend([position] * added)
            places[name][1].extend(range(added))
    tables = builder.tables()
    return {
        name: _Part(tables[name], np.array(places[name][0], np.int64), np.array(places[name][1]))
        for name in NAMES
    }


@dataclass(slots=True)
class _PlainRows:
    """The plain runs that stand (not overridden by a row outcome), as indices into PlainRuns."""

    runs: PlainRuns
    index: np.ndarray
    positions: np.ndarray
    snapshot_digest: str
    parser_version: str

    def by(self, ids: np.ndarray, values: Sequence[Any], kind: pa.DataType) -> pa.Array:
        """Per-row values from per-distinct ones, by each row's dictionary code."""
        return pa.array(values, kind).take(pa.array(ids[self.index]))

    def column(self, values: pa.Array) -> pa.Array:
        """The standing rows of a PlainRuns column: all of it, uncopied, when all stand."""
        if len(self.index) == len(values):  # the index is sorted and distinct: every row
            return values
        return values.take(pa.array(self.index))

    def constant(self, value: Any, kind: pa.DataType, size: int | None = None) -> pa.Array:
        """`value` on each row (or on `size` rows)."""
        return pa.repeat(pa.scalar(value, kind), len(self.index) if size is None else size)


def _plain_parts(
    runs: PlainRuns,
    others: dict[int, RowOutcome],
    snapshot_digest: str,
    parser_version: str,
    names: tuple[str, ...],
) -> dict[str, _Part]:
    stands = np.array([p not in others for p in runs.positions], dtype=bool)
    index = np.flatnonzero(stands)
    positions = np.array(runs.positions, dtype=np.int64)[index]
    rows = _PlainRows(runs, index, positions, snapshot_digest, parser_version)
    no_slot = np.zeros(len(index), dtype=np.int64)
    parts = {
        "runs": _Part(_run_table(rows), positions, no_slot),
        "manifests": _manifest_part(rows),
    }
    if "lineage" in names:
        lineage = pa.Table.from_arrays(
            [
                rows.constant(snapshot_digest, pa.string()),
                rows.constant(parser_version, pa.string()),
                rows.column(runs.lines),
                rows.column(runs.digests),
            ],
            schema=SCHEMAS["lineage"],
        )
        parts["lineage"] = _Part(lineage, positions, no_slot)
    return parts


def _run_table(rows: _PlainRows) -> pa.Table:
    runs = rows.runs
    series = runs.series
    workloads = runs.workloads
    by_series = _series_columns(series)
    by_workload = _workload_columns(workloads)
    string = pa.string()
    columns: dict[str, pa.Array] = {
        "run_digest": rows.column(runs.digests),
        "external_id": rows.column(runs.external_ids),
        "metric": rows.by(runs.series_ids, by_series["metric"], string),
        "unit": rows.by(runs.series_ids, by_series["unit"], string),
        "status": rows.constant("passed", string),
        "observed_at": rows.by(
            runs.stamp_ids, [s.observed_at if s else None for s in runs.stamps], string
        ).cast(UTC_US),
        "median": pa.array(runs.values[rows.index, 0]),
        "p20": pa.array(runs.values[rows.index, 1]),
        "p80": pa.array(runs.values[rows.index, 2]),
        "liger_version": rows.by(runs.version_ids, [v or None for v in runs.versions], string),
        "origin": rows.constant("reported", string),
        "series_key": _series_keys(rows, by_series, by_workload),
        "parser_version": rows.constant(rows.parser_version, string),
        "snapshot_digest": rows.constant(rows.snapshot_digest, string),
        "source_line": rows.column(runs.lines),
        "manifest": rows.column(runs.manifests),
    }
    for name, values in by_series.items():
        columns.setdefault(name, rows.by(runs.series_ids, values, string))
    for name, values in by_workload.items():
        columns.setdefault(name, rows.by(runs.workload_ids, values, string))
    for name, kind in MEASURED_FIELDS:  # a worker's statistics: none in a Liger CSV
        columns[name] = pa.nulls(len(rows.index), kind)
    schema = SCHEMAS["runs"]
    return pa.Table.from_arrays([columns[name] for name in schema.names], schema=schema)


def _series_columns(series: Sequence[Series | None]) -> dict[str, list[str | None]]:
    """The run columns a series decides, one value per distinct series (None: unused)."""
    columns: dict[str, list[str | None]] = {
        name: []
        for name in (
            "metric",
            "unit",
            "kernel",
            "provider",
            "mode",
            "gpu",
            "architecture",
            "implementation_digest",
            "protocol_digest",
            "environment_digest",
        )
    }
    for s in series:
        values: tuple[str | None, ...] = (None,) * len(columns)
        if s is not None:
            _, _, implementation, protocol, environment = s.references
            values = (
                ("memory" if s.memory else "latency", "bytes" if s.memory else "ns")
                + (s.kernel, s.provider, s.mode, s.gpu, s.architecture)
                + (implementation.digest, protocol.digest, environment.digest)
            )
        for name, value in zip(columns, values, strict=True):
            columns[name].append(value)
    return columns


def _workload_columns(workloads: Sequence[Workload | None]) -> dict[str, list[str | None]]:
    columns: dict[str, list[str | None]] = {
        "operation_digest": [],
        "workload_digest": [],
        "dtype": [],
        "case_key": [],
    }
    for w in workloads:
        columns["operation_digest"].append(
            w.record.manifest["spec"].get("operationSpecDigest") if w else None
        )
        columns["workload_digest"].append(w.record.digest if w else None)
        columns["dtype"].append(w.dtype if w else None)
        columns["case_key"].append(w.case_key if w else None)
    return columns


def _series_keys(
    rows: _PlainRows,
    by_series: dict[str, list[str | None]],
    by_workload: dict[str, list[str | None]],
) -> pa.Array:
    """record_objects.run_series_key of each reported run: BLAKE2b of its series fields joined
    by U+001F (none is None in a plain run), read as a signed big-endian 64-bit integer. All
    but the last field (the case key) are the series': their hash state is computed once per
    series and copied for each run."""
    assert SERIES_FIELDS[-1] == "case_key"
    blake2b = hashlib.blake2b
    fields = [by_series[name] for name in SERIES_FIELDS[:-1]]
    heads = [
        None
        if kernel is None
        else blake2b("".join(f"{field[i]}\x1f" for field in fields).encode(), digest_size=8)
        for i, kernel in enumerate(by_series["kernel"])
    ]
    case_keys = [(key or "").encode() for key in by_workload["case_key"]]
    digests = []
    series_ids, workload_ids = rows.runs.series_ids[rows.index], rows.runs.workload_ids[rows.index]
    for series, workload in zip(series_ids.tolist(), workload_ids.tolist(), strict=True):
        digest = heads[series].copy()  # a plain run's series is known: not None
        digest.update(case_keys[workload])
        digests.append(digest.digest())
    return pa.array(np.frombuffer(b"".join(digests), dtype=">i8").astype(np.int64))


def _manifest_part(rows: _PlainRows) -> _Part:
    """The manifests of the plain rows, each at the first row that references it: a series'
    records at its first row, in their slots, and a workload's at its first row."""
    runs = rows.runs
    series_codes, series_rows = _first_rows(rows, runs.series_ids)
    workload_codes, workload_rows = _first_rows(rows, runs.workload_ids)
    records: list[Record] = [
        record for code in series_codes.tolist() for record in runs.series[code].references
    ]
    records += [runs.workloads[code].record for code in workload_codes.tolist()]
    slots = np.concatenate(
        [np.tile(SERIES_SLOTS, len(series_codes)), np.full(len(workload_codes), WORKLOAD_SLOT)]
    )
    at = np.concatenate([np.repeat(series_rows, len(SERIES_SLOTS)), workload_rows])
    positions = rows.positions[at]
    order = np.lexsort((slots, positions))
    records = [records[i] for i in order.tolist()]
    lines = runs.lines.to_numpy()[rows.index[at[order]]]
    table = pa.Table.from_arrays(
        [
            pa.array([r.digest for r in records], pa.string()),
            pa.array([r.kind for r in records], pa.string()),
            pa.array([r.manifest.get("metadata", {}).get("name") for r in records], pa.string()),
            rows.constant(rows.parser_version, pa.string(), len(records)),
            rows.constant(rows.snapshot_digest, pa.string(), len(records)),
            pa.array(lines, pa.int64()),
            pa.array([r.manifest_json for r in records], pa.string()),
        ],
        schema=SCHEMAS["manifests"],
    )
    return _Part(table, positions[order], slots[order])


def _first_rows(rows: _PlainRows, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct codes of the standing rows, and the index (among them) of each one's first
    row."""
    return np.unique(ids[rows.index], return_index=True)


# Where a series' records (Series.references: operation, project, implementation, protocol,
# environment) go among a row's records: the workload comes between implementation and protocol.
SERIES_SLOTS = np.array([0, 1, 2, WORKLOAD_SLOT + 1, WORKLOAD_SLOT + 2], dtype=np.int64)


def _merged(name: str, parts: list[_Part]) -> pa.Table:
    """The parts in input order; manifests keep the first row of each digest. Runs are not
    checked: a run's digest covers its externalId, which the caller made unique in the file."""
    parts = [p for p in parts if p.table.num_rows]
    if not parts:
        return SCHEMAS[name].empty_table()
    table = parts[0].table
    if len(parts) > 1:  # each part is in input order already: interleave them
        positions = np.concatenate([p.positions for p in parts])
        slots = np.concatenate([p.slots for p in parts])
        order = np.lexsort((slots, positions))
        table = pa.concat_tables([p.table for p in parts]).take(pa.array(order))
    return _first_seen(table, "digest") if name == "manifests" else table


def _first_seen(table: pa.Table, column: str) -> pa.Table:
    """The rows of `table` whose `column` value no earlier row has. Arrow numbers the distinct
    values in order of first appearance, so a row is a first exactly when its number is above
    every earlier row's."""
    if not len(table):
        return table
    values = table.column(column).combine_chunks()
    codes = pc.dictionary_encode(values, null_encoding="encode").indices.to_numpy()
    first = np.ones(len(codes), dtype=bool)
    first[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]
    return table if first.all() else table.filter(pa.array(first))
