"""The index: every file's records folded into Iceberg tables that DuckDB reads, published
atomically. A batch run publishes it too (assets/files.py); either way the publish reports the
same events (assets/published.py)."""

from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetSelection,
    MaterializeResult,
    asset,
    define_asset_job,
)

from assets.conventions import (
    FILE_RETRY_POLICY,
    GROUP,
    INDEX_KEY,
    INDEX_POOL,
    OWNERS,
    RECORDS_KEY,
    index_code_version,
)
from assets.published import INDEX_CHECKS, INDEX_KEYS, keys_markdown, publish_report
from assets.resources import KindexResource
from pipelines.index.publish import publish_index as publish_the_index


@asset(
    key=INDEX_KEY,
    group_name=GROUP,
    owners=OWNERS,
    deps=[RECORDS_KEY],
    pool=INDEX_POOL,
    retry_policy=FILE_RETRY_POLICY,
    check_specs=INDEX_CHECKS,
    code_version=index_code_version(),
    description="Iceberg tables in the bucket over every record set (runs, manifests, "
    "quarantine, snapshots, lineage) and the file ledger, read by DuckDB views; each version "
    "is one commit, so readers never see half an index. Every batch run of `records` "
    "publishes it, and reports it here; a run of its own catches up what a lost run left."
    "\n\nMetadata:\n\n" + keys_markdown(INDEX_KEYS),
    kinds={"iceberg", "duckdb", "s3"},
)
def index(
    context: AssetExecutionContext, kindex: KindexResource
) -> Iterator[MaterializeResult[None] | AssetCheckResult]:
    version = publish_the_index(kindex.store, kindex.settings)
    report = publish_report(kindex, version, 0, context.job_name)
    yield MaterializeResult(metadata=report.index)  # type: ignore[arg-type]
    for table in report.tables:
        context.log_event(table)
    for check in report.checks:
        yield AssetCheckResult(
            check_name=check.check_name,
            passed=check.passed,
            severity=check.severity,
            metadata=check.metadata,
        )


# Runs of the index of its own (a catch-up): a named job, not Dagster's anonymous asset job.
publish_index = define_asset_job(
    "publish_index",
    selection=AssetSelection.assets(INDEX_KEY),
    description="Publish the record sets the index lacks (a batch run publishes its own).",
)
