"""Per-file assets: the immutable snapshot of each dropped object version, and its records.

Both are partitioned by object version (assets/partitions.py) with a single-run backfill policy,
so a sensor tick or a backfill over many files is one run. The sensors' runs are of `records`
alone, which takes and materializes each file's snapshot too: Dagster writes its events one at
a time (a planned event per file and asset of the run, then a materialization), and in a burst
of small files they, not the files, set the pace. Whatever breaks while one file is
processed (its bytes, its key, an S3 error) is that file's alone: every file is processed on its
own, each good file is materialized as soon as it is done (its own materialization event), and
the step fails at the end naming the failed files, so they show as failed partitions in the UI
(re-request them there, or let the step's retries and the reconcile sensor do it). Garbage bytes
are not a failure: they become a quarantine row and a failing check that says why. A speedup table,
preview or check that breaks is a warning on the file's materialization, never a failure.
"""

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    BackfillPolicy,
    Backoff,
    DagsterEventType,
    Failure,
    Jitter,
    MetadataValue,
    RetryPolicy,
    asset,
)

from assets import metadata as md
from assets.partitions import INCOMING_FILES
from assets.resources import KindexResource
from pipelines.charts import geometric_mean, speedup_bars_png, speedups
from pipelines.ingest import (
    SCHEMA_CHECKED_RUNS,
    SnapshotRecords,
    process_snapshot,
    record_set_table,
    schema_sample,
    schema_verdict,
)
from pipelines.intake.reconcile import snapshots_of_versions
from pipelines.intake.sensor_cursor import ObjectVersionRef, parse_partition_key
from pipelines.intake.snapshots import Snapshot, TakenSnapshot, VersionChanged, read_and_keep

T = TypeVar("T")

GROUP = "kindex"
SNAPSHOT_KEY = AssetKey("snapshot")
RECORDS_KEY = AssetKey("records")
FILE_THREADS = 8
# A transient fault (S3 restarting, a dropped connection past the store's own retries) gets the
# step again; a retry redoes only the files not materialized yet.
FILE_RETRY_POLICY = RetryPolicy(
    max_retries=3, delay=1, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS
)


class VersionGone(RuntimeError):
    """The object version a partition names is no longer in the bucket and was never read."""


@dataclass(frozen=True, slots=True)
class NoSnapshot:
    """Why a file's snapshot could not be taken."""

    reason: str
    gone: bool  # the version was overwritten or deleted before it was read: nothing to do


@dataclass
class FileOutcome:
    """What one partition of a run produced, for checks that summarize the run per file."""

    partition_key: str
    runs: int = 0
    quarantined: int = 0
    top_reasons: list[tuple[str, int]] = field(default_factory=list)
    duplicate_external_ids: int = 0
    schema_failures: list[str] = field(default_factory=list)
    schema_checked: int = 0
    error: str | None = None
    gone: str | None = None  # the version was overwritten or deleted before it was read
    # The snapshot this step took (or why it could not), when the file had none yet.
    snapshot_taken: Snapshot | NoSnapshot | None = None
    warnings: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


@asset(
    key=SNAPSHOT_KEY,
    group_name=GROUP,
    partitions_def=INCOMING_FILES,
    backfill_policy=BackfillPolicy.single_run(),
    retry_policy=FILE_RETRY_POLICY,
    # Each file is materialized by its own event as it is done, never all at once by the step.
    output_required=False,
    description="An immutable, content-addressed copy of one dropped object version.",
    kinds={"s3"},
)
def snapshot(context: AssetExecutionContext, kindex: KindexResource) -> None:
    keys = list(context.partition_keys)
    # A backfill re-reads nothing: the copy exists, and the object may be gone since.
    known = known_snapshots(kindex, keys)
    work = lambda key: _snapshot_or_error(kindex, key, known.get(key))  # noqa: E731
    for partition_key, taken in each_file(work, keys):
        if isinstance(taken, NoSnapshot):
            # The records partition of this file fails with the same reason.
            context.log.warning(f"{partition_key}: {taken.reason}")
        # Logged as each file is done, so the event writes overlap the other files' work.
        context.log_event(snapshot_event(partition_key, taken))


def snapshot_event(partition_key: str, taken: Snapshot | NoSnapshot) -> AssetMaterialization:
    """A file's snapshot partition: the snapshot taken, or why it could not be."""
    metadata = snapshot_metadata(taken) if isinstance(taken, Snapshot) else {"error": taken.reason}
    return AssetMaterialization(SNAPSHOT_KEY, partition=partition_key, metadata=metadata)


def each_file(work: Callable[[str], T], partition_keys: Sequence[str]) -> Iterator[tuple[str, T]]:
    """`work` over each partition on a few threads, yielded here as each one finishes: a file
    costs about a dozen small S3 requests, which wait on the network, not the CPU. `work` must
    not raise: every file is done whatever happens to the others."""
    if len(partition_keys) <= 1:
        yield from ((key, work(key)) for key in partition_keys)
        return
    with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="kindex-file") as pool:
        futures = {pool.submit(work, key): key for key in partition_keys}
        for future in as_completed(futures):
            yield futures[future], future.result()


def known_snapshots(kindex: KindexResource, partition_keys: Sequence[str]) -> dict[str, Snapshot]:
    """The snapshot of each partition's object version that was read already, from the bucket."""
    refs: dict[str, ObjectVersionRef] = {}
    for key in partition_keys:
        try:
            refs[key] = parse_partition_key(key)
        except ValueError:
            continue  # that file fails on its own, with the parse error
    found = snapshots_of_versions(kindex.store, kindex.settings, list(refs.values()))
    return {key: found[ref] for key, ref in refs.items() if ref in found}


def _snapshot_or_error(
    kindex: KindexResource, partition_key: str, known: Snapshot | None
) -> Snapshot | NoSnapshot:
    if known is not None:
        return known
    taken = _taken_or_error(kindex, partition_key)
    return taken.snapshot if isinstance(taken, TakenSnapshot) else taken


def _taken_or_error(kindex: KindexResource, partition_key: str) -> TakenSnapshot | NoSnapshot:
    try:
        return take_partition_snapshot(kindex, partition_key)
    except VersionGone as gone:
        return NoSnapshot(describe(gone), gone=True)
    except Exception as error:  # this file's alone; the others go on
        return NoSnapshot(describe(error), gone=False)


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def take_partition_snapshot(kindex: KindexResource, partition_key: str) -> TakenSnapshot:
    ref = parse_partition_key(partition_key)
    info = kindex.store.head(ref.key)
    if info is None or not ref.matches(info.etag):
        raise VersionGone(
            f"s3://{kindex.store.bucket}/{ref.key} with ETag {ref.etag_prefix}... is gone "
            "(deleted or overwritten before it was read); a newer version has its own partition"
        )
    try:
        return read_and_keep(kindex.store, kindex.settings, ref.key, etag=info.etag)
    except VersionChanged as changed:
        raise VersionGone(str(changed)) from changed


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
        description="Run records validate against their kernelindex JSON Schema (a sample of "
        f"up to {SCHEMA_CHECKED_RUNS:,} per file, evenly spread).",
    ),
]


@asset(
    key=RECORDS_KEY,
    group_name=GROUP,
    deps=[SNAPSHOT_KEY],
    partitions_def=INCOMING_FILES,
    backfill_policy=BackfillPolicy.single_run(),
    retry_policy=FILE_RETRY_POLICY,
    check_specs=CHECKS,
    # Each file is materialized by its own event as it is done, never all at once by the step.
    output_required=False,
    description="kernelindex.dev/v1alpha1 records and quarantine rows of one snapshot, "
    "normalized by the current parser (backfill to re-process).",
    kinds={"parquet", "s3"},
)
def records(context: AssetExecutionContext, kindex: KindexResource) -> Iterator[AssetCheckResult]:
    keys = pending_partitions(context, RECORDS_KEY)
    known = known_snapshots(kindex, keys)
    outcomes: list[FileOutcome] = []
    work = lambda key: process_partition(kindex, key, known.get(key))  # noqa: E731
    for partition_key, outcome in each_file(work, keys):
        outcomes.append(outcome)
        if outcome.snapshot_taken is not None:
            context.log_event(snapshot_event(partition_key, outcome.snapshot_taken))
        if outcome.error:
            context.log.error(f"{partition_key}: {outcome.error}")
            continue
        if outcome.gone:  # nothing to process, nor ever will be: neither done nor failed
            context.log.warning(f"{partition_key}: {outcome.gone}")
            continue
        for warning in outcome.warnings:
            context.log.warning(f"{partition_key}: {warning}")
        context.log_event(
            AssetMaterialization(RECORDS_KEY, partition=partition_key, metadata=outcome.metadata)
        )
        outcome.metadata = {}  # logged: a run over many files keeps only the counts
    yield from file_checks(outcomes)
    failed = [o for o in outcomes if o.error]
    if failed:
        raise Failure(
            description=f"{len(failed)} of {len(outcomes)} files failed (the others are "
            f"materialized): {', '.join(o.partition_key for o in failed[:5])}"
            + (", ..." if len(failed) > 5 else ""),
            metadata={
                "failed_files": MetadataValue.md(
                    md.markdown_table(
                        [{"file": o.partition_key, "error": o.error} for o in failed],
                        ["file", "error"],
                    )
                )
            },
        )


def pending_partitions(context: AssetExecutionContext, asset_key: AssetKey) -> list[str]:
    """The run's partitions, less those a previous attempt of this step materialized."""
    keys = list(context.partition_keys)
    if context.retry_number == 0:
        return keys
    done: set[str] = set()
    cursor = None
    while True:
        page = context.instance.get_records_for_run(
            context.run.run_id, cursor=cursor, of_type=DagsterEventType.ASSET_MATERIALIZATION
        )
        for record in page.records:
            event = record.event_log_entry.dagster_event
            if event is not None and event.asset_key == asset_key and event.partition:
                done.add(event.partition)
        if not page.has_more:
            break
        cursor = page.cursor
    return [key for key in keys if key not in done]


def process_partition(
    kindex: KindexResource, partition_key: str, snap: Snapshot | None
) -> FileOutcome:
    """Normalize one file's snapshot into its record set; never raises, so one bad file
    cannot fail the other files of the run. A file without a snapshot yet gets one here: the
    sensors' runs are of this step alone (each asset of a run costs a planned event per file),
    and a retry of this step covers both."""
    outcome = FileOutcome(partition_key)
    taken: TakenSnapshot | None = None
    if snap is None:
        attempt = _taken_or_error(kindex, partition_key)
        if isinstance(attempt, NoSnapshot):
            outcome.snapshot_taken = attempt
            if attempt.gone:
                outcome.gone = attempt.reason
            else:
                outcome.error = attempt.reason
            return outcome
        taken = attempt
        snap = outcome.snapshot_taken = taken.snapshot
    try:
        result = process_snapshot(kindex.store, kindex.settings, snap, taken)
    except Exception as error:  # this file's alone; the others go on
        outcome.error = describe(error)
        return outcome
    outcome.runs = result.runs
    outcome.quarantined = result.quarantined
    outcome.top_reasons = Counter(result.quarantined_by_reason).most_common(5)
    metadata = cosmetic(
        outcome, "metadata", lambda: records_metadata(kindex, snap, result, outcome)
    )
    outcome.metadata = metadata or {
        **snapshot_metadata(snap),
        "runs": MetadataValue.int(outcome.runs),
        "quarantined_rows": MetadataValue.int(outcome.quarantined),
        "warnings": MetadataValue.md("\n".join(f"- {w}" for w in outcome.warnings)),
    }
    return outcome


def cosmetic(outcome: FileOutcome, what: str, work: Callable[[], T]) -> T | None:
    """A preview, chart or check of a file: what breaks there is a warning, not a failure."""
    try:
        return work()
    except Exception as error:
        outcome.warnings.append(f"{what} failed: {describe(error)}")
        return None


# Drawing the chart costs more CPU than processing a small file; below this many runs a file gets
# the speedups as a table only (a burst of small files is mostly small files).
CHART_MIN_RUNS = 500
SPEEDUP_COLUMNS = ["kernel", "provider", "mode", "gpu", "case_key", "metric", "median"]


def records_metadata(
    kindex: KindexResource, snap: Snapshot, result: SnapshotRecords, outcome: FileOutcome
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        **snapshot_metadata(snap),
        "parser_version": result.parser_version,
        "rows": MetadataValue.int(result.rows),
        "runs": MetadataValue.int(outcome.runs),
        **{f"runs_{metric}": MetadataValue.int(n) for metric, n in result.runs_by_metric.items()},
        "quarantined_rows": MetadataValue.int(outcome.quarantined),
        "top_quarantine_reasons": MetadataValue.md(md.reasons_markdown(outcome.top_reasons)),
        "record_set": f"s3://{snap.bucket}/{result.prefix}",
    }
    previews = cosmetic(outcome, "preview", lambda: previews_metadata(result))
    meta.update(previews or {})
    if result.runs:
        runs = cosmetic(outcome, "reading the runs for checks", lambda: file_runs(kindex, result))
        if runs is not None:
            check_runs(outcome, runs)
            by_series = cosmetic(outcome, "speedups", lambda: series_speedups(runs))
            if by_series:
                meta["speedups"] = MetadataValue.md(speedup_table(by_series))
            if by_series and result.runs >= CHART_MIN_RUNS:
                title = f"Speedups in {snap.key}"
                png = cosmetic(outcome, "speedup chart", lambda: speedup_bars_png(by_series, title))
                if png is not None:
                    meta["speedup_chart"] = MetadataValue.md(
                        md.png_markdown(png, "speedups over baseline")
                    )
    if outcome.warnings:
        meta["warnings"] = MetadataValue.md("\n".join(f"- {w}" for w in outcome.warnings))
    return meta


def previews_metadata(result: SnapshotRecords) -> dict[str, Any]:
    return {
        "runs_preview": MetadataValue.md(
            md.markdown_table(result.run_preview, list(result.run_preview[0]))
            if result.run_preview
            else "_no runs_"
        ),
        "quarantine_preview": MetadataValue.md(
            md.markdown_table(result.quarantine_preview, ["source_line", "reason", "detail"])
        ),
    }


RUN_COLUMNS = [*SPEEDUP_COLUMNS, "external_id", "manifest"]


def file_runs(kindex: KindexResource, result: SnapshotRecords) -> Any:
    """The run columns the checks and the speedups read (an Arrow table), from what writing the
    record set just put in the local cache."""
    return record_set_table(kindex.store, kindex.settings, result.run_keys, RUN_COLUMNS)


def check_runs(outcome: FileOutcome, runs: Any) -> None:
    outcome.duplicate_external_ids = (
        cosmetic(outcome, "duplicate check", lambda: duplicate_count(runs.column("external_id")))
        or 0
    )
    verdict = cosmetic(
        outcome, "schema check", lambda: schema_verdict(schema_sample(runs.column("manifest")))
    )
    if verdict is not None:
        outcome.schema_failures = verdict.failures
        outcome.schema_checked = verdict.checked


def series_speedups(runs: Any) -> dict[str, list[float]]:
    """Speedups per kernel and provider (pipelines/charts.py), over the latency runs only."""
    import pyarrow.compute as pc

    latency = runs.filter(pc.equal(runs.column("metric"), "latency")).select(SPEEDUP_COLUMNS)
    return speedups(latency.to_pylist())


def speedup_table(by_series: dict[str, list[float]]) -> str:
    """Geometric-mean speedups over the cohort's baseline provider, per kernel and provider: the
    numbers of the speedup chart (pipelines/charts.py), drawn only for files of CHART_MIN_RUNS
    runs or more."""
    rows = [
        {"series": name, "cohorts": len(values), "speedup": f"{geometric_mean(values):.3g}x"}
        for name, values in sorted(by_series.items())
    ]
    return md.markdown_table(rows, ["series", "cohorts", "speedup"])


def duplicate_count(values: Any) -> int:
    """How many runs repeat an externalId already held by an earlier one (an Arrow column)."""
    import pyarrow.compute as pc

    counts = pc.value_counts(values).field("counts")
    return int(pc.sum(pc.subtract(counts, 1)).as_py() or 0)


def file_checks(outcomes: list[FileOutcome]) -> Iterator[AssetCheckResult]:
    """One result per check for the run, with a row per file so a person sees which one."""
    table = md.markdown_table(
        [
            {
                "file": o.partition_key,
                "runs": o.runs,
                "quarantined": o.quarantined,
                "top reasons": o.error or o.gone or md.reasons_markdown(o.top_reasons),
            }
            for o in outcomes
        ],
        ["file", "runs", "quarantined", "top reasons"],
    )
    failed = [o for o in outcomes if o.error or o.gone or (o.runs == 0 and o.quarantined)]
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
            # up to SCHEMA_CHECKED_RUNS runs of each file, evenly spread over it
            "runs_checked": MetadataValue.int(sum(o.schema_checked for o in outcomes)),
            "examples": MetadataValue.md(
                "\n".join(f"- {f}" for f in schema_failures[:10]) or "none"
            ),
        },
    )


FILE_ASSETS = [snapshot, records]
