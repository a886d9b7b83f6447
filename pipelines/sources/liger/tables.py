"""Step 5: a batch's record tables (runs, manifests, quarantine, lineage), column by column:
Python runs once per distinct series and workload, Arrow does the rest. The tables are those
RecordSetBuilder makes of the batch's outcomes in input order (tests/test_liger_tables.py): a
manifest met twice keeps its first row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.index.record_objects import (
    MEASURED_FIELDS,
    SCHEMAS,
    UTC_US,
    run_series_key,
)
from pipelines.records import Record
from pipelines.sources.liger.columnar import BATCH_ROWS, Batch, Runs, normalized_batches
from pipelines.sources.liger.model import WORKLOAD_SLOT, Normalizer, Series, Workload
from pipelines.sources.liger.rules import ORIGIN, STATUS, stored_metric

NAMES = ("runs", "manifests", "quarantine", "lineage")


def record_tables(
    stream: BinaryIO,
    snapshot_digest: str,
    parser_version: str,
    normalizer: Normalizer | None = None,
    rows: int = BATCH_ROWS,
) -> tuple[int, dict[str, pa.Table]]:
    """(rows read, record tables) of a whole Liger CSV, batch by batch; raises NotLigerCsv."""
    parts: dict[str, list[pa.Table]] = {name: [] for name in NAMES}
    size = 0
    for batch in normalized_batches(stream, normalizer, rows):
        size += batch.size
        for name, table in batch_tables(batch, snapshot_digest, parser_version).items():
            parts[name].append(table)
    tables = {
        name: pa.concat_tables(tables) if tables else SCHEMAS[name].empty_table()
        for name, tables in parts.items()
    }
    # A manifest an earlier batch had keeps that batch's row. Runs need no such check: a run's
    # digest covers its externalId, which the file's rule makes unique.
    tables["manifests"] = _first_seen(tables["manifests"], "digest")
    return size, tables


def batch_tables(batch: Batch, snapshot_digest: str, parser_version: str) -> dict[str, pa.Table]:
    """The batch's record tables, in input order; duplicate externalIds are the caller's."""
    quarantine = [batch.others[p] for p in sorted(batch.others)]
    tables = {
        "quarantine": pa.Table.from_arrays(
            [
                pa.repeat(pa.scalar(snapshot_digest, pa.string()), len(quarantine)),
                pa.repeat(pa.scalar(parser_version, pa.string()), len(quarantine)),
                pa.array([o.source_line for o in quarantine], pa.int64()),
                pa.array([o.reason for o in quarantine], pa.string()),
                pa.array([o.detail for o in quarantine], pa.string()),
                pa.array([o.pointer for o in quarantine], pa.string()),
                pa.array([o.raw for o in quarantine], pa.string()),
            ],
            schema=SCHEMAS["quarantine"],
        )
    }
    if batch.runs is None:
        return {name: tables.get(name, SCHEMAS[name].empty_table()) for name in NAMES}
    runs = batch.runs
    index = np.flatnonzero([p not in batch.others for p in runs.positions])
    rows = _Standing(runs, index, snapshot_digest, parser_version)
    tables["runs"] = _run_table(rows)
    tables["manifests"] = _manifest_table(rows)
    tables["lineage"] = tables["runs"].select(SCHEMAS["lineage"].names)
    return tables


@dataclass(slots=True)
class _Standing:
    """The runs that stand (not quarantined as duplicates), as indices into Runs."""

    runs: Runs
    index: np.ndarray
    snapshot_digest: str
    parser_version: str

    def by(self, ids: np.ndarray, values: Sequence[Any], kind: pa.DataType) -> pa.Array:
        """Per-row values from per-distinct ones, by each row's dictionary code."""
        return pa.array(values, kind).take(pa.array(ids[self.index]))

    def column(self, values: pa.Array) -> pa.Array:
        """The standing rows of a Runs column: all of it, uncopied, when all stand."""
        if len(self.index) == len(values):  # the index is sorted and distinct: every row
            return values
        return values.take(pa.array(self.index))

    def constant(self, value: Any, kind: pa.DataType, size: int | None = None) -> pa.Array:
        """`value` on each row (or on `size` rows)."""
        return pa.repeat(pa.scalar(value, kind), len(self.index) if size is None else size)


def _run_table(rows: _Standing) -> pa.Table:
    runs = rows.runs
    by_series = _series_columns(runs.series)
    by_workload = _workload_columns(runs.workloads)
    string = pa.string()
    columns: dict[str, pa.Array] = {
        "run_digest": rows.column(runs.digests),
        "external_id": rows.column(runs.external_ids),
        "status": rows.constant(STATUS, string),
        "observed_at": rows.by(runs.stamp_ids, [s.observed_at for s in runs.stamps], string).cast(
            UTC_US
        ),
        "median": pa.array(runs.values[rows.index, 0]),
        "p20": pa.array(runs.values[rows.index, 1]),
        "p80": pa.array(runs.values[rows.index, 2]),
        "liger_version": rows.by(runs.version_ids, [v or None for v in runs.versions], string),
        "origin": rows.constant(ORIGIN, string),
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


def _series_columns(series: Sequence[Series]) -> dict[str, list[str]]:
    """The run columns a series decides, one value per distinct series."""
    columns: dict[str, list[str]] = {}
    for s in series:
        _, _, implementation, protocol, environment = s.references
        metric, unit = stored_metric(s.memory)
        values = {
            "metric": metric,
            "unit": unit,
            "kernel": s.kernel,
            "provider": s.provider,
            "mode": s.mode,
            "gpu": s.gpu,
            "architecture": s.architecture,
            "implementation_digest": implementation.digest,
            "protocol_digest": protocol.digest,
            "environment_digest": environment.digest,
        }
        for name, value in values.items():
            columns.setdefault(name, []).append(value)
    return columns


def _workload_columns(workloads: Sequence[Workload]) -> dict[str, list[str]]:
    return {
        "operation_digest": [w.record.manifest["spec"]["operationSpecDigest"] for w in workloads],
        "workload_digest": [w.record.digest for w in workloads],
        "dtype": [w.dtype for w in workloads],
        "case_key": [w.case_key for w in workloads],
    }


def _series_keys(
    rows: _Standing, by_series: dict[str, list[str]], by_workload: dict[str, list[str]]
) -> pa.Array:
    """record_objects.run_series_key of each run, once per distinct series and workload."""
    runs = rows.runs
    pairs, codes = np.unique(
        np.stack([runs.series_ids[rows.index], runs.workload_ids[rows.index]], axis=1),
        axis=0,
        return_inverse=True,
    )
    keys = []
    for series, workload in pairs.tolist():
        readable = {name: values[series] for name, values in by_series.items()}
        readable |= {"case_key": by_workload["case_key"][workload], "origin": ORIGIN}
        keys.append(run_series_key(readable, {}))
    return pa.array(np.array(keys, dtype=np.int64)[codes.reshape(-1)])


def _manifest_table(rows: _Standing) -> pa.Table:
    """The manifests of the standing runs, each at the first row that references it, in the
    order a row's records list them (model.references)."""
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
    order = np.lexsort((slots, at))
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
    return _first_seen(table, "digest")


def _first_rows(rows: _Standing, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct codes of the standing rows, and the index (among them) of each one's first
    row."""
    return np.unique(ids[rows.index], return_index=True)


# Where a series' records (Series.references: operation, project, implementation, protocol,
# environment) go among a run's references: all slots but the workload's.
SERIES_SLOTS = np.array([slot for slot in range(6) if slot != WORKLOAD_SLOT], dtype=np.int64)


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
