"""Regressions judged per kernel: the settings the views read, and the top movers.

The verdicts themselves are SQL views (pipelines/index/views.sql: regression_points,
regression_cases, version_verdicts, regressions, improvements, drift), so every reader of the
index (`kindex query`, a bare DuckDB over `kindex connect`) gets the same answer. This module
states the settings they read (pipelines/curation/regressions.yaml, or the file
KINDEX_REGRESSIONS names) as the `regression_settings` view, and reads the views back for the
chart and the Dagster UI's table of top movers. docs/regressions.md gives the method.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from ruamel.yaml import YAML

SETTINGS_VARIABLE = "KINDEX_REGRESSIONS"


class RegressionSettingsError(ValueError):
    """A regression settings file holds a key or value kindex cannot use."""


@dataclass(frozen=True, slots=True)
class RegressionSettings:
    min_history: int
    z_threshold: float
    min_effect: float
    min_agreement: float
    noise_floor: float


def _read_yaml(text: str, where: str) -> dict[str, Any]:
    data = YAML(typ="safe").load(text) or {}
    if not isinstance(data, dict):
        raise RegressionSettingsError(f"{where}: expected a mapping of settings")
    return data


def load_settings(environ: dict[str, str] | None = None) -> RegressionSettings:
    """The defaults of pipelines/curation/regressions.yaml, with the keys of the file
    KINDEX_REGRESSIONS names (if set) in their place."""
    env = os.environ if environ is None else environ
    default = resources.files("pipelines.curation").joinpath("regressions.yaml")
    values = _read_yaml(default.read_text(encoding="utf-8"), "regressions.yaml")
    override = env.get(SETTINGS_VARIABLE)
    if override:
        path = Path(override)
        values |= _read_yaml(path.read_text(encoding="utf-8"), str(path))
    known = {f.name: f for f in fields(RegressionSettings)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise RegressionSettingsError(
            f"unknown regression settings {unknown}; known: {sorted(known)}"
        )
    parsed: dict[str, Any] = {}
    for name, field in known.items():
        value = values.get(name)
        kind = int if field.type in ("int", int) else float
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise RegressionSettingsError(f"{name}: expected a number >= 0, got {value!r}")
        parsed[name] = kind(value)
    return RegressionSettings(**parsed)


def settings_statement(settings: RegressionSettings | None = None) -> str:
    """The regression_settings view (one row) the verdict views read."""
    s = load_settings() if settings is None else settings
    return (
        "CREATE OR REPLACE VIEW regression_settings AS SELECT "
        f"CAST({s.min_history} AS INTEGER) AS min_history, "
        f"CAST({s.z_threshold!r} AS DOUBLE) AS z_threshold, "
        f"CAST({s.min_effect!r} AS DOUBLE) AS min_effect, "
        f"CAST({s.min_agreement!r} AS DOUBLE) AS min_agreement, "
        f"CAST({s.noise_floor!r} AS DOUBLE) AS noise_floor"
    )


# The version axis of every source, stated once: what orders the points of a series (one run of
# a case is one point). A point's version is the first of these its run carries: Liger's
# `liger_version` (its CSVs, and bundles labelled with it), a bundle's or harness file's
# implementation version (its project revision), the framework version a harness reports; a
# run with none is on the arrival axis. Versions sort numerically where they start with a
# number (0.5.10 after 0.5.8), else by when each was first measured. Within a version, points
# sort by time: the commit time of the file's first read where it was uploaded from git
# (`kindex put --git`), else the run's observed time; on the arrival axis, the commit time or
# else the file's first read (when it arrived). publish.py stores each run's point with these
# (the `series_points` table); the views order by them.
VERSION_COLUMNS = ("liger_version", "implementation_version", "framework_version")
ARRIVAL_AXIS = "arrival"
# Each numeric part padded to this many digits, so that versions sort as text.
VERSION_DIGITS = 12
_VERSION_NUMBER = r"^v?([0-9]+(\.[0-9]+)*)"


# The time a point stands for: a run's median where it has one (Liger's CSVs, bundles,
# nvbench), else its mean (KernelBench and FlashInfer-Trace report means).
POINT_TIME_SQL = "coalesce({run}.median, {run}.mean)"


def point_axis_sql(run: str, read: str) -> dict[str, str]:
    """The SQL expressions of a point's version axis (`version`, `version_axis`,
    `version_key`, `point_at`), over a run's columns (alias `run`) and its snapshot's first
    read (alias `read`: `committed_at`, `taken_at`)."""
    version = f"coalesce({', '.join(f'{run}.{c}' for c in VERSION_COLUMNS)})"
    axis = " ".join(f"WHEN {run}.{c} IS NOT NULL THEN '{c}'" for c in VERSION_COLUMNS)
    number = f"regexp_extract({version}, '{_VERSION_NUMBER}', 1)"
    key = (
        f"CASE WHEN {number} <> '' THEN array_to_string(list_transform("
        f"string_split({number}, '.'), "
        f"x -> lpad(x, greatest({VERSION_DIGITS}, length(x))::INTEGER, '0')"
        f"), '.') || regexp_replace({version}, '{_VERSION_NUMBER}', '') END"
    )
    return {
        "version": version,
        "version_axis": f"CASE {axis} ELSE '{ARRIVAL_AXIS}' END",
        "version_key": key,
        "point_at": (
            f"CASE WHEN {version} IS NULL THEN coalesce({read}.committed_at, {read}.taken_at) "
            f"ELSE coalesce({read}.committed_at, {run}.observed_at, {read}.taken_at) END"
        ),
    }


TOP_MOVERS_SQL = """
SELECT kernel, provider, mode, metric, gpu, old_version, new_version, old_point, new_point, cases,
       ratio, noise, evidence, agreement, baseline_provider
FROM regressions
WHERE newest
ORDER BY log_change DESC, evidence DESC, kernel, provider, mode, gpu
LIMIT $limit
"""


def top_movers(connection: duckdb.DuckDBPyConnection, limit: int = 10) -> pa.Table:
    """The largest regressions judged real (the `regressions` view) that are their series'
    newest change (what the latest version did), largest first, as a pyarrow Table."""
    return connection.execute(TOP_MOVERS_SQL, {"limit": limit}).to_arrow_table()


# Each point's geometric mean over the cases it measured (the verdicts compare each case with
# its point before), relative to the baseline where the series has one: cases without a
# baseline in their file (absolute times) are left out of such a series.
HISTORY_SQL = """
WITH points AS (
    SELECT * FROM regression_points
    WHERE kernel = $kernel AND provider = $provider AND mode = $mode AND metric = $metric
      AND gpu = $gpu AND NOT is_baseline
)
SELECT point, point_rank, count(*) AS cases, exp(avg(log_time)) AS relative,
       any_value(baseline_provider) AS baseline_provider
FROM points
WHERE (baseline_provider IS NOT NULL)
    = (SELECT bool_or(baseline_provider IS NOT NULL) FROM points)
GROUP BY point, point_rank
ORDER BY point_rank, point
"""
VERDICTS_SQL = """
SELECT old_point, new_point, ratio, noise, evidence, verdict FROM version_verdicts
WHERE kernel = $kernel AND provider = $provider AND mode = $mode AND metric = $metric
  AND gpu = $gpu
"""
# The series the chart draws when none is named: the top mover (the largest regression that
# is its series' newest change), else the largest regression, else the longest history.
DEFAULT_SERIES_SQL = """
SELECT kernel, provider, mode, metric, gpu FROM version_verdicts
WHERE ($kernel IS NULL OR kernel = $kernel) AND ($provider IS NULL OR provider = $provider)
  AND ($mode IS NULL OR mode = $mode) AND ($gpu IS NULL OR gpu = $gpu) AND metric = $metric
ORDER BY verdict = 'regression' AND newest DESC, verdict = 'regression' DESC, log_change DESC,
    history DESC, kernel, provider, mode, gpu
LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class Series:
    kernel: str
    provider: str
    mode: str
    metric: str
    gpu: str

    def title(self) -> str:
        return f"{self.kernel} {self.mode} · {self.provider} · {self.gpu} ({self.metric})"


@dataclass(frozen=True, slots=True)
class SeriesHistory:
    """A series' points (point label, geometric-mean time relative to its baseline, cases) and
    the verdict on each change from the point before."""

    series: Series
    points: list[tuple[str, float, int]]
    # new point -> (verdict, ratio, noise, evidence)
    verdicts: dict[str, tuple[str, float, float, float]]
    baseline_provider: str | None


def pick_series(
    connection: duckdb.DuckDBPyConnection,
    kernel: str | None = None,
    provider: str | None = None,
    mode: str | None = None,
    gpu: str | None = None,
    metric: str = "latency",
) -> Series | None:
    row = connection.execute(
        DEFAULT_SERIES_SQL,
        {"kernel": kernel, "provider": provider, "mode": mode, "gpu": gpu, "metric": metric},
    ).fetchone()
    return Series(*row) if row else None


def series_history(connection: duckdb.DuckDBPyConnection, series: Series) -> SeriesHistory:
    params = {
        "kernel": series.kernel,
        "provider": series.provider,
        "mode": series.mode,
        "metric": series.metric,
        "gpu": series.gpu,
    }
    points = connection.execute(HISTORY_SQL, params).fetchall()
    # A change without history has no noise or evidence (0 and NaN here).
    verdicts = {
        new: (
            verdict,
            float(ratio),
            0.0 if noise is None else float(noise),
            math.nan if z is None else float(z),
        )
        for _old, new, ratio, noise, z, verdict in connection.execute(
            VERDICTS_SQL, params
        ).fetchall()
    }
    baseline = next((p[4] for p in points if p[4]), None)
    return SeriesHistory(
        series, [(p[0], float(p[3]), int(p[2])) for p in points], verdicts, baseline
    )
