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
-- cohort's baseline is its lowest-ranked provider present.
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
-- baseline). The one definition of a speedup: charts (pipelines/charts.py, the Dagster UI's
-- window report, `kindex chart`) read this view.
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
-- Kernel-level verdicts (docs/regressions.md). regression_settings (one row: min_history,
-- z_threshold, min_effect, min_agreement, noise_floor) is a view pipelines/regressions.py writes
-- from pipelines/curation/regressions.yaml and the KINDEX_REGRESSIONS file before these.
--
-- The points (regression_points): every run a file measured is a point of its case, stored
-- once by the publish that added it (series_points, of the snapshots' current record sets), so
-- every re-measurement counts (the weekly runs of one version, the git history) and the views
-- never read the runs' settled files. Its time is relative to the baseline provider (the lowest
-- rank of baseline_providers) measured in the same file and cohort, so a slower host or torch
-- moves every provider and the baseline alike; a case whose cohort has no baseline in that file
-- is judged on its absolute time. log_time is that ratio's (or time's) logarithm. A point of a
-- kernel-level series (kernel, provider, mode, metric, GPU) is one file's runs of one version
-- (a file that measures a case twice gives it one point, its first run: publish.py); points
-- are ordered along the version axis (pipelines/regressions.py point_axis_sql: versions
-- numerically, else by when each was first measured; within a version by commit time where
-- the file carries one, else observed time; without a version, by arrival), as point_rank.
CREATE OR REPLACE VIEW regression_points AS
WITH stored AS (
    SELECT p.* FROM series_points p
    SEMI JOIN current_record_sets c USING (snapshot_digest, parser_version)
), points AS (
    -- The kernel-level points (few: a file's runs of one version), placed on the axis.
    SELECT kernel, provider, mode, metric, gpu, snapshot_digest, version,
        any_value(version_axis) AS version_axis, any_value(version_key) AS version_key,
        min(point_at) AS point_at
    FROM stored
    GROUP BY kernel, provider, mode, metric, gpu, snapshot_digest, version
), placed AS (
    SELECT *,
        coalesce(version, version_axis) || ' @ ' || strftime(point_at, '%Y-%m-%d %H:%M') AS point,
        dense_rank() OVER (
            PARTITION BY kernel, provider, mode, metric, gpu
            ORDER BY version_key NULLS LAST, version_first_at, point_at, snapshot_digest
        ) AS point_rank
    FROM (
        SELECT *, min(point_at) OVER (PARTITION BY kernel, provider, mode, metric, gpu, version)
            AS version_first_at
        FROM points
    )
)
SELECT
    s.kernel, s.provider, s.mode, s.metric, s.gpu, s.case_key, s.version, p.version_axis,
    p.point, p.point_at, p.point_rank,
    s.observed_at, s.is_baseline, s.baseline_provider, s.median, s.baseline_median,
    s.log_time, s.log_absolute, s.run_digest, s.baseline_run_digest, s.snapshot_digest
FROM stored s
JOIN placed p
  ON p.kernel = s.kernel AND p.provider = s.provider AND p.mode = s.mode
 AND p.metric = s.metric AND p.gpu = s.gpu AND p.snapshot_digest = s.snapshot_digest
 AND p.version IS NOT DISTINCT FROM s.version
;
-- Each case's change from its point before (not every pair of points): per case, compared
-- against the same baseline provider (or both on absolute time). change = the difference of
-- log_time: the log of the ratio of ratios. absolute_change: the same on the run's own time
-- (what drift reads).
CREATE OR REPLACE VIEW regression_cases AS
WITH lagged AS (
    SELECT *,
        lag(point) OVER w AS old_point, lag(version) OVER w AS old_version,
        lag(point_rank) OVER w AS old_point_rank,
        lag(median) OVER w AS old_median, lag(baseline_median) OVER w AS old_baseline_median,
        lag(log_time) OVER w AS old_log_time, lag(log_absolute) OVER w AS old_log_absolute,
        lag(run_digest) OVER w AS old_run_digest,
        lag(baseline_run_digest) OVER w AS old_baseline_run_digest
    FROM regression_points
    WINDOW w AS (
        PARTITION BY kernel, provider, mode, metric, gpu, case_key, is_baseline,
            baseline_provider
        ORDER BY point_rank, run_digest
    )
)
SELECT
    kernel, provider, mode, metric, gpu, case_key,
    old_version, version AS new_version, old_point, point AS new_point,
    old_point_rank, point_rank AS new_point_rank, snapshot_digest AS new_snapshot_digest,
    is_baseline, baseline_provider,
    old_median, median AS new_median,
    old_baseline_median, baseline_median AS new_baseline_median,
    log_time - old_log_time AS change,
    log_absolute - old_log_absolute AS absolute_change,
    round(exp(log_time - old_log_time), 4) AS ratio,
    old_run_digest, run_digest AS new_run_digest,
    old_baseline_run_digest, baseline_run_digest AS new_baseline_run_digest
FROM lagged
WHERE old_log_time IS NOT NULL
;
-- One row per kernel-level series and point with a point before it: the change (the geometric
-- mean over its cases of each case's change from its point before, as a ratio and as its log;
-- own_ratio: the same on the provider's own time), how many cases, the share that moved the way
-- the mean did (the shape sweep agreeing), the series' noise (the robust spread, 1.4826 x the
-- median absolute change, of its other changes: the repeat measurements of its history, floored
-- at noise_floor), the evidence (change / noise) and the verdict. old_version / new_version are
-- the version axis either side (the same version for two runs of one version), old_point /
-- new_point the points (version @ time). A baseline provider is not judged against itself:
-- its changes are drift's, or show as 'baseline changed' on the providers it serves.
CREATE OR REPLACE VIEW version_verdicts AS
WITH pairs AS (
    SELECT kernel, provider, mode, metric, gpu, new_point_rank,
        arg_max(old_version, old_point_rank) AS old_version,
        arg_max(old_point, old_point_rank) AS old_point,
        min(new_version) AS new_version, min(new_point) AS new_point,
        count(*) AS cases, avg(change) AS change, avg(absolute_change) AS own_change,
        avg(CASE WHEN change > 0 THEN 1.0 WHEN change < 0 THEN 0.0 ELSE 0.5 END) AS share_up,
        bool_and(baseline_provider IS NOT NULL) AS relative,
        min(baseline_provider) AS baseline_provider
    FROM regression_cases
    WHERE NOT is_baseline
    GROUP BY kernel, provider, mode, metric, gpu, new_point_rank
), noise AS (
    SELECT p.kernel, p.provider, p.mode, p.metric, p.gpu, p.new_point_rank,
        count(q.change) AS history,
        1.4826 * median(abs(q.change)) AS spread
    FROM pairs p
    LEFT JOIN pairs q
      ON q.kernel = p.kernel AND q.provider = p.provider AND q.mode = p.mode
     AND q.metric = p.metric AND q.gpu = p.gpu AND q.new_point_rank <> p.new_point_rank
    GROUP BY ALL
), judged AS (
    SELECT p.*, n.history, greatest(coalesce(n.spread, 0), s.noise_floor) AS noise,
        CASE WHEN p.change >= 0 THEN p.share_up ELSE 1 - p.share_up END AS agreement,
        s.*,
        -- A noise known from few changes is itself uncertain: the threshold is Student's t
        -- quantile with `history` degrees of freedom at the normal quantile z_threshold
        -- (the Cornish-Fisher expansion, Abramowitz & Stegun 26.7.5): 9.9 spreads at 3
        -- changes, 5.9 at 5, 3.5 at 30, for z_threshold 3.09.
        s.z_threshold
            + (s.z_threshold ** 3 + s.z_threshold) / (4 * n.history)
            + (5 * s.z_threshold ** 5 + 16 * s.z_threshold ** 3 + 3 * s.z_threshold)
                / (96 * n.history ** 2)
            + (3 * s.z_threshold ** 7 + 19 * s.z_threshold ** 5 + 17 * s.z_threshold ** 3
               - 15 * s.z_threshold) / (384 * n.history ** 3)
            + (79 * s.z_threshold ** 9 + 776 * s.z_threshold ** 7 + 1482 * s.z_threshold ** 5
               - 1920 * s.z_threshold ** 3 - 945 * s.z_threshold) / (92160 * n.history ** 4)
            AS threshold
    FROM pairs p
    JOIN noise n USING (kernel, provider, mode, metric, gpu, new_point_rank)
    CROSS JOIN regression_settings s
    WHERE n.history > 0
    UNION ALL BY NAME
    SELECT p.*, n.history, CAST(NULL AS DOUBLE) AS noise,
        CASE WHEN p.change >= 0 THEN p.share_up ELSE 1 - p.share_up END AS agreement,
        s.*, CAST(NULL AS DOUBLE) AS threshold
    FROM pairs p
    JOIN noise n USING (kernel, provider, mode, metric, gpu, new_point_rank)
    CROSS JOIN regression_settings s
    WHERE n.history = 0
)
SELECT
    kernel, provider, mode, metric, gpu, old_version, new_version, old_point, new_point, cases,
    round(exp(change), 4) AS ratio,
    round(change, 4) AS log_change,
    round(exp(own_change), 4) AS own_ratio,
    round(noise, 4) AS noise,
    round(change / noise, 2) AS evidence,
    round(threshold, 2) AS threshold,
    round(agreement, 3) AS agreement,
    history,
    CASE WHEN relative THEN baseline_provider END AS baseline_provider,
    -- The series' newest change (what its newest point just did).
    new_point_rank = max(new_point_rank) OVER (
        PARTITION BY kernel, provider, mode, metric, gpu
    ) AS newest,
    CASE
        WHEN history < min_history THEN 'not enough evidence'
        WHEN abs(change) / noise < threshold OR abs(change) < ln(1 + min_effect)
             OR agreement < min_agreement
            THEN 'no change'
        -- The provider's own time must have moved too: a baseline that alone got faster (a
        -- newer torch) changes the ratio, not the provider.
        WHEN sign(own_change) <> sign(change) OR abs(own_change) < ln(1 + min_effect)
            THEN 'baseline changed'
        WHEN change > 0 THEN 'regression'
        ELSE 'improvement'
    END AS verdict
FROM judged
;
-- Regressions judged real, largest first (improvements: the same the other way).
CREATE OR REPLACE VIEW regressions AS
SELECT * FROM version_verdicts WHERE verdict = 'regression'
;
CREATE OR REPLACE VIEW improvements AS
SELECT * FROM version_verdicts WHERE verdict = 'improvement'
;
-- Drift: a change every provider of a kernel-level cohort (kernel, mode, metric, GPU) shares
-- at one file's point (its runs of one version) from each provider's point before, the baseline
-- included, on the runs' own times (a slower host, a changed torch): each provider's geometric
-- mean moved the same way by at least min_effect. It is never a provider's regression (times
-- relative to the baseline cancel it).
CREATE OR REPLACE VIEW drift AS
WITH per_provider AS (
    SELECT kernel, mode, metric, gpu, new_snapshot_digest, new_version, provider,
        arg_max(old_version, old_point_rank) AS old_version, min(new_point) AS new_point,
        avg(absolute_change) AS change, count(*) AS cases, bool_or(is_baseline) AS is_baseline
    FROM regression_cases
    GROUP BY kernel, mode, metric, gpu, new_snapshot_digest, new_version, provider
)
SELECT
    kernel, mode, metric, gpu, min(old_version) AS old_version, new_version,
    min(new_point) AS new_point,
    count(*) AS providers, sum(cases) AS cases,
    round(exp(avg(change)), 4) AS ratio,
    round(exp(min(change)), 4) AS min_ratio, round(exp(max(change)), 4) AS max_ratio,
    CASE WHEN avg(change) > 0 THEN 'slower' ELSE 'faster' END AS direction
FROM per_provider CROSS JOIN regression_settings s
GROUP BY kernel, mode, metric, gpu, new_snapshot_digest, new_version, s.min_effect
HAVING count(*) >= 2 AND bool_or(is_baseline)
   AND (min(change) >= ln(1 + s.min_effect) OR max(change) <= -ln(1 + s.min_effect))
;
