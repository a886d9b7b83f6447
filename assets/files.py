"""The file asset: batches of dropped object versions into record sets and the index.

`records` is partitioned by arrival window (assets/partitions.py). A run processes one batch of
files (pipelines/ingest.py `process_batch`): each file's snapshot and record set, then the index,
then one append to the file ledger. Whatever its size, a batch costs Dagster a materialization
and three check results: each file's state, reason and attempts are ledger rows (the `files`
view) and a table on the batch's materialization. One file's failure is its own: a `failed`
row, retried with backoff by the ledger sensor, never a failed run for its neighbours.

Which files a run takes: the sensors name a batch (`batch` in the run's config), written to the
ledger as pending before the run was requested; a backfill of windows (from the UI) takes every
file that arrived in them. `reprocess_files` is the launchpad's job for a glob or a list of keys
(`kindex backfill GLOB` launches it).
"""

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    BackfillPolicy,
    Backoff,
    Config,
    Jitter,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
    RetryPolicy,
    asset,
    job,
    op,
)

from assets import metadata as md
from assets.partitions import ARRIVAL_WINDOWS
from assets.resources import KindexResource
from pipelines.charts import geometric_mean, speedup_bars_png, speedups
from pipelines.ingest import (
    SCHEMA_CHECKED_RUNS,
    BatchResult,
    FileResult,
    describe,
    process_batches,
    runs_by_snapshot,
    schema_sample,
    schema_verdict,
)
from pipelines.intake.ledger import FileEntry, FileState

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")

GROUP = "kindex"
RECORDS_KEY = AssetKey("records")
FILE_TABLE_ROWS = 200  # files listed on a materialization (all are in the `files` view)
# A transient fault of the batch as a whole (the index's publish, the ledger's commit) gets the
# step again: files already written find their record sets and add nothing twice.
FILE_RETRY_POLICY = RetryPolicy(
    max_retries=3, delay=1, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS
)


class BatchConfig(Config):
    """Which files a run of `records` processes. Empty: every file that arrived in the run's
    windows (a backfill from the UI)."""

    batch: str = ""  # a batch the sensors wrote to the ledger as pending
    files: list[str] = []  # object keys or globs (each key's newest version)
    quarantined: bool = False  # only files that had quarantined rows


class ReprocessConfig(Config):
    """The files `reprocess_files` processes again with the current parser."""

    files: list[str] = ["incoming/*"]  # object keys or globs (each key's newest version)
    quarantined: bool = False  # only files that had quarantined rows


CHECKS = [
    AssetCheckSpec(
        "every_file_processed",
        asset=RECORDS_KEY,
        description="No file of the batch failed (a failed file is retried with backoff; the "
        "`files` view has its reason and attempts).",
    ),
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
    partitions_def=ARRIVAL_WINDOWS,
    backfill_policy=BackfillPolicy.single_run(),
    retry_policy=FILE_RETRY_POLICY,
    check_specs=CHECKS,
    description="kernelindex.dev/v1alpha1 records and quarantine rows of the files that arrived "
    "in a window, normalized by the current parser, and the index over them (backfill a "
    "window to re-process its files).",
    kinds={"parquet", "s3"},
)
def records(
    context: AssetExecutionContext, config: BatchConfig, kindex: KindexResource
) -> Iterator[MaterializeResult | AssetCheckResult]:
    ledger = kindex.ledger
    if config.batch:
        entries = ledger.of_batch(config.batch)
    else:
        window = context.partition_key_range
        entries = ledger.select(
            patterns=config.files,
            quarantined=config.quarantined,
            windows=(window.start, window.end),
        )
    batch = config.batch or context.run.run_id
    context.log.info(f"batch {batch}: {len(entries)} files")
    results = list(process_batches(kindex.store, kindex.settings, entries, batch))
    result = BatchResult.merged(batch, results)
    log_failures(context, result)
    checks = BatchChecks.of(kindex, result)
    yield MaterializeResult(metadata=batch_metadata(result, checks))
    yield from checks.results()


@op(description="Process again, with the current parser, the files whose keys match.")
def reprocess(context: OpExecutionContext, config: ReprocessConfig, kindex: KindexResource) -> None:
    entries = kindex.ledger.select(patterns=config.files, quarantined=config.quarantined)
    context.log.info(f"{len(entries)} files match {config.files}")
    for result in process_batches(kindex.store, kindex.settings, entries, context.run_id):
        log_failures(context, result)
        checks = BatchChecks.of(kindex, result)
        by_window: dict[str, list[FileResult]] = {}
        for file in result.files:
            by_window.setdefault(file.entry.arrival_window, []).append(file)
        for window, files in sorted(by_window.items()):
            context.log_event(
                AssetMaterialization(
                    RECORDS_KEY,
                    partition=window,
                    metadata=batch_metadata(BatchResult(result.batch, files, result.index), checks),
                )
            )


@job(description="Re-process files chosen by glob or key (`kindex backfill GLOB` launches it).")
def reprocess_files() -> None:
    reprocess()


def log_failures(context: AssetExecutionContext | OpExecutionContext, result: BatchResult) -> None:
    for file in result.files:
        if file.entry.state is FileState.FAILED:
            context.log.error(f"{file.entry.key}: {file.entry.reason}")
        elif file.entry.state is FileState.GONE:
            context.log.warning(f"{file.entry.key}: {file.entry.reason}")


def batch_metadata(result: BatchResult, checks: "BatchChecks") -> dict[str, Any]:
    runs = sum(f.entry.runs for f in result.files)
    quarantined = sum(f.entry.quarantined for f in result.files)
    meta: dict[str, Any] = {
        "batch": result.batch,
        "files": MetadataValue.int(len(result.files)),
        **{
            f"files_{state}": MetadataValue.int(result.count(state))
            for state in FileState
            if state is not FileState.PENDING
        },
        "runs": MetadataValue.int(runs),
        "quarantined_rows": MetadataValue.int(quarantined),
        "per_file": MetadataValue.md(file_table(result.files)),
    }
    if result.index is not None:
        meta["index_version"] = str(result.index.version)
        meta["index_new_runs"] = MetadataValue.int(result.index.new_runs)
    if checks.speedups:
        meta["speedups"] = MetadataValue.md(checks.speedups)
    if checks.chart:
        meta["speedup_chart"] = MetadataValue.md(checks.chart)
    if checks.warnings:
        meta["warnings"] = MetadataValue.md("\n".join(f"- {w}" for w in checks.warnings))
    return meta


def file_table(files: Sequence[FileResult]) -> str:
    rows = [
        {
            "file": f.entry.key,
            "state": str(f.entry.state),
            "runs": f.entry.runs,
            "quarantined": f.entry.quarantined,
            "attempts": f.entry.attempts,
            "reason": f.entry.reason or "",
        }
        for f in files[:FILE_TABLE_ROWS]
    ]
    table = md.markdown_table(rows, ["file", "state", "runs", "quarantined", "attempts", "reason"])
    more = len(files) - FILE_TABLE_ROWS
    return table + (f"\n\n_and {more} more in the `files` view_" if more > 0 else "")


class BatchChecks:
    """The data checks of a batch, each a cosmetic step: what breaks is a warning."""

    def __init__(self, result: BatchResult) -> None:
        self.result = result
        self.warnings: list[str] = []
        self.duplicates = 0
        self.schema_failures: list[str] = []
        self.schema_checked = 0
        self.speedups = ""
        self.chart = ""

    @classmethod
    def of(cls, kindex: KindexResource, result: BatchResult) -> "BatchChecks":
        checks = cls(result)
        latency: list[pa.Table] = []
        with_runs = [(f.entry, f.records) for f in result.files if f.records and f.records.runs]
        runs = checks.cosmetic(
            "reading the batch's runs",
            lambda: runs_by_snapshot(
                kindex.store, kindex.settings, [records for _, records in with_runs], COLUMNS
            ),
        )
        for entry, records in with_runs:
            own = runs.get(records.snapshot_digest) if runs is not None else None
            if own is not None:
                checks.check(entry, own)
                latency.append(own)
        by_series = checks.cosmetic("speedups", lambda: series_speedups(latency))
        if by_series:
            checks.speedups = speedup_table(by_series)
            if sum(t.num_rows for t in latency) >= CHART_MIN_RUNS:
                title = f"Speedups in batch {result.batch}"
                png = checks.cosmetic("speedup chart", lambda: speedup_bars_png(by_series, title))
                if png is not None:
                    checks.chart = md.png_markdown(png, "speedups over baseline")
        return checks

    def cosmetic(self, what: str, work: Callable[[], T]) -> T | None:
        try:
            return work()
        except Exception as error:
            self.warnings.append(f"{what} failed: {describe(error)}")
            return None

    def check(self, entry: FileEntry, runs: "pa.Table") -> None:
        import pyarrow.compute as pc

        counts = pc.value_counts(runs.column("external_id")).field("counts")
        self.duplicates += int(pc.sum(pc.subtract(counts, 1)).as_py() or 0)
        verdict = self.cosmetic(
            f"{entry.key}: schema check",
            lambda: schema_verdict(schema_sample(runs.column("manifest"))),
        )
        if verdict is not None:
            self.schema_failures += verdict.failures
            self.schema_checked += verdict.checked

    def results(self) -> Iterator[AssetCheckResult]:
        files = self.result.files
        failed = [f for f in files if f.entry.state is FileState.FAILED]
        yield AssetCheckResult(
            check_name="every_file_processed",
            passed=not failed,
            severity=AssetCheckSeverity.WARN,
            metadata={
                "failed_files": MetadataValue.int(len(failed)),
                "gone_files": MetadataValue.int(self.result.count(FileState.GONE)),
                "failures": MetadataValue.md(
                    md.markdown_table(
                        [{"file": f.entry.key, "reason": f.entry.reason} for f in failed[:50]],
                        ["file", "reason"],
                    )
                ),
            },
        )
        without_runs = [
            f for f in files if f.entry.state in (FileState.QUARANTINED, FileState.FAILED)
        ]
        quarantined = sum(f.entry.quarantined for f in files)
        reasons: Counter[str] = Counter()
        for f in files:
            if f.records is not None:
                reasons.update(f.records.quarantined_by_reason)
        yield AssetCheckResult(
            check_name="no_quarantined_rows",
            passed=quarantined == 0 and not without_runs,
            # Quarantine of a few rows is expected until the curation knows them; a file with
            # no usable row at all (garbage, unknown format) or one that failed is an error.
            severity=AssetCheckSeverity.ERROR if without_runs else AssetCheckSeverity.WARN,
            metadata={
                "quarantined_rows": MetadataValue.int(quarantined),
                "files_without_runs": MetadataValue.int(len(without_runs)),
                "top_reasons": MetadataValue.md(md.reasons_markdown(reasons.most_common(5))),
                "per_file": MetadataValue.md(file_table(files)),
            },
        )
        yield AssetCheckResult(
            check_name="unique_external_ids",
            passed=self.duplicates == 0,
            metadata={"duplicate_external_ids": MetadataValue.int(self.duplicates)},
        )
        yield AssetCheckResult(
            check_name="records_match_schemas",
            passed=not self.schema_failures,
            metadata={
                "failing_records": MetadataValue.int(len(self.schema_failures)),
                "runs_checked": MetadataValue.int(self.schema_checked),
                "examples": MetadataValue.md(
                    "\n".join(f"- {f}" for f in self.schema_failures[:10]) or "none"
                ),
            },
        )


# Drawing the chart costs more CPU than processing a small file: a batch gets it from this many
# runs, the speedups as a table below.
CHART_MIN_RUNS = 500
SPEEDUP_COLUMNS = ["kernel", "provider", "mode", "gpu", "case_key", "metric", "median"]
COLUMNS = [*SPEEDUP_COLUMNS, "external_id", "manifest"]


def series_speedups(tables: Sequence["pa.Table"]) -> dict[str, list[float]]:
    """Speedups per kernel and provider (pipelines/charts.py), over the latency runs only."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not tables:
        return {}
    runs = pa.concat_tables([t.select(SPEEDUP_COLUMNS) for t in tables])
    return speedups(runs.filter(pc.equal(runs.column("metric"), "latency")).to_pylist())


def speedup_table(by_series: dict[str, list[float]]) -> str:
    """Geometric-mean speedups over the cohort's baseline provider, per kernel and provider."""
    rows = [
        {"series": name, "cohorts": len(values), "speedup": f"{geometric_mean(values):.3g}x"}
        for name, values in sorted(by_series.items())
    ]
    return md.markdown_table(rows, ["series", "cohorts", "speedup"])


FILE_ASSETS = [records]
FILE_JOBS = [reprocess_files]
