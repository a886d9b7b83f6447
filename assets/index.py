"""The index: every file's records folded into a DuckDB/Parquet index, published atomically."""

from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AutomationCondition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.files import FILE_RETRY_POLICY, GROUP, RECORDS_KEY
from assets.resources import KindexResource

INDEX_KEY = AssetKey("index")
# One writer at a time (the instance gives every pool a limit of 1, see `kindex up`).
INDEX_POOL = "kindex_index"

# `eager()` waits while any partition of `records` is missing or failed, so one bad file would
# hold the index back forever. This fires after any file's records update, once none is running.
# The update is remembered until the index is next *requested* (not materialized): records that
# land while an index run is already going (it started before them) still get a run of their own.
INDEX_CONDITION = (
    AutomationCondition.any_deps_updated().since(AutomationCondition.newly_requested())
    & ~AutomationCondition.any_deps_in_progress()
    & ~AutomationCondition.in_progress()
).with_label("after any file's records, not waiting on failed or missing files")


@asset(
    key=INDEX_KEY,
    group_name=GROUP,
    deps=[RECORDS_KEY],
    pool=INDEX_POOL,
    retry_policy=FILE_RETRY_POLICY,
    automation_condition=INDEX_CONDITION,
    check_specs=[
        AssetCheckSpec(
            "row_counts_match_snapshots",
            asset=INDEX_KEY,
            description="Runs and quarantine rows in the index against the sum of the snapshots.",
        ),
        AssetCheckSpec(
            "every_version_processed",
            asset=INDEX_KEY,
            description="Every object version under incoming/ has a snapshot and a record set "
            "of the current parser (the reconcile sensor requests the missing ones again).",
        ),
    ],
    description="DuckDB/Parquet index over all record sets (runs, manifests, quarantine, views); "
    "published as a new version, then a pointer, so readers never see half an index.",
    kinds={"duckdb", "parquet"},
)
def index(context: AssetExecutionContext, kindex: KindexResource) -> MaterializeResult:
    from pipelines.ingest import publish_resolving

    version, resolved = publish_resolving(kindex.store, kindex.settings)
    counts = {name: MetadataValue.int(int(n)) for name, n in sorted(version.counts.items())}
    return MaterializeResult(
        metadata={
            "version": str(version.version),
            "published": version.published,
            "new_runs": MetadataValue.int(version.new_runs),
            # files whose rows awaited another file (a trace its definition), processed again
            "files_resolved": MetadataValue.int(resolved),
            **counts,
        },
        check_results=[row_count_check(kindex), missing_versions_check(kindex)],
    )


def missing_versions_check(kindex: KindexResource) -> AssetCheckResult:
    from pipelines.intake.reconcile import reconcile

    found = reconcile(kindex.store, kindex.settings)
    examples = [m.info.key for m in found.missing[:10]]
    return AssetCheckResult(
        check_name="every_version_processed",
        passed=found.missing_count == 0,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "missing_versions": MetadataValue.int(found.missing_count),
            "object_versions": MetadataValue.int(found.objects),
            "examples": MetadataValue.md("\n".join(f"- `{k}`" for k in examples) or "none"),
        },
    )


def row_count_check(kindex: KindexResource) -> AssetCheckResult:
    """Each snapshot's record set says how many runs and quarantine rows it holds; the index
    cannot hold more than their sum (runs are deduplicated by digest, so it may hold fewer)."""
    from pipelines.index.local import open_index

    con = open_index(kindex.settings)
    try:
        actual = _scalars(
            con, "select (select count(*) from runs), (select count(*) from quarantine)"
        )
        expected = _scalars(
            con,
            # one row per read; the same bytes read under two keys are one record set
            "select coalesce(sum(runs), 0), coalesce(sum(quarantined), 0) from (select distinct"
            " snapshot_digest, parser_version, runs, quarantined from snapshots)",
        )
    finally:
        con.close()
    runs, quarantine = actual
    expected_runs, expected_quarantine = expected
    return AssetCheckResult(
        check_name="row_counts_match_snapshots",
        passed=runs <= expected_runs and quarantine <= expected_quarantine,
        metadata={
            "index_runs": MetadataValue.int(runs),
            "snapshot_runs": MetadataValue.int(expected_runs),
            "index_quarantine": MetadataValue.int(quarantine),
            "snapshot_quarantine": MetadataValue.int(expected_quarantine),
        },
    )


def _scalars(con: Any, sql: str) -> tuple[int, int]:
    row = con.execute(sql).fetchone()
    return int(row[0]), int(row[1])
