"""What a publish of the index tells Dagster, whichever run published it.

A batch run of `records` publishes the index itself (so a file is queryable when its run ends),
the `reprocess_files` job too, and a run of `index` catches up what a lost run left. Each of them
reports the same events through `publish_events`: a materialization of `index` (the version it
published, its counts), the index's checks, and a materialization of each table people query
(`QUERIED`), with its column schema, row count, the Iceberg tables it reads and a `kindex query`
line to copy. So the index never reads "never materialized" while it answers queries.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
)

from assets.conventions import GROUP, INDEX_KEY, OWNERS, RECORDS_KEY
from assets.resources import KindexResource
from pipelines.index.catalog import IndexCatalog
from pipelines.index.local import open_index
from pipelines.index.tables import reader_tables
from pipelines.intake.failing import failing_files
from pipelines.intake.ledger import FileEntry, FileState
from pipelines.regressions import top_movers
from pipelines.storage.base import ObjectInfo

if TYPE_CHECKING:
    import duckdb

    from pipelines.index.publish import IndexVersion

TOP_MOVERS_LIMIT = 10  # rows of the regressions' top movers on the index's materialization

# A file left pending or failed longer than this fails the index's freshness check: incoming/
# drains within it (a batch takes seconds; a failed file is retried from 30 s, doubling).
DRAIN_WITHIN = timedelta(minutes=15)
FILE_ROWS = 50  # files listed in a check's table (all are in the `files` view)


@dataclass(frozen=True, slots=True)
class Queried:
    """A table or view people query, shown as an asset of its own."""

    name: str
    description: str
    example: str  # a `kindex query` line worth copying

    @property
    def key(self) -> AssetKey:
        return AssetKey(self.name)

    @property
    def query(self) -> str:
        return f'kindex query "{self.example}"'


QUERIED = [
    Queried(
        "runs",
        "Every run of every file, once (a content digest), with where it was first seen.",
        "select kernel, provider, mode, gpu, case_key, median from runs limit 10",
    ),
    Queried(
        "quarantine",
        "Rows kept aside: a reason code, the source line and the raw text.",
        "select source_key, source_line, reason from quarantine order by 1, 2",
    ),
    Queried(
        "files",
        "The file ledger: each object version's state, reason, attempts and counts.",
        "select key, state, reason, attempts, runs from files where state <> 'indexed'",
    ),
    Queried(
        "latest_runs",
        "Each series' newest run, not superseded or retracted.",
        "select kernel, provider, gpu, mode, case_key, median from latest_runs limit 10",
    ),
    Queried(
        "speedups",
        "Each provider against its cohort's baseline provider, per GPU and pass.",
        "select kernel, provider, gpu, mode, round(median(speedup), 2) from speedups "
        "group by all order by all",
    ),
    Queried(
        "regressions",
        "Series slower in a newer version, their p20-p80 spreads apart.",
        "select kernel, provider, gpu, case_key, old_version, new_version, ratio "
        "from regressions order by ratio desc",
    ),
]

# Every key of what the index reports, with what it means (shown in the asset's description).
INDEX_KEYS = {
    "index_version": "The version published (or, when nothing was new, the current one).",
    "published": "Whether this publish made a new version (false: nothing new to add).",
    "new_runs": "Runs this version added.",
    "files_requeued": "Files whose rows awaited another file, which this batch brought: marked "
    "due again, for the next batch.",
    "runs": "Runs in the index.",
    "quarantine": "Quarantine rows in the index.",
    "manifests": "Manifests (operations, workloads, implementations...) in the index.",
    "snapshots": "Snapshots (distinct bytes) read.",
    "reads": "Object versions read.",
    "lineage": "Lineage rows: where each run came from.",
    "superseded": "Runs a newer measurement of the same series superseded.",
    "retracted": "Runs missing from the newest version of their file.",
    "published_by": "The job whose run published it.",
    "top_movers": "The biggest changes between versions (the regressions' top movers).",
    "warnings": "What could not be reported (never a failure of the publish).",
}
TABLE_KEYS = {
    "dagster/column_schema": "The columns, as DuckDB types them.",
    "dagster/row_count": "Rows in this version.",
    "dagster/table_name": "The name to query.",
    "index_version": "The index version counted.",
    "iceberg_tables": "The Iceberg tables it reads, and where each is stored.",
    "query": "A `kindex query` line to copy.",
}


def keys_markdown(keys: Mapping[str, str]) -> str:
    return "\n".join(f"- `{key}`: {meaning}" for key, meaning in keys.items())


TABLE_SPECS = [
    AssetSpec(
        key=table.key,
        group_name=GROUP,
        owners=OWNERS,
        deps=[RECORDS_KEY if table.name == "files" else INDEX_KEY],
        kinds={"iceberg", "duckdb"},
        description=f"{table.description}\n\n`{table.query}`\n\nMetadata:\n\n"
        + keys_markdown(TABLE_KEYS),
    )
    for table in QUERIED
]

INDEX_CHECKS = [
    AssetCheckSpec(
        "row_counts_match_snapshots",
        asset=INDEX_KEY,
        description="Runs and quarantine rows in the index against the sum of the snapshots.",
    ),
    AssetCheckSpec(
        "every_version_processed",
        asset=INDEX_KEY,
        description="Every object version found under incoming/ is indexed, quarantined or "
        "gone in the file ledger (the ledger and reconcile sensors request the others again). "
        "At a publish, the versions the sensors and reconcile ticks found (the ledger's open "
        "ones); over a full listing of incoming/ when the reconcile_bucket job runs "
        "(`kindex reconcile --full`).",
    ),
    AssetCheckSpec(
        "no_failing_files",
        asset=INDEX_KEY,
        description="No file of the ledger is quarantined or failed, by reason: a failing "
        "file stays here, whatever batch came after it, until it is fixed.",
    ),
    AssetCheckSpec(
        "incoming_drained",
        asset=INDEX_KEY,
        description=f"Freshness: no file waits (pending or failed) longer than {DRAIN_WITHIN}.",
    ),
]


@dataclass(frozen=True, slots=True)
class PublishReport:
    index: dict[str, object]  # the index's materialization's metadata
    tables: list[AssetMaterialization]  # each queried table's
    checks: list[AssetCheckEvaluation]  # the index's checks

    def events(self) -> list[AssetMaterialization | AssetCheckEvaluation]:
        """As a run that is not the index's own logs them."""
        index = AssetMaterialization(INDEX_KEY, metadata=self.index)  # type: ignore[arg-type]
        return [index, *self.tables, *self.checks]


def publish_report(
    kindex: KindexResource, version: IndexVersion, requeued: int, job: str
) -> PublishReport:
    """What one publish reports: the index's metadata, each queried table's materialization,
    the index's checks. What cannot be read for the report is a warning on it, never an error
    of the run (the publish is done)."""
    warnings: list[str] = []
    tables: list[AssetMaterialization] = []
    movers: pa.Table | None = None
    try:
        tables, movers = table_events(kindex, version)
    except Exception as error:  # a reader of the local index raced a newer publish
        warnings.append(f"tables: {type(error).__name__}: {error}")
    metadata: dict[str, object] = {
        "index_version": str(version.version),
        "published": version.published,
        "new_runs": MetadataValue.int(version.new_runs),
        "files_requeued": MetadataValue.int(requeued),
        **{name: MetadataValue.int(int(n)) for name, n in sorted(version.counts.items())},
        "published_by": job,
    }
    if movers is not None:
        metadata["top_movers"] = arrow_table(movers)
    if warnings:
        metadata["warnings"] = MetadataValue.md("\n".join(f"- {w}" for w in warnings))
    return PublishReport(metadata, tables, index_checks(kindex))


def records_table(rows: Sequence[Mapping[str, object]]) -> MetadataValue:
    """Rows as a typed table (columns from the first row's keys)."""
    columns = list(rows[0]) if rows else []
    schema = TableSchema(columns=[TableColumn(c, column_type(rows, c)) for c in columns])
    records = [TableRecord({c: cell(row.get(c)) for c in columns}) for row in rows]
    return MetadataValue.table(records, schema)


def arrow_table(table: pa.Table) -> MetadataValue:
    """An Arrow table as a typed table: its columns show even when it has no rows."""
    schema = TableSchema(columns=[TableColumn(f.name, arrow_type(f.type)) for f in table.schema])
    records = [TableRecord({k: cell(v) for k, v in row.items()}) for row in table.to_pylist()]
    return MetadataValue.table(records, schema)


def arrow_type(kind: pa.DataType) -> str:
    if pa.types.is_integer(kind):
        return "int"
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "float"
    return "bool" if pa.types.is_boolean(kind) else "string"


def cell(value: object) -> str | int | float | bool | None:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def column_type(rows: Sequence[Mapping[str, object]], column: str) -> str:
    kinds = {type(row.get(column)).__name__ for row in rows if row.get(column) is not None}
    return {"int": "int", "float": "float", "bool": "bool"}.get(next(iter(kinds), ""), "string")


def table_events(
    kindex: KindexResource, version: IndexVersion
) -> tuple[list[AssetMaterialization], pa.Table]:
    """Each queried table's schema and row count, from the local index this publish left."""

    catalog = IndexCatalog.beside(kindex.store, kindex.settings)
    con = open_index(kindex.settings)
    try:
        views = dict(con.execute("select view_name, sql from duckdb_views()").fetchall())
        events = []
        for table in QUERIED:
            columns = con.execute(f"describe {table.name}").fetchall()
            rows = int(con.execute(f"select count(*) from {table.name}").fetchone()[0])  # type: ignore[index]
            reads = iceberg_tables(table.name, views, catalog)
            events.append(
                AssetMaterialization(
                    table.key,
                    metadata={
                        # Dagster's own keys for a table: the UI shows them as such.
                        "dagster/column_schema": MetadataValue.table_schema(
                            TableSchema(
                                columns=[TableColumn(str(c[0]), str(c[1])) for c in columns]
                            )
                        ),
                        "dagster/row_count": MetadataValue.int(rows),
                        "dagster/table_name": table.name,
                        "index_version": str(version.version),
                        "iceberg_tables": MetadataValue.md(
                            "\n".join(f"- `{name}`: {where}" for name, where in reads.items())
                        ),
                        "query": table.query,
                    },
                )
            )
        movers = top_movers(con, TOP_MOVERS_LIMIT)
    finally:
        con.close()
    return events, movers


def iceberg_tables(name: str, views: Mapping[str, str], catalog: object) -> dict[str, str]:
    """The Iceberg tables a view reads, through the views it reads, each with its location:
    found in the views' own SQL, so that no list here restates them."""

    stored = set(reader_tables())
    found: dict[str, str] = {}
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in stored:
            table = catalog.table(current)  # type: ignore[attr-defined]
            found[current] = str(table.location())
            continue
        sql = views.get(current, "")
        todo += [n for n in (*stored, *views) if n != current and re.search(rf"\b{n}\b", sql)]
    return dict(sorted(found.items()))


def index_checks(kindex: KindexResource) -> list[AssetCheckEvaluation]:
    return [
        check(name, work, kindex)
        for name, work in (
            ("row_counts_match_snapshots", row_count_check),
            ("every_version_processed", missing_versions_check),
            ("no_failing_files", failing_files_check),
            ("incoming_drained", drained_check),
        )
    ]


CheckVerdict = tuple[bool, AssetCheckSeverity, dict[str, object]]


def check(
    name: str, work: Callable[[KindexResource], CheckVerdict], kindex: KindexResource
) -> AssetCheckEvaluation:
    try:
        passed, severity, metadata = work(kindex)
    except Exception as error:  # a check that cannot look says so, and fails
        passed, severity = False, AssetCheckSeverity.WARN
        metadata = {"error": f"{type(error).__name__}: {error}"}
    return AssetCheckEvaluation(
        asset_key=INDEX_KEY,
        check_name=name,
        passed=passed,
        severity=severity,
        metadata=metadata,  # type: ignore[arg-type]
    )


def missing_versions_check(kindex: KindexResource) -> CheckVerdict:
    """At a publish, what changed and not the bucket's history: every version the sensors and
    the reconcile ticks found (each an incremental comparison of the bucket with the ledger) has
    a ledger row, pending or failed until a batch is done with it, so the versions not done are
    the ledger's open ones, read from the oldest open window on (`Ledger.open_versions`). A
    version nothing found yet only a listing shows: the reconcile_bucket job lists incoming/
    when asked (`kindex reconcile --full`) and evaluates this check over it (`full_check`)."""
    ledger = kindex.ledger
    since = ledger.open_since()
    return unprocessed_verdict(
        ledger.open_versions(),
        {
            "compared": "the versions the sensors and reconcile ticks found (the ledger's open "
            f"versions, from window {since or 'the first'} on)",
        },
    )


def full_check(listing: Sequence[ObjectInfo], missing: Sequence[ObjectInfo]) -> CheckVerdict:
    """The same check over a full listing of incoming/ (the reconcile_bucket job's)."""
    return unprocessed_verdict(
        missing,
        {
            "compared": "a full listing of incoming/",
            "object_versions": MetadataValue.int(len(listing)),
        },
    )


def unprocessed_verdict(
    missing: Sequence[ObjectInfo | FileEntry], metadata: Mapping[str, object]
) -> CheckVerdict:
    examples = [m.key for m in missing[:10]]
    return (
        not missing,
        AssetCheckSeverity.WARN,
        {
            "missing_versions": MetadataValue.int(len(missing)),
            **metadata,
            "examples": MetadataValue.md("\n".join(f"- `{k}`" for k in examples) or "none"),
        },
    )


def row_count_check(kindex: KindexResource) -> CheckVerdict:
    """Each snapshot's record set says how many runs and quarantine rows it holds; the index
    cannot hold more than their sum (runs are deduplicated by digest, so it may hold fewer)."""

    con = open_index(kindex.settings)
    try:
        runs, quarantine = _scalars(
            con, "select (select count(*) from runs), (select count(*) from quarantine)"
        )
        expected_runs, expected_quarantine = _scalars(
            con,
            # one row per read; the same bytes read under two keys are one record set
            "select coalesce(sum(runs), 0), coalesce(sum(quarantined), 0) from (select distinct"
            " snapshot_digest, parser_version, runs, quarantined from snapshots)",
        )
    finally:
        con.close()
    return (
        runs <= expected_runs and quarantine <= expected_quarantine,
        AssetCheckSeverity.ERROR,
        {
            "index_runs": MetadataValue.int(runs),
            "snapshot_runs": MetadataValue.int(expected_runs),
            "index_quarantine": MetadataValue.int(quarantine),
            "snapshot_quarantine": MetadataValue.int(expected_quarantine),
        },
    )


def failing_files_check(kindex: KindexResource) -> CheckVerdict:
    """Over the whole ledger, not a batch: a file that failed or was quarantined stays failing
    here until a later processing of it succeeds (or it is replaced). Carried from the last
    check, brought up to date with the rows committed since (pipelines/intake/failing.py)."""
    failing = failing_files(kindex.store, kindex.settings, kindex.ledger).files
    by_reason = Counter((str(f.state), reason_code(f.reason)) for f in failing)
    return (
        not failing,
        AssetCheckSeverity.ERROR
        if any(f.state is FileState.FAILED for f in failing)
        else AssetCheckSeverity.WARN,
        {
            "failing_files": MetadataValue.int(len(failing)),
            "by_reason": records_table(
                [
                    {"state": state, "reason": reason, "files": n}
                    for (state, reason), n in by_reason.most_common()
                ]
            ),
            "files": file_records(failing[:FILE_ROWS]),
        },
    )


def drained_check(kindex: KindexResource) -> CheckVerdict:
    before = datetime.now(UTC) - DRAIN_WITHIN
    # The open versions, read as the missing check reads them (once per ledger commit).
    waiting = [f for f in kindex.ledger.open_versions() if f.last_modified < before]
    return (
        not waiting,
        AssetCheckSeverity.WARN,
        {
            "waiting_files": MetadataValue.int(len(waiting)),
            "oldest": str(min(f.last_modified for f in waiting)) if waiting else "none",
            "files": file_records(waiting[:FILE_ROWS]),
        },
    )


def reason_code(reason: str | None) -> str:
    """A reason's first words: an error's class, a quarantine code (the detail is per file)."""
    return (reason or "unknown").split(":", 1)[0][:80]


def file_records(files: Sequence[object]) -> MetadataValue:
    rows = [
        {
            "file": f.key,
            "state": str(f.state),
            "runs": f.runs,
            "quarantined": f.quarantined,
            "attempts": f.attempts,
            "reason": f.reason or "",
        }
        for f in files
        if isinstance(f, FileEntry)
    ]
    return MetadataValue.table(
        [TableRecord(row) for row in rows],  # type: ignore[arg-type]
        FILE_SCHEMA,
    )


FILE_SCHEMA = TableSchema(
    columns=[
        TableColumn("file", "string"),
        TableColumn("state", "string"),
        TableColumn("runs", "int"),
        TableColumn("quarantined", "int"),
        TableColumn("attempts", "int"),
        TableColumn("reason", "string"),
    ]
)


def _scalars(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[int, int]:
    row = con.execute(sql).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
