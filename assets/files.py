"""The file asset: batches of dropped object versions into record sets and the index.

`records` is partitioned by arrival window (assets/partitions.py: the hours that hold files). A
run processes one batch of files (pipelines/ingest.py `process_batch`): each file's snapshot and
record set, then one append to the file ledger, then the index. Whatever its size, a batch costs
Dagster a materialization per window and four check results: each file's state, reason and
attempts are ledger rows (the `files` view). A window's materialization says what the ledger
holds for the whole window, every batch of it counted, not only the batch that ran last.
One file's failure is its own: a `failed` row, retried with backoff by the ledger sensor, never a
failed run for its neighbours.

Which files a run takes: the sensors name a batch (`batch` in the run's config), written to the
ledger as pending before the run was requested; a backfill of windows (from the UI) takes every
file that arrived in them. `reprocess_files` is the launchpad's job for a glob or a list of keys
(`kindex backfill GLOB` launches it); it reports the same materializations and checks.
"""

import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetMaterialization,
    AssetSelection,
    BackfillPolicy,
    BetaWarning,
    Config,
    DagsterInstance,
    DagsterRunStatus,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
    PreviewWarning,
    RunsFilter,
    asset,
    define_asset_job,
    job,
    op,
)

from assets import metadata as md
from assets.conventions import (
    FILE_RETRY_POLICY,
    GROUP,
    OWNERS,
    RECORDS_KEY,
    records_code_version,
)
from assets.partitions import ARRIVAL_WINDOWS
from assets.published import file_records, publish_report, records_table
from assets.resources import KindexResource
from pipelines.charts import SPEEDUP_COLUMNS, geometric_mean, speedup_bars_png, speedup_series
from pipelines.index.local import open_index
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
from pipelines.intake.ledger import FileEntry, FileState, Ledger, select_filter

T = TypeVar("T")

FILE_TABLE_ROWS = 200  # files listed on a materialization (all are in the `files` view)


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


# Every key of a window's materialization, with what it means (shown in the asset's description).
WINDOW_KEYS = {
    "files": "Object versions that arrived in the window, every batch of it counted.",
    **{
        f"files_{state}": f"Of those, the ones now {state}."
        for state in FileState
        if state is not FileState.PENDING
    },
    "files_pending": "Of those, the ones not processed yet (or being processed).",
    "runs": "Runs the window's files yielded (as the ledger counts them).",
    "quarantined_rows": "Rows of the window's files kept aside, with a reason.",
    "batches": "Batches that processed the window's files.",
    "per_file": "Each file of the window: its state, runs, quarantined rows, attempts, reason.",
    "this_run_files": "Files of the window this run processed.",
    "batch": "The batch this run processed (the sensors' id, or the run's).",
    "index_version": "The index version this run published.",
    "speedups": "Per kernel, pass, GPU and provider: the geometric-mean speedup over the "
    "cohort's baseline provider, of the window's runs (the index's speedups view).",
    "speedup_chart": "The same as bars, the extremes where there are many (from 500 speedups).",
    "speedups_deferred": "Batch runs that waited behind this one: the window's speedups and "
    "chart were left to the batch that finds none waiting (they read every batch's runs).",
    "warnings": "What could not be reported (never a failure of a file).",
}

CHECK_DESCRIPTIONS = {
    "every_file_processed": "No file of the batch failed (a failed file is retried with backoff; "
    "the `files` view has its reason and attempts).",
    "no_quarantined_rows": "Rows kept aside per file, with the top reasons.",
    "unique_external_ids": "No externalId appears twice among a file's runs.",
    "records_match_schemas": "Run records validate against their kernelindex JSON Schema (a "
    f"sample of up to {SCHEMA_CHECKED_RUNS:,} per file, evenly spread).",
}

# Partitioned checks (a preview of Dagster's): each result names its window. Said here once, not
# in every process that loads the definitions.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", PreviewWarning)
    CHECKS = [
        AssetCheckSpec(name, asset=RECORDS_KEY, description=text, partitions_def=ARRIVAL_WINDOWS)
        for name, text in CHECK_DESCRIPTIONS.items()
    ]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One check's result over some files (a window's, of one run)."""

    name: str
    passed: bool
    severity: AssetCheckSeverity
    metadata: dict[str, object]

    def result(self) -> AssetCheckResult:
        return AssetCheckResult(
            check_name=self.name,
            passed=self.passed,
            severity=self.severity,
            metadata=self.metadata,  # type: ignore[arg-type]
        )

    def evaluation(self, window: str) -> AssetCheckEvaluation:
        return AssetCheckEvaluation(
            asset_key=RECORDS_KEY,
            check_name=self.name,
            passed=self.passed,
            severity=self.severity,
            metadata=self.metadata,  # type: ignore[arg-type]
            partition=window,
        )


with warnings.catch_warnings():  # BackfillPolicy is beta: said here once, not at every load
    warnings.simplefilter("ignore", BetaWarning)

    @asset(
        key=RECORDS_KEY,
        group_name=GROUP,
        owners=OWNERS,
        partitions_def=ARRIVAL_WINDOWS,
        backfill_policy=BackfillPolicy.single_run(),
        retry_policy=FILE_RETRY_POLICY,
        check_specs=CHECKS,
        code_version=records_code_version(),
        description="kernelindex.dev/v1alpha1 records and quarantine rows of the files that "
        "arrived in a window (an hour that holds files), normalized by the current parser, in "
        "Parquet record sets in the bucket; each run publishes the index over them too "
        "(backfill a window to re-process its files).\n\nMetadata:\n\n"
        + "\n".join(f"- `{key}`: {meaning}" for key, meaning in WINDOW_KEYS.items()),
        kinds={"s3", "parquet"},
    )
    def records(
        context: AssetExecutionContext, config: BatchConfig, kindex: KindexResource
    ) -> Iterator[MaterializeResult[None] | AssetCheckResult]:
        ledger = kindex.ledger
        keys = context.partition_key_range
        # A sensor's batch is one window, named by the run: `partition_keys` would first look
        # each key up among the instance's partitions, on the way of a lone file to the index.
        windows = [keys.start] if keys.start == keys.end else list(context.partition_keys)
        if config.batch:
            # A sensor's batch holds one window's files, its run that window's partition.
            entries = ledger.of_batch(config.batch, windows[0] if len(windows) == 1 else None)
        else:
            entries = ledger.select(
                patterns=config.files, quarantined=config.quarantined, windows=windows
            )
        batch = config.batch or context.run.run_id
        context.log.info(f"batch {batch}: {len(entries)} files in {len(windows)} windows")
        results = list(process_batches(kindex.store, kindex.settings, entries, batch))
        result = BatchResult.merged(batch, results)
        log_failures(context, result)
        # While batches of a burst wait for a run slot, this one leaves the window's speedups to
        # the batch that finds none waiting (it reads every batch's runs of the window).
        waiting = batches_waiting(context.instance)
        report = BatchReport.of(kindex, result, windows, speedups_waiting=waiting)
        for window in windows:
            context.add_asset_metadata(report.window_metadata(window), partition_key=window)
        yield MaterializeResult(metadata={"batch": batch})
        if len(windows) == 1:
            for verdict in report.verdicts(windows[0]):
                yield verdict.result()
        else:
            # A check has one result a run: the run's, then each window's own.
            for verdict in report.verdicts(None):
                yield verdict.result()
            for window in windows:
                for verdict in report.verdicts(window):
                    log_event(context, verdict.evaluation(window))
        log_publish(context, kindex, result)


@op(description="Process again, with the current parser, the files whose keys match.")
def reprocess(context: OpExecutionContext, config: ReprocessConfig, kindex: KindexResource) -> None:
    entries = kindex.ledger.select(patterns=config.files, quarantined=config.quarantined)
    context.log.info(f"{len(entries)} files match {config.files}")
    windows = sorted({e.arrival_window for e in entries})
    # Windows of a home older than the arrival partitions are partitions from now on.
    missing = [
        w
        for w in windows
        if not context.instance.has_dynamic_partition(str(ARRIVAL_WINDOWS.name), w)
    ]
    if missing:
        context.instance.add_dynamic_partitions(str(ARRIVAL_WINDOWS.name), missing)
    for result in process_batches(kindex.store, kindex.settings, entries, context.run_id):
        log_failures(context, result)
        touched = sorted({f.entry.arrival_window for f in result.files})
        report = BatchReport.of(kindex, result, touched)
        for window in touched:
            context.log_event(
                AssetMaterialization(
                    RECORDS_KEY,
                    partition=window,
                    metadata=report.window_metadata(window),  # type: ignore[arg-type]
                )
            )
            for verdict in report.verdicts(window):
                log_event(context, verdict.evaluation(window))
        log_publish(context, kindex, result)


@job(description="Re-process files chosen by glob or key (`kindex backfill GLOB` launches it).")
def reprocess_files() -> None:
    reprocess()


# The sensors' batch runs: a named job, not Dagster's anonymous asset job.
ingest_batch = define_asset_job(
    "ingest_batch",
    selection=AssetSelection.assets(RECORDS_KEY),
    description="One batch of dropped files: their record sets, the ledger, then the index.",
)


def batches_waiting(instance: DagsterInstance) -> int:
    """Batch runs queued for a run slot (a burst being worked through)."""
    return instance.get_runs_count(
        RunsFilter(job_name=ingest_batch.name, statuses=[DagsterRunStatus.QUEUED])
    )


def log_failures(context: AssetExecutionContext | OpExecutionContext, result: BatchResult) -> None:
    for file in result.files:
        if file.entry.state is FileState.FAILED:
            context.log.error(f"{file.entry.key}: {file.entry.reason}")
        elif file.entry.state is FileState.GONE:
            context.log.warning(f"{file.entry.key}: {file.entry.reason}")


def log_publish(
    context: AssetExecutionContext | OpExecutionContext, kindex: KindexResource, result: BatchResult
) -> None:
    """The index this run published, as a materialization of `index` (and of the tables people
    query) with the index's checks: the batch run is what publishes it."""
    if result.index is None:
        return
    report = publish_report(kindex, result.index, result.requeued, context.job_name)
    for event in report.events():
        log_event(context, event)


def log_event(
    context: AssetExecutionContext | OpExecutionContext,
    event: AssetMaterialization | AssetCheckEvaluation,
) -> None:
    # log_event records check evaluations too (its body handles them); its annotation omits them.
    context.log_event(event)  # type: ignore[arg-type]


@dataclass(slots=True)
class FileChecks:
    """What the checks found in one file's runs."""

    duplicates: int = 0
    schema_failures: list[str] = field(default_factory=list)
    schema_checked: int = 0


class BatchReport:
    """What a run reports per window: the ledger's count of the whole window (every batch),
    this run's files, the checks over them, the window's speedups. Each part is cosmetic: what
    breaks is a warning, never a failed file."""

    def __init__(
        self, result: BatchResult, windows: Sequence[str], speedups_waiting: int = 0
    ) -> None:
        self.result = result
        self.windows = list(windows)
        self.speedups_waiting = speedups_waiting  # batch runs queued: the speedups left to them
        self.warnings: list[str] = []
        self.checked: dict[tuple[str, str], FileChecks] = {}
        self.ledger: dict[str, list[FileEntry]] = {}
        self.window_runs: dict[str, pa.Table] = {}

    @classmethod
    def of(
        cls,
        kindex: KindexResource,
        result: BatchResult,
        windows: Sequence[str],
        speedups_waiting: int = 0,
    ) -> "BatchReport":
        report = cls(result, windows, speedups_waiting)
        with_runs = [(f.entry, f.records) for f in result.files if f.records and f.records.runs]
        runs = report.cosmetic(
            "reading the batch's runs",
            lambda: runs_by_snapshot(
                kindex.store, kindex.settings, [records for _, records in with_runs], COLUMNS
            ),
        )
        for entry, records in with_runs:
            own = runs.get(records.snapshot_digest) if runs is not None else None
            if own is not None:
                report.checked[(entry.key, entry.etag)] = report.check(entry, own)
        ledger = report.cosmetic(
            "reading the ledger", lambda: window_entries(kindex.ledger, windows)
        )
        report.ledger = ledger or {}
        if result.index is not None and not speedups_waiting:
            found = report.cosmetic(
                "reading the windows' runs", lambda: window_runs(kindex, report.ledger)
            )
            report.window_runs = found or {}
        return report

    def cosmetic(self, what: str, work: Callable[[], T]) -> T | None:
        try:
            return work()
        except Exception as error:
            self.warnings.append(f"{what} failed: {describe(error)}")
            return None

    def check(self, entry: FileEntry, runs: "pa.Table") -> FileChecks:
        found = FileChecks()
        counts = pc.value_counts(runs.column("external_id")).field("counts")
        found.duplicates = int(pc.sum(pc.subtract(counts, 1)).as_py() or 0)
        verdict = self.cosmetic(
            f"{entry.key}: schema check",
            lambda: schema_verdict(schema_sample(runs.column("manifest"))),
        )
        if verdict is not None:
            found.schema_failures = list(verdict.failures)
            found.schema_checked = verdict.checked
        return found

    def files(self, window: str | None) -> list[FileResult]:
        """This run's files of a window (of every window: None)."""
        return [f for f in self.result.files if window in (None, f.entry.arrival_window)]

    def window_metadata(self, window: str) -> dict[str, object]:
        entries = self.ledger.get(window, [])
        states = Counter(e.state for e in entries)
        meta: dict[str, object] = {
            "files": MetadataValue.int(len(entries)),
            **{f"files_{s}": MetadataValue.int(states[s]) for s in FileState},
            "runs": MetadataValue.int(sum(e.runs for e in entries)),
            "quarantined_rows": MetadataValue.int(sum(e.quarantined for e in entries)),
            "batches": MetadataValue.int(len({e.batch for e in entries if e.batch})),
            "per_file": file_records(entries[:FILE_TABLE_ROWS]),
            "this_run_files": MetadataValue.int(len(self.files(window))),
        }
        if self.result.index is not None:
            meta["index_version"] = str(self.result.index.version)
        if self.speedups_waiting:
            meta["speedups_deferred"] = MetadataValue.int(self.speedups_waiting)
        runs = self.window_runs.get(window)
        if runs is not None and runs.num_rows:
            by_series = self.cosmetic("speedups", lambda: series_speedups([runs]))
            if by_series:
                meta["speedups"] = speedup_table(by_series)
                if runs.num_rows >= CHART_MIN_RUNS:
                    shown, title = chart_series(by_series, window)
                    png = self.cosmetic("speedup chart", lambda: speedup_bars_png(shown, title))
                    if png is not None:
                        meta["speedup_chart"] = MetadataValue.md(
                            md.png_markdown(png, "speedups over baseline")
                        )
        if self.warnings:
            meta["warnings"] = MetadataValue.md("\n".join(f"- {w}" for w in self.warnings))
        return meta

    def verdicts(self, window: str | None) -> list[Verdict]:
        """The checks over this run's files of a window (of all windows: None)."""
        files = self.files(window)
        found = [
            self.checked[k] for f in files if (k := (f.entry.key, f.entry.etag)) in self.checked
        ]
        where = {"window": window or ", ".join(self.windows)}
        failed = [f for f in files if f.entry.state is FileState.FAILED]
        without_runs = [
            f for f in files if f.entry.state in (FileState.QUARANTINED, FileState.FAILED)
        ]
        quarantined = sum(f.entry.quarantined for f in files)
        reasons: Counter[str] = Counter()
        for f in files:
            if f.records is not None:
                reasons.update(f.records.quarantined_by_reason)
        duplicates = sum(c.duplicates for c in found)
        schema_failures = [failure for c in found for failure in c.schema_failures]
        return [
            Verdict(
                "every_file_processed",
                not failed,
                AssetCheckSeverity.WARN,
                {
                    **where,
                    "failed_files": MetadataValue.int(len(failed)),
                    "gone_files": MetadataValue.int(
                        sum(1 for f in files if f.entry.state is FileState.GONE)
                    ),
                    "failures": file_records([f.entry for f in failed[:50]]),
                },
            ),
            Verdict(
                "no_quarantined_rows",
                quarantined == 0 and not without_runs,
                # Quarantine of a few rows is expected until the curation knows them; a file
                # with no usable row at all (garbage, unknown format) or one that failed is an
                # error.
                AssetCheckSeverity.ERROR if without_runs else AssetCheckSeverity.WARN,
                {
                    **where,
                    "quarantined_rows": MetadataValue.int(quarantined),
                    "files_without_runs": MetadataValue.int(len(without_runs)),
                    "top_reasons": records_table(
                        [{"reason": r, "rows": n} for r, n in reasons.most_common(5)]
                    ),
                    "per_file": file_records([f.entry for f in files[:FILE_TABLE_ROWS]]),
                },
            ),
            Verdict(
                "unique_external_ids",
                duplicates == 0,
                AssetCheckSeverity.ERROR,
                {**where, "duplicate_external_ids": MetadataValue.int(duplicates)},
            ),
            Verdict(
                "records_match_schemas",
                not schema_failures,
                AssetCheckSeverity.ERROR,
                {
                    **where,
                    "failing_records": MetadataValue.int(len(schema_failures)),
                    "runs_checked": MetadataValue.int(sum(c.schema_checked for c in found)),
                    "examples": MetadataValue.md(
                        "\n".join(f"- {f}" for f in schema_failures[:10]) or "none"
                    ),
                },
            ),
        ]


def window_entries(ledger: Ledger, windows: Sequence[str]) -> dict[str, list[FileEntry]]:
    """The ledger's current row of each version that arrived in these windows."""
    if not windows:
        return {}
    marks = ", ".join("?" for _ in windows)
    found: dict[str, list[FileEntry]] = {w: [] for w in windows}
    # Their partitions only: the rest of the ledger's history is not read.
    where = select_filter(windows=windows)
    for entry in ledger.current(f"arrival_window IN ({marks})", list(windows), where):
        found.setdefault(entry.arrival_window, []).append(entry)
    return found


def window_runs(
    kindex: KindexResource, entries: Mapping[str, Sequence[FileEntry]]
) -> dict[str, "pa.Table"]:
    """The rows of the index's `speedups` view (latency) of each window's files' runs (by their
    snapshots), every batch's: the view defines a speedup and its baseline once."""

    con = open_index(kindex.settings)
    try:
        found = {}
        for window, files in entries.items():
            digests = sorted({f.snapshot_digest for f in files if f.snapshot_digest})
            if not digests:
                continue
            marks = ", ".join("?" for _ in digests)
            found[window] = con.execute(
                f"select {', '.join(WINDOW_SPEEDUP_COLUMNS)} from speedups where metric = 'latency'"
                " and run_digest in (select run_digest from runs where snapshot_digest in"
                f" ({marks}))",
                digests,
            ).to_arrow_table()
    finally:
        con.close()
    return found


# Drawing the chart costs more CPU than processing a small file: a window gets it from this many
# speedups (so its latest materialization has it, whatever batch came last); a table below.
CHART_MIN_RUNS = 500
# Bars in a chart: its cost grows with them (a bar a series of a kernel, pass, GPU and provider,
# hundreds in a big window); the chart shows the extremes, the table has every series.
CHART_MAX_BARS = 30
WINDOW_SPEEDUP_COLUMNS = ["mode", "gpu", *SPEEDUP_COLUMNS]
COLUMNS = [
    "kernel",
    "provider",
    "mode",
    "gpu",
    "case_key",
    "metric",
    "median",
    "external_id",
    "manifest",
]


def series_speedups(tables: Sequence["pa.Table"]) -> dict[str, list[float]]:
    """Speedups per kernel, pass, GPU and provider (rows of the `speedups` view): never
    averaged across GPUs or passes. A cohort is of one kernel, pass and GPU already, so naming
    the series by all three splits nothing else."""

    if not tables:
        return {}
    rows = pa.concat_tables([t.select(WINDOW_SPEEDUP_COLUMNS) for t in tables]).to_pylist()
    for row in rows:
        row["kernel"] = f"{row['kernel']} {row['mode']} on {row['gpu']}"
    return speedup_series(rows)


def chart_series(
    by_series: dict[str, list[float]], window: str
) -> tuple[dict[str, list[float]], str]:
    """The series a window's chart shows, and its title: all, or the slowest and the fastest."""
    title = f"Speedups of the files of {window}, per kernel, pass and GPU"
    if len(by_series) <= CHART_MAX_BARS:
        return by_series, title
    ranked = sorted(by_series, key=lambda name: geometric_mean(by_series[name]))
    half = CHART_MAX_BARS // 2
    shown = {name: by_series[name] for name in [*ranked[:half], *ranked[-half:]]}
    return shown, f"{title}: the {half} lowest and highest of {len(by_series)} series"


def speedup_table(by_series: dict[str, list[float]]) -> MetadataValue:
    """Geometric-mean speedups over the cohort's baseline provider, per series, as a table."""
    return records_table(
        [
            {"series": name, "cohorts": len(values), "speedup": round(geometric_mean(values), 3)}
            for name, values in sorted(by_series.items())
        ]
    )


FILE_ASSETS = [records]
