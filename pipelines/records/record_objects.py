"""Record objects: the normalized outcomes of one snapshot, written as a few large Parquet objects.

A batch of files writes one folder, named by when it was written:

    records/batches/<written at>-<id>/runs.parquet        one row per run (BenchmarkRun)
    records/batches/<written at>-<id>/manifests.parquet   every other manifest, once
    records/batches/<written at>-<id>/quarantine.parquet  rows kept aside, with reasons
    records/batches/<written at>-<id>/lineage.parquet     (line, run digest) of a run row
    records/batches/<written at>-<id>/sets.json           summaries and reads; written last

The Parquet objects hold the rows of all the batch's small record sets; `sets.json` holds each
record set's summary, which claims its rows by snapshot digest and parser version and names the
objects under "files", and each file's read (the object version it was read as). So a file costs
the bucket no object of its own, and a batch whose `sets.json` never came (a crash mid-write)
adds nothing and is redone. A record set of many runs (a large harness file) holds its tables in
a prefix of its own instead, keyed by parser version so a later parser can re-process old
snapshots without touching what an earlier one wrote:

    records/<parser_version>/<snapshot hex>/runs-<attempt>-000.parquet   parts, as spooled
    records/<parser_version>/<snapshot hex>/manifests.parquet            (and the others)

Homes written before batch files have a `summary.json` and `reads/<read id>.json` in each record
set's prefix, which read as before.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.records import Record, RowOutcome, RunFacts

RECORD_FILES = ("runs", "manifests", "quarantine", "lineage")
SUMMARY_FILE = "summary.json"
READS_DIR = "reads"
SETS_FILE = "sets.json"  # in a batch's folder: its record sets' summaries and reads, written last
PREVIEW_ROWS = 5
RUN_PREVIEW_COLUMNS = [
    "source_line",
    "kernel",
    "provider",
    "mode",
    "metric",
    "gpu",
    "case_key",
    "median",
    "run_digest",
]
QUARANTINE_PREVIEW_COLUMNS = ["source_line", "reason", "detail"]

# A few rows of a table, for a person to glance at: values as JSON gives them.
PreviewRow = dict[str, object]


class RecordSetSummary(TypedDict):
    """What the bucket says of one record set: in a batch's sets file (or a `summary.json` of
    a home written before those files, which lacks what is marked NotRequired): whose rows it
    holds, the objects holding them, its counts and previews."""

    snapshot_digest: str
    parser_version: str
    source: str
    rows: int  # rows read from the source
    runs: int
    lineage: NotRequired[int]
    # The objects holding each table's rows, by table (see `object_names`); none named: the
    # table's `<table>.parquet` in the set's prefix.
    files: NotRequired[dict[str, list[str]]]
    runs_by_metric: dict[str, int]
    quarantined: NotRequired[int]
    quarantined_by_reason: dict[str, int]
    manifests_by_kind: dict[str, int]
    run_preview: NotRequired[list[PreviewRow]]
    quarantine_preview: NotRequired[list[PreviewRow]]
    written_at: NotRequired[str]


# Iceberg's unit: a record set's runs are data files of the index as they are.
UTC_US = pa.timestamp("us", tz="UTC")

# The supersession series of a run: the same case measured again (kernel, provider, mode, metric,
# GPU, case key). Stored as a 64-bit hash so the index can find a series by scanning one column.
SERIES_FIELDS = ("kernel", "provider", "mode", "metric", "gpu", "case_key")

# What worker bundles carry and Liger's CSV does not (NULL for reported runs): statistics in
# the run's unit, the environment's software and device settings (JSON text), correctness.
MEASURED_FIELDS: list[tuple[str, pa.DataType]] = [
    ("samples", pa.int64()),
    ("mean", pa.int64()),
    ("p05", pa.int64()),
    ("p95", pa.int64()),
    ("minimum", pa.int64()),
    ("maximum", pa.int64()),
    ("mad", pa.int64()),
    ("ci95_low", pa.int64()),
    ("ci95_high", pa.int64()),
    ("correctness_comparator", pa.string()),
    ("matched_ratio", pa.float64()),
    ("correctness", pa.string()),
    ("driver", pa.string()),
    ("cuda_toolkit", pa.string()),
    ("framework", pa.string()),
    ("framework_version", pa.string()),
    ("software", pa.string()),
    ("device_settings", pa.string()),
    ("gpu_count", pa.int64()),
    ("gpu_memory_bytes", pa.int64()),
    ("protocol_family", pa.string()),
    ("project", pa.string()),
    ("implementation_version", pa.string()),
    ("bundle_pointer", pa.string()),
]

RUN_SCHEMA = pa.schema(
    [
        ("run_digest", pa.string()),
        ("external_id", pa.string()),
        ("operation_digest", pa.string()),
        ("workload_digest", pa.string()),
        ("implementation_digest", pa.string()),
        ("protocol_digest", pa.string()),
        ("environment_digest", pa.string()),
        ("metric", pa.string()),
        ("unit", pa.string()),
        ("status", pa.string()),
        ("observed_at", UTC_US),
        ("kernel", pa.string()),
        ("provider", pa.string()),
        ("mode", pa.string()),
        ("gpu", pa.string()),
        ("architecture", pa.string()),
        ("dtype", pa.string()),
        ("case_key", pa.string()),
        ("median", pa.int64()),
        ("p20", pa.int64()),
        ("p80", pa.int64()),
        ("liger_version", pa.string()),
        ("origin", pa.string()),
        *MEASURED_FIELDS,
        ("series_key", pa.int64()),
        ("parser_version", pa.string()),
        ("snapshot_digest", pa.string()),
        ("source_line", pa.int64()),
        ("manifest", pa.string()),
    ]
)

MANIFEST_SCHEMA = pa.schema(
    [
        ("digest", pa.string()),
        ("kind", pa.string()),
        ("name", pa.string()),
        ("parser_version", pa.string()),
        ("snapshot_digest", pa.string()),
        ("source_line", pa.int64()),
        ("manifest", pa.string()),
    ]
)

QUARANTINE_SCHEMA = pa.schema(
    [
        ("snapshot_digest", pa.string()),
        ("parser_version", pa.string()),
        ("source_line", pa.int64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("pointer", pa.string()),
        ("raw", pa.string()),
    ]
)

LINEAGE_SCHEMA = pa.schema(
    [
        ("snapshot_digest", pa.string()),
        ("parser_version", pa.string()),
        ("source_line", pa.int64()),
        ("run_digest", pa.string()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "runs": RUN_SCHEMA,
    "manifests": MANIFEST_SCHEMA,
    "quarantine": QUARANTINE_SCHEMA,
    "lineage": LINEAGE_SCHEMA,
}


def series_key(values: Iterable[object]) -> int:
    """A stable signed 64-bit hash of a run's series fields (None and "" differ)."""
    text = "\x1f".join("\x00" if v is None else str(v) for v in values)
    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True
    )


def json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


@dataclass(slots=True)
class RecordSetBuilder:
    """Accumulates the outcomes of one snapshot column by column (no per-row objects kept)."""

    snapshot_digest: str
    parser_version: str
    rows: int = 0
    runs: dict[str, list[Any]] = field(default_factory=lambda: {n: [] for n in RUN_SCHEMA.names})
    manifests: dict[str, list[Any]] = field(
        default_factory=lambda: {n: [] for n in MANIFEST_SCHEMA.names}
    )
    quarantine: dict[str, list[Any]] = field(
        default_factory=lambda: {n: [] for n in QUARANTINE_SCHEMA.names}
    )
    lineage: dict[str, list[Any]] = field(
        default_factory=lambda: {n: [] for n in LINEAGE_SCHEMA.names}
    )
    runs_by_metric: Counter[str] = field(default_factory=Counter)
    quarantined_by_reason: Counter[str] = field(default_factory=Counter)
    manifests_by_kind: Counter[str] = field(default_factory=Counter)
    seen_runs: set[str] = field(default_factory=set)
    seen_manifests: set[str] = field(default_factory=set)
    # The runs and lineage rows already written out as Parquet parts (`spool`), by table.
    spooled: dict[str, list[Path]] = field(default_factory=dict)
    spooled_facts: PartFacts = field(default_factory=lambda: PartFacts())

    def add(self, outcome: RowOutcome) -> None:
        self.rows += 1
        if outcome.status != "ok" or not outcome.records:
            self._add_quarantine(outcome)
            return
        for record in outcome.records:
            if record.kind == "BenchmarkRun":
                self._add_run(record, outcome)
            elif record.digest not in self.seen_manifests:
                self._add_manifest(record, outcome.source_line)

    def _add_quarantine(self, outcome: RowOutcome) -> None:
        reason = outcome.reason or "unknown"
        self.quarantined_by_reason[reason] += 1
        q = self.quarantine
        q["snapshot_digest"].append(self.snapshot_digest)
        q["parser_version"].append(self.parser_version)
        q["source_line"].append(outcome.source_line)
        q["reason"].append(reason)
        q["detail"].append(outcome.detail)
        q["pointer"].append(outcome.pointer)
        q["raw"].append(outcome.raw)

    def _add_manifest(self, record: Record, line: int) -> None:
        self.seen_manifests.add(record.digest)
        self.manifests_by_kind[record.kind] += 1
        m = self.manifests
        m["digest"].append(record.digest)
        m["kind"].append(record.kind)
        m["name"].append(record.manifest.get("metadata", {}).get("name"))
        m["parser_version"].append(self.parser_version)
        m["snapshot_digest"].append(self.snapshot_digest)
        m["source_line"].append(line)
        m["manifest"].append(record.manifest_json)

    def _add_run(self, record: Record, outcome: RowOutcome) -> None:
        self.lineage["snapshot_digest"].append(self.snapshot_digest)
        self.lineage["parser_version"].append(self.parser_version)
        self.lineage["source_line"].append(outcome.source_line)
        self.lineage["run_digest"].append(record.digest)
        if record.digest in self.seen_runs:
            return  # the same run twice in one file: one run row, two lineage rows
        self.seen_runs.add(record.digest)
        for name, value in run_columns(record, outcome).items():
            self.runs[name].append(value)
        self.runs["parser_version"].append(self.parser_version)
        self.runs["snapshot_digest"].append(self.snapshot_digest)
        self.runs["source_line"].append(outcome.source_line)
        self.runs_by_metric[self.runs["metric"][-1] or "unknown"] += 1

    def tables(self) -> dict[str, pa.Table]:
        columns = {
            "runs": self.runs,
            "manifests": self.manifests,
            "quarantine": self.quarantine,
            "lineage": self.lineage,
        }
        return {name: table_from_columns(cols, SCHEMAS[name]) for name, cols in columns.items()}

    @property
    def unspooled_runs(self) -> int:
        return len(self.runs["run_digest"])

    def spool(self, parts_dir: Path) -> None:
        """Write the runs and lineage rows gathered since the last spool as Parquet parts in
        `parts_dir`, and let them go: a file of many runs is built in bounded memory (its
        manifests and quarantine rows, far fewer or far smaller, stay in memory)."""
        tables = {
            "runs": table_from_columns(self.runs, RUN_SCHEMA),
            "lineage": table_from_columns(self.lineage, LINEAGE_SCHEMA),
        }
        self.spooled_facts.add(PartFacts.of(tables))
        for name, table in tables.items():
            parts = self.spooled.setdefault(name, [])
            path = parts_dir / f"{name}-{len(parts):05d}.parquet"
            write_parquet(table, path)
            parts.append(path)
        self.runs = {n: [] for n in RUN_SCHEMA.names}
        self.lineage = {n: [] for n in LINEAGE_SCHEMA.names}

    def content(self, parts_dir: Path | None = None) -> RecordSetContent:
        """The record set: its tables in memory, or (once spooled) its runs and lineage as
        parts, the last rows spooled too."""
        if not self.spooled:
            return RecordSetContent(self.rows, self.tables())
        assert parts_dir is not None, "a spooled record set ends in its parts folder"
        if self.unspooled_runs or self.lineage["run_digest"]:
            self.spool(parts_dir)
        tables = self.tables()
        return RecordSetContent(
            self.rows,
            {name: tables[name] for name in ("manifests", "quarantine")},
            parts=dict(self.spooled),
            part_facts=self.spooled_facts,
        )


def run_columns(record: Record, outcome: RowOutcome) -> dict[str, Any]:
    """The readable and referenced columns of one run (all but snapshot_digest/source_line)."""
    facts = outcome.facts
    spec: Mapping[str, Any] = record.manifest.get("spec", {})
    by_digest = {r.digest: r for r in outcome.records}
    workload = by_digest.get(spec.get("workloadDigest", ""))
    operation_digest = workload.manifest["spec"].get("operationSpecDigest") if workload else None
    readable: dict[str, Any] = {
        "metric": facts.metric if facts else None,
        "unit": facts.unit if facts else None,
        "observed_at": facts.observed_at if facts else spec.get("observedAt"),
        "kernel": facts.kernel if facts else None,
        "provider": facts.provider if facts else None,
        "mode": facts.mode if facts else None,
        "gpu": facts.gpu if facts else None,
        "architecture": facts.architecture if facts else None,
        "dtype": facts.dtype if facts else None,
        "case_key": facts.case_key if facts else None,
        "median": facts.median if facts else None,
        "p20": facts.p20 if facts else None,
        "p80": facts.p80 if facts else None,
        "liger_version": facts.liger_version if facts else None,
        "origin": facts.origin if facts else None,
    }
    return {
        "run_digest": record.digest,
        "external_id": facts.external_id
        if facts
        else spec.get("sourceNative", {}).get("externalId"),
        "operation_digest": operation_digest,
        "workload_digest": spec.get("workloadDigest"),
        "implementation_digest": spec.get("implementationDigest"),
        "protocol_digest": spec.get("protocolDigest"),
        "environment_digest": spec.get("environmentDigest"),
        "status": spec.get("status"),
        **readable,
        **measured_columns(facts),
        "series_key": run_series_key(readable, spec),
        "manifest": record.manifest_json,
    }


def run_series_key(readable: Mapping[str, Any], spec: Mapping[str, Any]) -> int:
    """A measured run is re-measured only under the same protocol and environment: a worker's
    run never supersedes a reported (CSV) run, nor one measured another way or elsewhere."""
    values = [readable[f] for f in SERIES_FIELDS]
    if readable["origin"] == "measured":
        values += ["measured", spec.get("protocolDigest"), spec.get("environmentDigest")]
    return series_key(values)


def measured_columns(facts: RunFacts | None) -> dict[str, Any]:
    """The MEASURED_FIELDS of a run, from `RunFacts.extra` (see
    pipelines/sources/bundles/facts.py)."""
    extra: dict[str, Any] = facts.extra if facts else {}
    software = extra.get("software") or {}
    framework = software.get("framework") or {}
    correctness = extra.get("correctness") or {}
    ratio = correctness.get("matchedRatio")
    return {
        "samples": extra.get("samples"),
        "mean": extra.get("mean"),
        "p05": extra.get("p05"),
        "p95": extra.get("p95"),
        "minimum": extra.get("min"),
        "maximum": extra.get("max"),
        "mad": extra.get("mad"),
        "ci95_low": extra.get("ci95_low"),
        "ci95_high": extra.get("ci95_high"),
        "correctness_comparator": correctness.get("comparator"),
        "matched_ratio": float(ratio) if isinstance(ratio, int | float) else None,
        "correctness": json_text(correctness) if correctness else None,
        "driver": software.get("driver"),
        "cuda_toolkit": software.get("cudaToolkit"),
        "framework": framework.get("name"),
        "framework_version": framework.get("version"),
        "software": json_text(software) if software else None,
        "device_settings": json_text(extra["settings"]) if extra.get("settings") else None,
        "gpu_count": extra.get("gpu_count"),
        "gpu_memory_bytes": extra.get("memory_bytes"),
        "protocol_family": extra.get("protocol_family"),
        "project": extra.get("project"),
        "implementation_version": extra.get("implementation_version"),
        "bundle_pointer": extra.get("pointer"),
    }


def table_from_columns(columns: Mapping[str, list[Any]], schema: pa.Schema) -> pa.Table:
    arrays = []
    for column in schema:
        values = columns[column.name]
        if column.type == UTC_US:
            arrays.append(pa.array(values, pa.string()).cast(UTC_US))
        else:
            arrays.append(pa.array(values, column.type))
    return pa.Table.from_arrays(arrays, schema=schema)


ROW_GROUP_ROWS = 256 * 1024
# Columns with a value of their own on nearly every row: a dictionary only costs there.
DISTINCT_PER_ROW = frozenset(
    {"run_digest", "external_id", "digest", "manifest", "raw", "series_key", "source_line"}
    | {"median", "p20", "p80", "observed_at"}
)
# Long texts nobody filters on: their min/max statistics only cost.
UNFILTERED = frozenset({"manifest", "raw", "detail"})


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How record objects are encoded, whoever writes them."""
    return {
        "compression": "zstd",
        "use_dictionary": [name for name in schema.names if name not in DISTINCT_PER_ROW],
        "write_statistics": [name for name in schema.names if name not in UNFILTERED],
    }


# Where Parquet keeps a column's Iceberg field ID (pyarrow's field metadata key).
FIELD_ID_KEY = b"PARQUET:field_id"


def with_positional_field_ids(table: pa.Table) -> pa.Table:
    """The table, each column carrying its position (from 1) as its field ID: the IDs Iceberg
    gives a flat table's columns when it creates it, so a record set's manifests file can join
    manifest_segments as it is (publish.table_files checks them against the table's)."""
    schema = pa.schema(
        [f.with_metadata({FIELD_ID_KEY: str(i)}) for i, f in enumerate(table.schema, 1)],
        metadata=table.schema.metadata,
    )
    return table.cast(schema)


def write_parquet(table: pa.Table, where: Any) -> None:
    """A record object, however it is stored (a path, a buffer)."""
    pq.write_table(
        with_positional_field_ids(table),
        where,
        row_group_size=ROW_GROUP_ROWS,
        **parquet_options(table.schema),
    )


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    write_parquet(table, sink)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def is_shared(name: str) -> bool:
    """Whether an object a record set's summary names is shared by its batch's record sets (a
    key, holding a slash), whose rows are told apart by their snapshot_digest and
    parser_version columns; else it is a name in the set's own prefix, holding its rows only."""
    return "/" in name


def record_object_key(prefix: str, name: str) -> str:
    """The key of an object a record set's summary names (`prefix`: the set's)."""
    return name if is_shared(name) else prefix + name


def object_names(name: str, parts: int | None, attempt: str) -> list[str]:
    """A table's object names in a record set: `<name>.parquet`, or its parts. Parts are named
    by the write `attempt` too: how rows split into parts depends on the writer (its number of
    workers), so two writers of one record set must not overwrite each other's parts; the
    summary, written last, names the parts of one of them."""
    if parts is None:
        return [f"{name}.parquet"]
    return [f"{name}-{attempt}-{i:03d}.parquet" for i in range(parts)]


@dataclass(slots=True)
class PartFacts:
    """What a record set's summary says of the tables spooled as Parquet parts
    (the runs), gathered segment by segment in input order."""

    rows: Counter[str] = field(default_factory=Counter)  # by table
    runs_by_metric: Counter[str] = field(default_factory=Counter)
    run_preview: list[PreviewRow] = field(default_factory=list)

    @classmethod
    def of(cls, tables: Mapping[str, pa.Table]) -> PartFacts:
        runs = tables["runs"]
        return cls(
            Counter({name: table.num_rows for name, table in tables.items()}),
            Counter(value_counts(runs, "metric")),
            preview(runs, RUN_PREVIEW_COLUMNS),
        )

    def add(self, later: PartFacts) -> None:
        """Fold in the facts of later rows."""
        self.rows.update(later.rows)
        self.runs_by_metric.update(later.runs_by_metric)
        self.run_preview = (self.run_preview + later.run_preview)[:PREVIEW_ROWS]


@dataclass(slots=True)
class RecordSetContent:
    """A record set before it is written: tables in memory (one Parquet object each), and
    tables already encoded as Parquet parts (a large file's runs, spooled), with their facts."""

    rows: int  # rows read from the source
    tables: dict[str, pa.Table]
    parts: dict[str, list[Path]] = field(default_factory=dict)
    part_facts: PartFacts = field(default_factory=PartFacts)
    # The lineage table is the runs objects' LINEAGE_SCHEMA columns: in a record set each run
    # is unique and held by one row, its own (snapshot, parser, line), so nothing else is written.
    lineage_in_runs: bool = False

    def row_count(self, name: str) -> int:
        if name == "lineage" and self.lineage_in_runs:
            name = "runs"
        table = self.tables.get(name)
        return table.num_rows if table is not None else self.part_facts.rows[name]

    def runs_by_metric(self) -> dict[str, int]:
        if "runs" in self.parts:
            return dict(sorted(self.part_facts.runs_by_metric.items()))
        return value_counts(self.tables["runs"], "metric")

    def run_preview(self) -> list[PreviewRow]:
        if "runs" in self.parts:
            return self.part_facts.run_preview
        return preview(self.tables["runs"], RUN_PREVIEW_COLUMNS)


def value_counts(table: pa.Table, column: str) -> dict[str, int]:
    """Counts of a column's values (None counted as "unknown"), by value."""
    counts = Counter("unknown" if v is None else v for v in table.column(column).to_pylist())
    return dict(sorted(counts.items()))


def preview(table: pa.Table, columns: list[str], rows: int = PREVIEW_ROWS) -> list[PreviewRow]:
    present = [c for c in columns if c in table.column_names]
    return [
        {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
        for row in table.select(present).slice(0, rows).to_pylist()
    ]
