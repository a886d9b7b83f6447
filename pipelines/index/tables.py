"""The index's tables and the DuckDB views over them.

The stored tables (STORED_TABLES) are Iceberg tables in the bucket (see catalog.py). The same
view definitions serve the local database (`$KINDEX_HOME/index.duckdb`, over a local cache of
a version's data files), a connection that reads the bucket directly (`iceberg_scan` through
the pinned extensions), and the statements `kindex connect` prints: only the source of each
stored table differs.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from importlib import import_module, resources

import duckdb
import pyarrow as pa

from pipelines import curation, regressions
from pipelines.records.record_objects import (
    LINEAGE_SCHEMA,
    MANIFEST_SCHEMA,
    QUARANTINE_SCHEMA,
    RUN_SCHEMA,
    UTC_US,
)

# A run's stored row is what the `runs` view shows: the record set's columns, where the run was
# first seen (its snapshot's first read) and its current state, stored rather than recomputed
# by every query. A publish rewrites the rows whose state it changes (publish.py). Two hidden
# columns keep what changes small: `head_of_version` (the run is its series' newest of its Liger
# version: the one row `version_changes` reads of each) and `live` (the run is latest or a head:
# the only rows a later publish may change, unless a run arrives older than its series' newest).
# A data file holds live rows only or settled rows only, so a publish rewrites the few live files
# and appends settled ones; a settled file is rewritten only for a late run of its series or a
# snapshot whose first read moved.
_RUN_TAIL = ("snapshot_digest", "source_line", "manifest")
RUN_STATE_FIELDS = (
    pa.field("superseded_by", pa.string()),
    pa.field("retracted_in_source", pa.bool_()),
)
HIDDEN_RUN_COLUMNS = ("head_of_version", "live")
RUN_SEGMENT_SCHEMA = pa.schema(
    [
        *(f for f in RUN_SCHEMA if f.name not in _RUN_TAIL),
        RUN_SCHEMA.field("snapshot_digest"),
        pa.field("source_key", pa.string()),
        RUN_SCHEMA.field("source_line"),
        *RUN_STATE_FIELDS,
        RUN_SCHEMA.field("manifest"),
        pa.field("head_of_version", pa.bool_()),
        pa.field("live", pa.bool_()),
    ]
)
# How a run's rows are ordered in a data file (the table's Iceberg sort order too): a filter on
# kernel, GPU or time skips the row groups (and, through the files' bounds, the files) it
# cannot match.
RUN_SORT_COLUMNS = ("kernel", "gpu", "observed_at")
MANIFEST_SEGMENT_SCHEMA = MANIFEST_SCHEMA
# Every stored row of the small tables carries the number of the version that added it.
SEQ_COLUMN = "index_seq"
SNAPSHOT_SCHEMA = pa.schema(
    [
        ("read_id", pa.string()),
        ("snapshot_digest", pa.string()),
        ("bucket", pa.string()),
        ("source_key", pa.string()),
        ("etag", pa.string()),
        ("version_id", pa.string()),
        ("size", pa.int64()),
        ("last_modified", UTC_US),
        ("taken_at", UTC_US),
        ("parser_version", pa.string()),
        ("processed_at", UTC_US),
        ("source", pa.string()),
        ("rows", pa.int64()),
        ("runs", pa.int64()),
        ("quarantined", pa.int64()),
        # The git commit a version was uploaded from, and its time (kindex put --git).
        ("commit", pa.string()),
        ("committed_at", UTC_US),
    ]
)

# The points of the regression verdicts (docs/regressions.md): one narrow row per run that a
# file measured (a new run, or a run of a file processed again), written once by the publish
# that adds it and only appended to, so the verdicts read every re-measurement of a series (the
# weekly runs of one version, the git history) without reading the runs' settled files. Its time
# is relative to the baseline provider measured in the same file and cohort (log_time; the
# run's own: log_absolute; `median` is the run's time, regressions.POINT_TIME_SQL); its place on
# the series' version axis is regressions.point_axis_sql's.
SERIES_POINT_SCHEMA = pa.schema(
    [
        ("kernel", pa.string()),
        ("provider", pa.string()),
        ("mode", pa.string()),
        ("metric", pa.string()),
        ("gpu", pa.string()),
        ("case_key", pa.string()),
        ("version", pa.string()),
        ("version_axis", pa.string()),
        ("version_key", pa.string()),
        ("point_at", UTC_US),
        ("observed_at", UTC_US),
        ("is_baseline", pa.bool_()),
        ("baseline_provider", pa.string()),
        ("median", pa.int64()),
        ("baseline_median", pa.int64()),
        ("log_time", pa.float64()),
        ("log_absolute", pa.float64()),
        ("run_digest", pa.string()),
        ("baseline_run_digest", pa.string()),
        ("snapshot_digest", pa.string()),
        ("parser_version", pa.string()),
    ]
)

# A snapshot's current record set: the parser version of its newest processing.
CURRENT_RECORD_SET = "arg_max(parser_version, coalesce(processed_at, taken_at))"

# The stored tables, and the columns the views read of each.
STORED_TABLES: dict[str, pa.Schema] = {
    "run_segments": RUN_SEGMENT_SCHEMA,
    "manifest_segments": MANIFEST_SEGMENT_SCHEMA,
    "snapshots": SNAPSHOT_SCHEMA,
    "lineage_files": LINEAGE_SCHEMA,
    "quarantine_files": QUARANTINE_SCHEMA,
    "series_points": SERIES_POINT_SCHEMA,
}

# Tables another part of kindex writes into the index's catalog (the intake's file ledger) and
# every reader of the index serves beside the index's own, as they are: the view's name (also the
# Iceberg table's, in the index's namespace) -> "module:attribute" of its pyarrow schema (the
# columns served; before the table exists its view is empty). Readers pin a served table's
# snapshot when they are set up: its newest (the local database when built or synced, `kindex
# connect`), or the one it had when the version was published (`--as-of`). A publish writes
# none, and reads only the ledger's rows committed since its version (index/committed.py).
SERVED_TABLES: dict[str, str] = {"file_ledger": "pipelines.intake.ledger:LEDGER_SCHEMA"}
# Views over the served tables, from the module that writes each: name -> "module:attribute" of
# its SELECT (the file ledger's `files`: each object version's newest row).
SERVED_VIEWS: dict[str, str] = {"files": "pipelines.intake.ledger:FILES_VIEW"}


def served_schemas() -> dict[str, pa.Schema]:
    """The served tables' schemas, by name (SERVED_TABLES)."""
    schemas = {}
    for name, where in SERVED_TABLES.items():
        module, _, attribute = where.partition(":")
        schemas[name] = getattr(import_module(module), attribute)
    return schemas


def served_views() -> dict[str, str]:
    """The served views' SELECTs, by name (SERVED_VIEWS)."""
    views = {}
    for name, where in SERVED_VIEWS.items():
        module, _, attribute = where.partition(":")
        views[name] = str(getattr(import_module(module), attribute))
    return views


def reader_tables() -> dict[str, pa.Schema]:
    """Every table a reader has a view of: the index's stored tables, then the served ones."""
    return {**STORED_TABLES, **served_schemas()}


# The tables people query (DESIGN.md section 6) and the derived views.
TABLES = (
    "runs",
    "operations",
    "workloads",
    "implementations",
    "projects",
    "protocols",
    "environments",
    "snapshots",
    "quarantine",
    "lineage",
)
VIEWS = (
    "cohorts",
    "latest_runs",
    "speedups",
    "version_changes",
    "regression_points",
    "regression_cases",
    "version_verdicts",
    "regressions",
    "improvements",
    "drift",
)

DUCKDB_TYPES = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    UTC_US: "TIMESTAMPTZ",
}

KIND_VIEWS: dict[str, tuple[str, str]] = {
    # view: (kind, readable columns extracted from the manifest)
    "operations": ("OperationSpec", "manifest->>'$.spec.family' AS family"),
    "workloads": (
        "WorkloadCase",
        "manifest->>'$.spec.operationSpecDigest' AS operation_digest, "
        "manifest->'$.spec.axes' AS axes",
    ),
    "implementations": (
        "ImplementationRevision",
        "manifest->>'$.spec.operation.specDigest' AS operation_digest, "
        "manifest->>'$.spec.projectRevision.projectDigest' AS project_digest, "
        "manifest->>'$.spec.callable.language' AS language",
    ),
    "projects": (
        "SoftwareProject",
        "manifest->>'$.spec.name' AS project_name, manifest->>'$.spec.repository' AS repository",
    ),
    "protocols": ("BenchmarkProtocol", "manifest->>'$.spec.comparability.family' AS family"),
    "environments": (
        "ExecutionEnvironment",
        "manifest->>'$.spec.hardware.vendor' AS vendor, "
        "manifest->>'$.spec.hardware.product' AS product, "
        "manifest->>'$.spec.hardware.architecture' AS architecture, "
        "manifest->>'$.spec.software.driver' AS driver, "
        "manifest->>'$.spec.software.cudaToolkit' AS cuda_toolkit, "
        "manifest->>'$.spec.software.framework.name' AS framework, "
        "manifest->>'$.spec.software.framework.version' AS framework_version",
    ),
}


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@functools.cache
def duckdb_types(schema: pa.Schema) -> tuple[str, ...]:
    """The DuckDB type of each column, as DuckDB reads the Arrow type."""
    con = duckdb.connect()
    try:
        return tuple(str(t) for t in con.from_arrow(schema.empty_table()).types)
    finally:
        con.close()


def empty_select(schema: pa.Schema) -> str:
    types = duckdb_types(schema)
    columns = ", ".join(
        f"CAST(NULL AS {kind}) AS {f.name}" for f, kind in zip(schema, types, strict=True)
    )
    return f"SELECT {columns} WHERE false"


def parquet_select(locations: Sequence[str], schema: pa.Schema) -> str:
    """The schema's columns of the files (which may hold more: lineage is read from runs)."""
    if not locations:
        return empty_select(schema)
    files = ", ".join(sql_string(loc) for loc in locations)
    return f"SELECT {', '.join(schema.names)} FROM read_parquet([{files}])"


def lineage_rows(run_segments: str, lineage_files: str) -> str:
    """Every lineage row (snapshot, parser version, line, run). A run's row in run_segments is
    one of them, the first where the run was seen; lineage_files holds only the others (a run
    seen again: in another file, by a later parser, or twice in one file), so a file whose runs
    are all new writes no lineage of its own (publish.py)."""
    columns = ", ".join(LINEAGE_SCHEMA.names)
    return f"SELECT {columns} FROM {run_segments} UNION ALL SELECT {columns} FROM {lineage_files}"


def parquet_sources(files: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each stored or served table as a SELECT over its Parquet files (local paths or s3://
    URLs)."""
    tables = reader_tables()
    return {name: parquet_select(files.get(name, []), schema) for name, schema in tables.items()}


def view_statements(sources: Mapping[str, str]) -> list[str]:
    """CREATE VIEW statements for every table and view, given a SELECT of each stored or served
    table (an empty one where none is given)."""
    statements = [
        f"CREATE OR REPLACE VIEW {name} AS {sources.get(name) or empty_select(schema)}"
        for name, schema in reader_tables().items()
    ]
    statements += [
        f"""CREATE OR REPLACE VIEW runs AS
           SELECT * EXCLUDE ({", ".join(HIDDEN_RUN_COLUMNS)}) FROM run_segments""",
        """CREATE OR REPLACE VIEW run_state AS
           SELECT run_digest, superseded_by, retracted_in_source FROM run_segments
           WHERE superseded_by IS NOT NULL OR retracted_in_source""",
        # Where a snapshot was first seen: its earliest read (publish.py picks alike), and the
        # source that read it (liger-csv, worker-bundle, nvbench-json...).
        """CREATE OR REPLACE VIEW first_reads AS
           SELECT snapshot_digest,
                  arg_min(source_key, {'at': taken_at, 'id': read_id}) AS source_key,
                  arg_min(source, {'at': taken_at, 'id': read_id}) AS source
           FROM snapshots GROUP BY snapshot_digest""",
        """CREATE OR REPLACE VIEW manifests AS
           SELECT m.*, f.source_key FROM manifest_segments m
           LEFT JOIN first_reads f ON f.snapshot_digest = m.snapshot_digest""",
        # A snapshot re-processed by a newer parser (a backfill after the curation grew) is
        # described by its newest record set: older sets' lineage and quarantine stay in the
        # bucket but leave these views.
        f"""CREATE OR REPLACE VIEW current_record_sets AS
           SELECT snapshot_digest, {CURRENT_RECORD_SET} AS parser_version
           FROM snapshots GROUP BY snapshot_digest""",
        f"""CREATE OR REPLACE VIEW lineage AS
           SELECT l.snapshot_digest, f.source_key, l.source_line, l.run_digest
           FROM ({lineage_rows("run_segments", "lineage_files")}) l
           SEMI JOIN current_record_sets c USING (snapshot_digest, parser_version)
           LEFT JOIN first_reads f USING (snapshot_digest)""",
        """CREATE OR REPLACE VIEW quarantine AS
           SELECT q.snapshot_digest, f.source_key, q.source_line, q.reason, q.detail,
                  q.pointer, q.raw, q.parser_version
           FROM quarantine_files q
           SEMI JOIN current_record_sets c USING (snapshot_digest, parser_version)
           LEFT JOIN first_reads f USING (snapshot_digest)""",
    ]
    statements += [
        f"CREATE OR REPLACE VIEW {name} AS {sql}" for name, sql in served_views().items()
    ]
    for view, (kind, readable) in KIND_VIEWS.items():
        statements.append(
            f"CREATE OR REPLACE VIEW {view} AS SELECT digest, name, {readable}, "
            f"snapshot_digest, source_key, manifest FROM manifests WHERE kind = {sql_string(kind)}"
        )
    return [
        *statements,
        baseline_providers_statement(),
        regressions.settings_statement(),
        *derived_view_statements(),
    ]


def baseline_providers_statement(ranks: Mapping[str, int] | None = None) -> str:
    """The baseline_providers view: the curation's baseline ranks, the one place they are
    stated (providers.yaml), as (provider, rank) rows."""
    ranks = curation.load().baseline_ranks() if ranks is None else ranks
    rows = ", ".join(f"({sql_string(name)}, {int(rank)})" for name, rank in sorted(ranks.items()))
    values = (
        f"SELECT * FROM (VALUES {rows}) AS t(provider, rank)"
        if rows
        else ("SELECT CAST(NULL AS VARCHAR) AS provider, CAST(NULL AS INTEGER) AS rank WHERE false")
    )
    return f"CREATE OR REPLACE VIEW baseline_providers AS {values}"


def derived_view_statements() -> list[str]:
    text = resources.files("pipelines.index").joinpath("views.sql").read_text(encoding="utf-8")
    parts = [p.strip() for p in text.split("\n;\n")]
    return [p for p in parts if p and not all(line.startswith("--") for line in p.splitlines())]


def views_fingerprint() -> str:
    """What the views are, apart from the files they read: a database built with other views
    (by an older kindex) is built again."""
    text = "\n".join(view_statements({}))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def create_views(con: duckdb.DuckDBPyConnection, sources: Mapping[str, str]) -> None:
    for statement in view_statements(sources):
        con.execute(statement)


# Columns that differ between two undisturbed ingests of the same files: clocks, the bucket and
# version ids. Everything else must be equal for "the same index".
VOLATILE_COLUMNS = (
    "read_id",
    "bucket",
    "version_id",
    "last_modified",
    "taken_at",
    "processed_at",
)


def table_fingerprints(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """An order-independent content hash of every table and view, volatile columns left out."""
    result = {}
    for name in TABLES + VIEWS:
        columns = [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]
        kept = ", ".join(c for c in columns if c not in VOLATILE_COLUMNS)
        row = con.execute(
            "SELECT count(*), "
            "md5(coalesce(string_agg(t::VARCHAR, chr(10) ORDER BY t::VARCHAR), ''))"
            f" FROM (SELECT {kept} FROM {name}) t"
        ).fetchone()
        assert row is not None
        result[name] = f"{row[0]}:{row[1]}"
    return result
