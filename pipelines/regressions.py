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


TOP_MOVERS_SQL = """
SELECT kernel, provider, mode, metric, gpu, old_version, new_version, cases, ratio, noise,
       evidence, agreement, baseline_provider
FROM regressions
WHERE newest
ORDER BY log_change DESC, evidence DESC, kernel, provider, mode, gpu
LIMIT $limit
"""


def top_movers(connection: duckdb.DuckDBPyConnection, limit: int = 10) -> pa.Table:
    """The largest regressions judged real (the `regressions` view) that are their series'
    newest change (what the latest version did), largest first, as a pyarrow Table."""
    return connection.execute(TOP_MOVERS_SQL, {"limit": limit}).to_arrow_table()


# Each version's geometric mean over the cases it measured (the verdicts compare the cases
# both versions measured), relative to the baseline where the series has one: cases without a
# baseline in their file (absolute times) are left out of such a series.
HISTORY_SQL = """
WITH points AS (
    SELECT * FROM regression_points
    WHERE kernel = $kernel AND provider = $provider AND mode = $mode AND metric = $metric
      AND gpu = $gpu AND NOT is_baseline
)
SELECT version, version_order, count(*) AS cases, exp(avg(log_time)) AS relative,
       any_value(baseline_provider) AS baseline_provider
FROM points
WHERE (baseline_provider IS NOT NULL)
    = (SELECT bool_or(baseline_provider IS NOT NULL) FROM points)
GROUP BY version, version_order
ORDER BY version_order, version
"""
VERDICTS_SQL = """
SELECT old_version, new_version, ratio, noise, evidence, verdict FROM version_verdicts
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
    """A series' points (version, geometric-mean time relative to its baseline, cases) and the
    verdict on each adjacent change."""

    series: Series
    points: list[tuple[str, float, int]]
    # new version -> (verdict, ratio, noise, evidence)
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
