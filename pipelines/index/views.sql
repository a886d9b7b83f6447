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
-- Kernel-level verdicts (docs/regressions.md). regression_settings (one row: min_history,
-- z_threshold, min_effect, min_agreement, noise_floor) is a view pipelines/regressions.py writes
-- from pipelines/curation/regressions.yaml and the KINDEX_REGRESSION_* overrides before these.
--
-- The version axis (regression_points): a point of a series is a version of it. Liger runs:
-- `liger_version`, numerically (0.5.10 after 0.5.8), each version's newest run of a case (its
-- head, the only rows read: the history of heads stays bounded however many runs supersede
-- each other). Each point's time is relative to the baseline provider (the lowest rank of
-- baseline_providers) measured in the same file (snapshot) and cohort, so a slower host or
-- torch moves every provider and the baseline alike; a case whose cohort has no baseline in
-- that file is judged on its absolute time. log_time is that ratio's (or time's) logarithm.
CREATE OR REPLACE VIEW regression_points AS
WITH heads AS (
    SELECT * EXCLUDE (head_of_version, live) FROM run_segments
    WHERE live = true AND head_of_version = true AND liger_version IS NOT NULL AND median > 0
    QUALIFY row_number() OVER (
        PARTITION BY series_key, liger_version ORDER BY observed_at DESC, run_digest
    ) = 1
), ranked AS (
    SELECT h.*, b.rank AS baseline_rank,
        list_transform(string_split(h.liger_version, '.'), x -> TRY_CAST(x AS INTEGER))
            AS version_order
    FROM heads h LEFT JOIN baseline_providers b USING (provider)
), baselines AS (
    SELECT * FROM ranked WHERE baseline_rank IS NOT NULL
    QUALIFY row_number() OVER (
        PARTITION BY operation_digest, workload_digest, protocol_digest, environment_digest,
            metric, kernel, liger_version, snapshot_digest
        ORDER BY baseline_rank, observed_at DESC, run_digest
    ) = 1
)
SELECT
    r.kernel, r.provider, r.mode, r.metric, r.gpu, r.case_key,
    r.liger_version AS version, r.version_order, r.observed_at,
    r.baseline_rank IS NOT NULL AS is_baseline,
    b.provider AS baseline_provider,
    r.median, b.median AS baseline_median,
    ln(r.median) - coalesce(ln(b.median), 0) AS log_time,
    ln(r.median) AS log_absolute,
    r.run_digest, b.run_digest AS baseline_run_digest, r.snapshot_digest
FROM ranked r
LEFT JOIN baselines b
  ON r.operation_digest = b.operation_digest AND r.workload_digest = b.workload_digest
 AND r.protocol_digest = b.protocol_digest AND r.environment_digest = b.environment_digest
 AND r.metric = b.metric AND r.kernel = b.kernel AND r.liger_version = b.liger_version
 AND r.snapshot_digest = b.snapshot_digest
;
-- Each case's change between adjacent versions of its kernel-level series (kernel, provider,
-- mode, metric, GPU): the series' versions in order, each with the one before it (not every
-- pair of versions). A case counts when both versions measured it against the same baseline
-- provider (or both on absolute time). change = the difference of log_time: the log of the
-- ratio of ratios. absolute_change: the same on the run's own time (what drift reads).
CREATE OR REPLACE VIEW regression_cases AS
WITH versions AS (
    SELECT kernel, provider, mode, metric, gpu, version, version_order,
        lag(version) OVER w AS old_version
    FROM (SELECT DISTINCT kernel, provider, mode, metric, gpu, version, version_order
          FROM regression_points)
    WINDOW w AS (PARTITION BY kernel, provider, mode, metric, gpu ORDER BY version_order, version)
)
SELECT
    v.kernel, v.provider, v.mode, v.metric, v.gpu, n.case_key,
    v.old_version, v.version AS new_version, v.version_order AS new_version_order,
    n.is_baseline, n.baseline_provider,
    o.median AS old_median, n.median AS new_median,
    o.baseline_median AS old_baseline_median, n.baseline_median AS new_baseline_median,
    n.log_time - o.log_time AS change,
    n.log_absolute - o.log_absolute AS absolute_change,
    round(exp(n.log_time - o.log_time), 4) AS ratio,
    o.run_digest AS old_run_digest, n.run_digest AS new_run_digest,
    o.baseline_run_digest AS old_baseline_run_digest,
    n.baseline_run_digest AS new_baseline_run_digest
FROM versions v
JOIN regression_points n
  ON n.kernel = v.kernel AND n.provider = v.provider AND n.mode = v.mode
 AND n.metric = v.metric AND n.gpu = v.gpu AND n.version = v.version
JOIN regression_points o
  ON o.kernel = v.kernel AND o.provider = v.provider AND o.mode = v.mode
 AND o.metric = v.metric AND o.gpu = v.gpu AND o.version = v.old_version
 AND o.case_key = n.case_key
 AND o.baseline_provider IS NOT DISTINCT FROM n.baseline_provider
;
-- One row per kernel-level series and adjacent pair of versions: the change (the geometric
-- mean over the cases both measured, as a ratio and as its log; own_ratio: the same on the
-- provider's own time), how many cases, the share that moved the way the mean did (the shape
-- sweep agreeing), the series' noise (the robust spread, 1.4826 x the median absolute change,
-- of its other adjacent changes: repeat measurements of its history, floored at noise_floor),
-- the evidence (change / noise) and the verdict. A baseline provider is not judged against
-- itself: its changes are drift's, or show as 'baseline changed' on the providers it serves.
CREATE OR REPLACE VIEW version_verdicts AS
WITH pairs AS (
    SELECT kernel, provider, mode, metric, gpu, old_version, new_version, new_version_order,
        count(*) AS cases, avg(change) AS change, avg(absolute_change) AS own_change,
        avg(CASE WHEN change > 0 THEN 1.0 WHEN change < 0 THEN 0.0 ELSE 0.5 END) AS share_up,
        bool_and(baseline_provider IS NOT NULL) AS relative,
        min(baseline_provider) AS baseline_provider
    FROM regression_cases
    WHERE NOT is_baseline
    GROUP BY ALL
), noise AS (
    SELECT p.kernel, p.provider, p.mode, p.metric, p.gpu, p.new_version,
        count(q.change) AS history,
        1.4826 * median(abs(q.change)) AS spread
    FROM pairs p
    LEFT JOIN pairs q
      ON q.kernel = p.kernel AND q.provider = p.provider AND q.mode = p.mode
     AND q.metric = p.metric AND q.gpu = p.gpu AND q.new_version <> p.new_version
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
    JOIN noise n USING (kernel, provider, mode, metric, gpu, new_version)
    CROSS JOIN regression_settings s
    WHERE n.history > 0
    UNION ALL BY NAME
    SELECT p.*, n.history, CAST(NULL AS DOUBLE) AS noise,
        CASE WHEN p.change >= 0 THEN p.share_up ELSE 1 - p.share_up END AS agreement,
        s.*, CAST(NULL AS DOUBLE) AS threshold
    FROM pairs p
    JOIN noise n USING (kernel, provider, mode, metric, gpu, new_version)
    CROSS JOIN regression_settings s
    WHERE n.history = 0
)
SELECT
    kernel, provider, mode, metric, gpu, old_version, new_version, cases,
    round(exp(change), 4) AS ratio,
    round(change, 4) AS log_change,
    round(exp(own_change), 4) AS own_ratio,
    round(noise, 4) AS noise,
    round(change / noise, 2) AS evidence,
    round(threshold, 2) AS threshold,
    round(agreement, 3) AS agreement,
    history,
    CASE WHEN relative THEN baseline_provider END AS baseline_provider,
    -- The series' newest change (what a new version just did).
    new_version_order = max(new_version_order) OVER (
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
-- between adjacent versions, the baseline included, on the runs' own times (a slower host, a
-- changed torch): each provider's geometric mean moved the same way by at least min_effect.
-- It is never a provider's regression (times relative to the baseline cancel it).
CREATE OR REPLACE VIEW drift AS
WITH per_provider AS (
    SELECT kernel, mode, metric, gpu, old_version, new_version, provider,
        avg(absolute_change) AS change, count(*) AS cases, bool_or(is_baseline) AS is_baseline
    FROM regression_cases
    GROUP BY ALL
)
SELECT
    kernel, mode, metric, gpu, old_version, new_version,
    count(*) AS providers, sum(cases) AS cases,
    round(exp(avg(change)), 4) AS ratio,
    round(exp(min(change)), 4) AS min_ratio, round(exp(max(change)), 4) AS max_ratio,
    CASE WHEN avg(change) > 0 THEN 'slower' ELSE 'faster' END AS direction
FROM per_provider CROSS JOIN regression_settings s
GROUP BY kernel, mode, metric, gpu, old_version, new_version, s.min_effect
HAVING count(*) >= 2 AND bool_or(is_baseline)
   AND (min(change) >= ln(1 + s.min_effect) OR max(change) <= -ln(1 + s.min_effect))
;
