"""Per-file assets: the immutable snapshot of each dropped object version, and its records.

Both are partitioned by object version (assets/partitions.py) with a single-run backfill policy,
so a sensor tick or a backfill over many files is one run. A problem with one file (garbage
bytes, a version overwritten before it was read) never fails the others of the same run: it is
recorded on that file's materialization and turned into a failing asset check that says why.
"""

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets import metadata as md
from assets.partitions import INCOMING_FILES
from assets.resources import KindexResource
from pipelines.charts import speedup_chart_png
from pipelines.ingest import SnapshotRecords, process_snapshot
from pipelines.sensor_cursor import parse_partition_key
from pipelines.snapshots import Snapshot, VersionChanged, load_snapshot, take_snapshot

T = TypeVar("T")

GROUP = "kindex"
SNAPSHOT_KEY = AssetKey("snapshot")
RECORDS_KEY = AssetKey("records")
FILE_THREADS = 8


class VersionGone(RuntimeError):
    """The object version a partition names is no longer in the bucket and was never read."""


@dataclass
class FileOutcome:
    """What one partition of a run produced, for checks that summarize the run per file."""

    partition_key: str
    runs: int = 0
    quarantined: int = 0
    top_reasons: list[tuple[str, int]] = field(default_factory=list)
    duplicate_external_ids: int = 0
    schema_failures: list[str] = field(default_factory=list)
    error: str | None = None


@asset(
    key=SNAPSHOT_KEY,
    group_name=GROUP,
    partitions_def=INCOMING_FILES,
    backfill_policy=BackfillPolicy.single_run(),
    description="An immutable, content-addressed copy of one dropped object version.",
    kinds={"s3"},
)
def snapshot(context: AssetExecutionContext, kindex: KindexResource) -> None:
    known = _latest_snapshot_digests(context)
    # A backfill re-reads nothing: the copy exists, and the object may be gone since.
    pending = [key for key in context.partition_keys if key not in known]
    for partition_key, taken in zip(
        pending, in_parallel(lambda key: _snapshot_or_gone(kindex, key), pending), strict=True
    ):
        if isinstance(taken, VersionGone):
            context.log.warning(f"{partition_key}: {taken}")
            context.add_asset_metadata({"error": str(taken)}, partition_key=partition_key)
        else:
            context.add_asset_metadata(snapshot_metadata(taken), partition_key=partition_key)


def in_parallel(work: Callable[[str], T], partition_keys: Sequence[str]) -> list[T]:
    """`work` over each partition on a few threads: a file costs ~30 small S3 requests, which
    wait on the network, not the CPU (100 tiny files: 17 s one after another)."""
    if len(partition_keys) <= 1:
        return [work(key) for key in partition_keys]
    with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="kindex-file") as pool:
        return list(pool.map(work, partition_keys))


def _snapshot_or_gone(kindex: KindexResource, partition_key: str) -> Any:
    try:
        return take_partition_snapshot(kindex, partition_key)
    except (VersionGone, VersionChanged) as gone:
        return VersionGone(str(gone))


def take_partition_snapshot(kindex: KindexResource, partition_key: str) -> Snapshot:
    ref = parse_partition_key(partition_key)
    info = kindex.store.head(ref.key)
    if info is None or not ref.matches(info.etag):
        raise VersionGone(
            f"s3://{kindex.store.bucket}/{ref.key} with ETag {ref.etag_prefix}... is gone "
            "(deleted or overwritten before it was read); a newer version has its own partition"
        )
    return take_snapshot(kindex.store, kindex.settings, ref.key, etag=info.etag)


def snapshot_metadata(snap: Snapshot) -> dict[str, Any]:
    return {
        "snapshot_digest": snap.digest,
        "source_key": snap.key,
        "etag": snap.etag,
        "size": MetadataValue.int(int(snap.size)),
    }


CHECKS = [
    AssetCheckSpec(
        "no_quarantined_rows",
        asset=RECORDS_KEY,
        description="Rows kept aside per file, with the top reasons.",
    ),
    AssetCheckSpec(
        "unique_external_ids",
        asset=RECORDS_KEY,
        description="No externalId appears twice among a file's runs.",
    ),
    AssetCheckSpec(
        "records_match_schemas",
        asset=RECORDS_KEY,
        description="Every record validates against its kernelindex JSON Schema.",
    ),
]


@asset(
    key=RECORDS_KEY,
    group_name=GROUP,
    deps=[SNAPSHOT_KEY],
    partitions_def=INCOMING_FILES,
    backfill_policy=BackfillPolicy.single_run(),
    check_specs=CHECKS,
    description="kernelindex.dev/v1alpha1 records and quarantine rows of one snapshot, "
    "normalized by the current parser (backfill to re-process).",
    kinds={"parquet", "s3"},
)
def records(context: AssetExecutionContext, kindex: KindexResource) -> MaterializeResult:
    digests = _latest_snapshot_digests(context)
    keys = list(context.partition_keys)
    processed = in_parallel(lambda key: process_partition(kindex, key, digests.get(key)), keys)
    for outcome, metadata in processed:
        if outcome.error:
            context.log.error(f"{outcome.partition_key}: {outcome.error}")
        context.add_asset_metadata(metadata, partition_key=outcome.partition_key)
    # One result materializes every partition of the run; per-file metadata was added above.
    return MaterializeResult(check_results=list(file_checks([o for o, _ in processed])))


def _latest_snapshot_digests(context: AssetExecutionContext) -> dict[str, tuple[str, str]]:
    """For each partition of the run, the (digest, object key) of its newest snapshot."""
    records_ = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=SNAPSHOT_KEY, asset_partitions=list(context.partition_keys)),
        limit=10 * len(context.partition_keys) + 10,
    ).records
    digests: dict[str, tuple[str, str]] = {}
    for record in records_:  # newest first
        materialization = record.asset_materialization
        if materialization is None or materialization.partition in digests:
            continue
        digest = materialization.metadata.get("snapshot_digest")
        key = materialization.metadata.get("source_key")
        if digest is not None and key is not None and materialization.partition is not None:
            digests[materialization.partition] = (str(digest.value), str(key.value))
    return digests


def process_partition(
    kindex: KindexResource, partition_key: str, snapshot_ref: tuple[str, str] | None
) -> tuple[FileOutcome, dict[str, Any]]:
    """Normalize one file's snapshot into its record set; never raises, so one bad file
    cannot fail the other files of the run. Returns the outcome and the file's metadata."""
    outcome = FileOutcome(partition_key)
    try:
        if snapshot_ref is None:
            raise VersionGone("no snapshot of this object version (see the snapshot asset)")
        digest, key = snapshot_ref
        snap = load_snapshot(kindex.store, kindex.settings, digest, key=key)
        result = process_snapshot(kindex.store, kindex.settings, snap)
        runs = read_runs(kindex, result.run_keys)
    except Exception as error:
        outcome.error = f"{type(error).__name__}: {error}"
        return outcome, {"error": outcome.error}
    outcome.runs = result.runs
    outcome.quarantined = result.quarantined
    outcome.top_reasons = Counter(result.quarantined_by_reason).most_common(5)
    outcome.duplicate_external_ids = duplicate_count(runs["external_id"])
    outcome.schema_failures = schema_failures(runs["manifest"])
    return outcome, records_metadata(snap, result, runs, outcome)


RUN_COLUMNS = [
    "kernel",
    "provider",
    "mode",
    "gpu",
    "case_key",
    "metric",
    "median",
    "external_id",
    "manifest",
    "source_line",  # the parts of a large file hold its runs in another order
]


def read_runs(kindex: KindexResource, keys: list[str]) -> dict[str, list[Any]]:
    """The run columns of a record set (its runs objects), for checks and the chart."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [
        pq.read_table(io.BytesIO(kindex.store.get_bytes(key)), columns=RUN_COLUMNS) for key in keys
    ]
    return pa.concat_tables(tables).sort_by("source_line").to_pydict()


def duplicate_count(values: list[Any]) -> int:
    return sum(n - 1 for n in Counter(values).values() if n > 1)


def schema_failures(manifests: list[str], limit: int = 10) -> list[str]:
    import orjson

    from pipelines.manifests import schema_errors

    failures = []
    for text in manifests:
        manifest = orjson.loads(text)
        for pointer, message in schema_errors(manifest):
            name = manifest.get("metadata", {}).get("name", "?")
            failures.append(f"{manifest.get('kind')} {name}: {pointer}: {message}")
            break
        if len(failures) >= limit:
            break
    return failures


def records_metadata(
    snap: Snapshot, result: SnapshotRecords, runs: dict[str, list[Any]], outcome: FileOutcome
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        **snapshot_metadata(snap),
        "parser_version": result.parser_version,
        "rows": MetadataValue.int(result.rows),
        "runs": MetadataValue.int(outcome.runs),
        **{f"runs_{metric}": MetadataValue.int(n) for metric, n in result.runs_by_metric.items()},
        "quarantined_rows": MetadataValue.int(outcome.quarantined),
        "top_quarantine_reasons": MetadataValue.md(md.reasons_markdown(outcome.top_reasons)),
        "runs_preview": MetadataValue.md(
            md.markdown_table(result.run_preview, list(result.run_preview[0]))
            if result.run_preview
            else "_no runs_"
        ),
        "quarantine_preview": MetadataValue.md(
            md.markdown_table(result.quarantine_preview, ["source_line", "reason", "detail"])
        ),
        "record_set": f"s3://{snap.bucket}/{result.prefix}",
    }
    rows = [dict(zip(runs, values, strict=True)) for values in zip(*runs.values(), strict=True)]
    png = speedup_chart_png(rows, title=f"Speedups in {snap.key}")
    if png is not None:
        meta["speedups"] = MetadataValue.md(md.png_markdown(png, "speedups over baseline"))
    return meta


def file_checks(outcomes: list[FileOutcome]) -> Iterator[AssetCheckResult]:
    """One result per check for the run, with a row per file so a person sees which one."""
    table = md.markdown_table(
        [
            {
                "file": o.partition_key,
                "runs": o.runs,
                "quarantined": o.quarantined,
                "top reasons": md.reasons_markdown(o.top_reasons) if not o.error else o.error,
            }
            for o in outcomes
        ],
        ["file", "runs", "quarantined", "top reasons"],
    )
    failed = [o for o in outcomes if o.error or (o.runs == 0 and o.quarantined)]
    quarantined = sum(o.quarantined for o in outcomes)
    yield AssetCheckResult(
        check_name="no_quarantined_rows",
        passed=quarantined == 0 and not failed,
        # Quarantine of a few rows is expected until the curation knows them; a file with no
        # usable row at all (garbage, unknown format) or one that failed is an error.
        severity=AssetCheckSeverity.ERROR if failed else AssetCheckSeverity.WARN,
        metadata={
            "quarantined_rows": MetadataValue.int(quarantined),
            "files_without_runs": MetadataValue.int(len(failed)),
            "per_file": MetadataValue.md(table),
        },
    )
    duplicates = sum(o.duplicate_external_ids for o in outcomes)
    yield AssetCheckResult(
        check_name="unique_external_ids",
        passed=duplicates == 0,
        metadata={"duplicate_external_ids": MetadataValue.int(duplicates)},
    )
    schema_failures = [f for o in outcomes for f in o.schema_failures]
    yield AssetCheckResult(
        check_name="records_match_schemas",
        passed=not schema_failures,
        metadata={
            "failing_records": MetadataValue.int(len(schema_failures)),
            "examples": MetadataValue.md(
                "\n".join(f"- {f}" for f in schema_failures[:10]) or "none"
            ),
        },
    )


FILE_ASSETS = [snapshot, records]
