"""The index: every file's records folded into a DuckDB/Parquet index, published atomically."""

from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.files import FILE_RETRY_POLICY, GROUP, RECORDS_KEY
from assets.resources import KindexResource

INDEX_KEY = AssetKey("index")
# One writer at a time (the instance gives every pool a limit of 1, see `kindex up`).
INDEX_POOL = "kindex_index"


@asset(
    key=INDEX_KEY,
    group_name=GROUP,
    deps=[RECORDS_KEY],
    pool=INDEX_POOL,
    retry_policy=FILE_RETRY_POLICY,
    check_specs=[
        AssetCheckSpec(
            "row_counts_match_snapshots",
            asset=INDEX_KEY,
            description="Runs and quarantine rows in the index against the sum of the snapshots.",
        ),
        AssetCheckSpec(
            "every_version_processed",
            asset=INDEX_KEY,
            description="Every object version under incoming/ is indexed, quarantined or gone in "
            "the file ledger (the ledger and reconcile sensors request the others again).",
        ),
    ],
    description="DuckDB/Parquet index over all record sets (runs, manifests, quarantine, views); "
    "published as a new version, then a pointer, so readers never see half an index. Each batch "
    "run of `records` publishes it too; a run of its own catches up what a lost run left.",
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
    from pipelines.intake.ledger import unprocessed_versions

    listing, missing = unprocessed_versions(kindex.store, kindex.settings, kindex.ledger)
    examples = [m.key for m in missing[:10]]
    return AssetCheckResult(
        check_name="every_version_processed",
        passed=not missing,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "missing_versions": MetadataValue.int(len(missing)),
            "object_versions": MetadataValue.int(len(listing)),
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
