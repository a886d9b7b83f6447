-- Derived views over the base tables (runs, manifests, snapshots, lineage, quarantine, ...).
-- Statements are separated by lines holding only ';'.

-- Comparable cohorts: same operation, workload, protocol and environment (and metric: latency
-- and memory runs of one case are never compared with each other).
CREATE OR REPLACE VIEW cohorts AS
SELECT
    md5(concat_ws('|', operation_digest, workload_digest, protocol_digest, environment_digest, metric))
        AS cohort_id,
    operation_digest, workload_digest, protocol_digest, environment_digest, metric,
    -- A cohort's runs may name several kernels (benchmarks that share one OperationSpec): min()
    -- names one whatever order the files are scanned in.
    min(kernel) AS kernel, min(mode) AS mode, min(gpu) AS gpu, min(case_key) AS case_key,
    count(*) AS runs,
    count(*) FILTER (WHERE superseded_by IS NULL) AS latest_runs,
    list_sort(list_distinct(list(provider))) AS providers
FROM runs
GROUP BY operation_digest, workload_digest, protocol_digest, environment_digest, metric
;
-- Latest runs: not superseded by a re-measurement of the same case (retracted runs stay, flagged).
-- Every latest run is live (tables.RUN_SEGMENT_SCHEMA): the settled files are skipped unread, by
-- their bounds of `live` (and, through iceberg_scan, by its partition: a comparison, not a bare
-- boolean column, is what DuckDB hands to the scan). (`OR NOT live` is a no-op that keeps DuckDB
-- from pushing an IS NULL filter into the scan, which would read every row group's superseded_by
-- instead.)
CREATE OR REPLACE VIEW latest_runs AS
SELECT * EXCLUDE (head_of_version, live) FROM run_segments
WHERE live = true AND (superseded_by IS NULL OR NOT live)
;
-- baseline_providers (provider, rank): the curation's baseline ranks (providers.yaml), a view
-- pipelines/index/tables.py writes from `curation.load().baseline_ranks()` before these; a
-- cohort's baseline is its lowest-ranked provider present, as in pipelines/charts.py.
-- Speedups compare within one benchmark (kernel) too: KernelIndex's importer gives some
-- benchmarks one OperationSpec (GRPO with token- and sequence-level importance sampling).
CREATE OR REPLACE VIEW cohort_baselines AS
SELECT l.*, b.rank AS baseline_rank
FROM latest_runs l JOIN baseline_providers b USING (provider)
QUALIFY row_number() OVER (
    PARTITION BY operation_digest, workload_digest, protocol_digest, environment_digest, metric,
        kernel
    ORDER BY b.rank, observed_at DESC, run_digest DESC
) = 1
;
-- Speedup of each provider's newest latest run of a cohort against the cohort's baseline
-- provider's: baseline median / run median (> 1 means faster, or smaller for memory, than the
-- baseline). pipelines/charts.py's speedups takes the same runs.
CREATE OR REPLACE VIEW speedups AS
WITH newest AS (
    SELECT * FROM latest_runs
    QUALIFY row_number() OVER (
        PARTITION BY operation_digest, workload_digest, protocol_digest, environment_digest,
            metric, kernel, provider
        ORDER BY observed_at DESC, run_digest DESC
    ) = 1
)
SELECT
    r.kernel, r.mode, r.metric, r.gpu, r.architecture, r.case_key, r.dtype,
    r.provider, b.provider AS baseline_provider,
    r.median, b.median AS baseline_median,
    round(b.median / r.median, 4) AS speedup,
    r.liger_version, b.liger_version AS baseline_liger_version,
    r.run_digest, b.run_digest AS baseline_run_digest,
    r.operation_digest, r.workload_digest, r.protocol_digest, r.environment_digest
FROM newest r
JOIN cohort_baselines b
  ON r.operation_digest = b.operation_digest AND r.workload_digest = b.workload_digest
 AND r.protocol_digest = b.protocol_digest AND r.environment_digest = b.environment_digest
 AND r.metric = b.metric AND r.kernel = b.kernel
WHERE r.provider <> b.provider AND r.median > 0
;
-- Every pair of Liger versions that measured the same series (kernel, provider, mode, metric,
-- GPU, case), using each version's newest run. A regression needs the spread to separate: the
-- newer p20 above the older p80. Versions sort numerically (0.5.10 after 0.5.8).
CREATE OR REPLACE VIEW version_changes AS
-- Each version's newest run of a series is stored as its head (head_of_version): only those are
-- read (the row_number below keeps one of each, as it would of every run). Every head is live,
-- so the settled files are skipped as for latest_runs.
WITH per_version AS (
    SELECT * EXCLUDE (head_of_version, live) FROM run_segments
    WHERE live = true AND head_of_version = true AND liger_version IS NOT NULL
    QUALIFY row_number() OVER (
        PARTITION BY series_key, liger_version ORDER BY observed_at DESC, run_digest
    ) = 1
), ordered AS (
    SELECT *, list_transform(string_split(liger_version, '.'), x -> TRY_CAST(x AS INTEGER))
        AS version_order
    FROM per_version
)
SELECT
    n.kernel, n.provider, n.mode, n.metric, n.gpu, n.case_key,
    o.liger_version AS old_version, n.liger_version AS new_version,
    o.median AS old_median, n.median AS new_median,
    round(n.median / o.median, 4) AS ratio,
    o.p20 AS old_p20, o.p80 AS old_p80, n.p20 AS new_p20, n.p80 AS new_p80,
    n.p20 > o.p80 AS regressed,
    n.p80 < o.p20 AS improved,
    o.run_digest AS old_run_digest, n.run_digest AS new_run_digest
FROM ordered o JOIN ordered n
  ON o.series_key = n.series_key AND o.version_order < n.version_order
;
CREATE OR REPLACE VIEW regressions AS
SELECT * FROM version_changes WHERE regressed
;
