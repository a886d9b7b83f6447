"""Step 5: a batch's record tables (runs, manifests, quarantine, lineage), column by column:
Python runs once per distinct series and workload, Arrow does the rest. The tables are those
RecordSetBuilder makes of the batch's outcomes in input order
(tests/sources/liger/test_liger_tables.py): a manifest met twice keeps its first row.

Many small files are read together (`files_record_tables`): their batches hold several files'
rows, each row keeps its file, and each file's rows of a table are a run of that table's rows,
cut out at the end. What is per file (its snapshot, its first manifests) is keyed by the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.records import Record
from pipelines.records.record_objects import (
    MEASURED_FIELDS,
    SCHEMAS,
    UTC_US,
    run_series_key,
)
from pipelines.sources.liger.columnar import BATCH_ROWS, Batch, Runs, files_batches
from pipelines.sources.liger.model import WORKLOAD_SLOT, Normalizer, Series, Workload
from pipelines.sources.liger.read import LigerCsv, NotLigerCsv, open_liger_csv
from pipelines.sources.liger.rules import ORIGIN, STATUS, stored_metric
from pipelines.sources.seen_keys import SeenKeys

NAMES = ("runs", "manifests", "quarantine", "lineage")


def record_tables(
    stream: BinaryIO,
    snapshot_digest: str,
    parser_version: str,
    normalizer: Normalizer | None = None,
    rows: int = BATCH_ROWS,
) -> tuple[int, dict[str, pa.Table]]:
    """(rows read, record tables) of a whole Liger CSV, batch by batch; raises NotLigerCsv."""
    return files_record_tables([(stream, snapshot_digest)], parser_version, normalizer, rows).of(0)


@dataclass(slots=True)
class FilesTables:
    """Several files' record tables, read together: a file's rows of a table are `sizes[name][i]`
    rows from `starts[name][i]` on, in the file's order. A file that is no Liger CSV has its
    error instead."""

    rows: np.ndarray  # rows read, by file
    tables: dict[str, pa.Table]
    starts: dict[str, np.ndarray]
    sizes: dict[str, np.ndarray]
    errors: dict[int, NotLigerCsv]

    def of(self, file: int) -> tuple[int, dict[str, pa.Table]]:
        """(rows read, record tables) of one file; raises its NotLigerCsv."""
        error = self.errors.get(file)
        if error is not None:
            raise error
        tables = {
            name: table.slice(int(self.starts[name][file]), int(self.sizes[name][file]))
            for name, table in self.tables.items()
        }
        return int(self.rows[file]), tables


def files_record_tables(
    files: Sequence[tuple[Iterable[bytes], str]],
    parser_version: str,
    normalizer: Normalizer | None = None,
    rows: int = BATCH_ROWS,
) -> FilesTables:
    """The record tables of Liger CSVs (binary lines, snapshot digest), read together: the files
    of one header in one run of batches, each file's rule (duplicate externalIds, first
    manifests) its own."""
    errors: dict[int, NotLigerCsv] = {}
    by_header: dict[tuple[str, ...], list[tuple[int, LigerCsv]]] = {}
    for i, (stream, _) in enumerate(files):
        try:
            csv_file = open_liger_csv(stream)
        except NotLigerCsv as error:
            errors[i] = error
            continue
        by_header.setdefault(csv_file.columns, []).append((i, csv_file))
    read = np.zeros(len(files), dtype=np.int64)
    parts: dict[str, list[pa.Table]] = {name: [] for name in NAMES}
    owners: dict[str, list[np.ndarray]] = {name: [] for name in NAMES}
    for members in by_header.values():
        indices = np.array([i for i, _ in members], dtype=np.int64)
        digests = [files[i][1] for i in indices.tolist()]
        csv_files = [csv_file for _, csv_file in members]
        for batch in files_batches(csv_files, normalizer, rows, SeenKeys()):
            read[indices] += np.bincount(batch.files, minlength=len(indices))
            tables, of_file = pass_tables(batch, digests, parser_version)
            for name, table in tables.items():
                parts[name].append(table)
                owners[name].append(indices[of_file[name]])
    tables = {
        name: pa.concat_tables(tables) if tables else SCHEMAS[name].empty_table()
        for name, tables in parts.items()
    }
    files_of = {
        name: np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        for name, arrays in owners.items()
    }
    # A manifest an earlier batch of its file had keeps that batch's row. Runs need no such
    # check: a run's digest covers its externalId, which the file's rule makes unique.
    tables["manifests"], files_of["manifests"] = _first_seen(
        tables["manifests"], "digest", files_of["manifests"]
    )
    starts, sizes = {}, {}
    for name, owner in files_of.items():
        # A file's rows are consecutive: files are read in order, a header's after another's.
        sizes[name] = np.bincount(owner, minlength=len(files))
        starts[name] = np.zeros(len(files), dtype=np.int64)
        present, first = np.unique(owner, return_index=True)
        starts[name][present] = first
    return FilesTables(read, tables, starts, sizes, errors)


def batch_tables(batch: Batch, snapshot_digest: str, parser_version: str) -> dict[str, pa.Table]:
    """The record tables of a batch of one file, in input order; duplicate externalIds are the
    caller's."""
    return pass_tables(batch, [snapshot_digest], parser_version)[0]


def pass_tables(
    batch: Batch, snapshot_digests: Sequence[str], parser_version: str
) -> tuple[dict[str, pa.Table], dict[str, np.ndarray]]:
    """The batch's record tables, in input order, and each table row's file (its index into
    `snapshot_digests`); duplicate externalIds are the caller's."""
    positions = sorted(batch.others)
    quarantine = [batch.others[p] for p in positions]
    quarantine_files = batch.files[positions]
    tables = {
        "quarantine": pa.Table.from_arrays(
            [
                _of_files(snapshot_digests, quarantine_files),
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
    files = {"quarantine": quarantine_files}
    none = np.zeros(0, dtype=batch.files.dtype)
    if batch.runs is None:
        tables = {name: tables.get(name, SCHEMAS[name].empty_table()) for name in NAMES}
        return tables, {name: files.get(name, none) for name in NAMES}
    runs = batch.runs
    index = np.flatnonzero([p not in batch.others for p in runs.positions])
    run_files = batch.files[np.array(runs.positions, dtype=np.int64)[index]]
    rows = _Standing(runs, index, run_files, snapshot_digests, parser_version)
    tables["runs"] = _run_table(rows)
    tables["manifests"], files["manifests"] = _manifest_table(rows)
    tables["lineage"] = tables["runs"].select(SCHEMAS["lineage"].names)
    files["runs"] = files["lineage"] = run_files
    return tables, files


def _of_files(values: Sequence[str], files: np.ndarray) -> pa.Array:
    """Each row's file's value."""
    return pa.array(values, pa.string()).take(pa.array(files))


@dataclass(slots=True)
class _Standing:
    """The runs that stand (not quarantined as duplicates), as indices into Runs."""

    runs: Runs
    index: np.ndarray
    files: np.ndarray  # each standing run's file
    snapshot_digests: Sequence[str]  # by file
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
        **_statistic_columns(rows),
        "liger_version": rows.by(runs.version_ids, [v or None for v in runs.versions], string),
        "origin": rows.constant(ORIGIN, string),
        "series_key": _series_keys(rows, by_series, by_workload),
        "parser_version": rows.constant(rows.parser_version, string),
        "snapshot_digest": _of_files(rows.snapshot_digests, rows.files),
        "source_line": rows.column(runs.lines),
        "manifest": rows.column(runs.manifests),
    }
    for name, values in by_series.items():
        columns.setdefault(name, rows.by(runs.series_ids, values, string))
    for name, values in by_workload.items():
        columns.setdefault(name, rows.by(runs.workload_ids, values, string))
    for name, kind in MEASURED_FIELDS:  # a worker's statistics: none in a Liger CSV but mean
        columns.setdefault(name, pa.nulls(len(rows.index), kind))
    schema = SCHEMAS["runs"]
    return pa.Table.from_arrays([columns[name] for name in schema.names], schema=schema)


# The run columns a stored statistic of a row goes to (the others are null).
STATISTIC_COLUMNS = ("median", "p20", "p80", "mean")


def _statistic_columns(rows: _Standing) -> dict[str, pa.Array]:
    """Each run's stored statistics under their own columns: a layout's statistic the row
    holds, null where its layout has no such statistic or the row left it empty."""
    runs = rows.runs
    values = runs.values[rows.index]
    series_ids = runs.series_ids[rows.index]
    columns = {}
    for name in STATISTIC_COLUMNS:
        # Where each series holds `name` among its layout's value columns (-1: it does not).
        at = np.array(
            [s.statistics.names.index(name) if name in s.present else -1 for s in runs.series],
            dtype=np.int64,
        )[series_ids]
        held = at >= 0
        picked = values[np.arange(len(values)), np.where(held, at, 0)] if len(values) else at
        columns[name] = pa.array(picked, pa.int64(), mask=~held)
    return columns


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


def _manifest_table(rows: _Standing) -> tuple[pa.Table, np.ndarray]:
    """The manifests of the standing runs, each at the first row of its file that references
    it, in the order a row's records list them (model.references); and each one's file."""
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
    files = rows.files[at[order]]
    table = pa.Table.from_arrays(
        [
            pa.array([r.digest for r in records], pa.string()),
            pa.array([r.kind for r in records], pa.string()),
            pa.array([r.manifest.get("metadata", {}).get("name") for r in records], pa.string()),
            rows.constant(rows.parser_version, pa.string(), len(records)),
            _of_files(rows.snapshot_digests, files),
            pa.array(lines, pa.int64()),
            pa.array([r.manifest_json for r in records], pa.string()),
        ],
        schema=SCHEMAS["manifests"],
    )
    return _first_seen(table, "digest", files)


def _first_rows(rows: _Standing, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct codes of the standing rows of each file, and the index (among them) of
    each one's first row in its file."""
    width = int(ids.max()) + 1 if len(ids) else 1
    keys, first = np.unique(
        rows.files.astype(np.int64) * width + ids[rows.index], return_index=True
    )
    return keys % width, first


# Where a series' records (Series.references: operation, project, implementation, protocol,
# environment) go among a run's references: all slots but the workload's.
SERIES_SLOTS = np.array([slot for slot in range(6) if slot != WORKLOAD_SLOT], dtype=np.int64)


def _first_seen(table: pa.Table, column: str, files: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """The rows of `table` whose `column` value no earlier row of their file has, and their
    files."""
    if not len(table):
        return table, files
    values = table.column(column).combine_chunks()
    codes = pc.dictionary_encode(values, null_encoding="encode").indices.to_numpy()
    keys = files.astype(np.int64) * (int(codes.max()) + 1) + codes
    first = np.zeros(len(keys), dtype=bool)
    first[np.unique(keys, return_index=True)[1]] = True  # each key's first row
    if first.all():
        return table, files
    return table.filter(pa.array(first)), files[first]
