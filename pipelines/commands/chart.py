"""`kindex chart KIND -o FILE.png`: a chart of the index, drawn from the views people query.

- `speedups`: the Dagster UI's chart (pipelines.charts.speedup_chart_png), from `speedups`;
- `versions --kernel K`: one kernel across Liger versions (median latency per version, from
  `version_changes`, which keeps each version's newest run of a series);
- `gpus --kernel K`: one kernel across GPUs (geometric-mean speedup per GPU and pass, from
  `speedups`);
- `regressions [--kernel K]`: one kernel-level series (kernel, provider, pass, GPU) across its
  versions, its time relative to its baseline, the noise band and the changes judged (from
  `regression_points` and `version_verdicts`); without a kernel, the top mover.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb

from pipelines import charts, regressions
from pipelines.index.local import open_locked
from pipelines.settings import Settings

DEFAULT_SERIES = 10

SPEEDUP_RUNS_SQL = f"""
SELECT {", ".join(charts.SPEEDUP_COLUMNS)} FROM speedups
WHERE metric = 'latency' AND ($kernel IS NULL OR kernel = $kernel)
  AND ($gpu IS NULL OR gpu = $gpu) AND ($mode IS NULL OR mode = $mode)
"""
# Each version's median of a series: both ends of every pair of versions that measured it.
VERSION_POINTS_SQL = """
SELECT DISTINCT concat_ws(' / ', case_key, gpu, mode) AS series, version, median FROM (
    SELECT case_key, gpu, mode, old_version AS version, old_median AS median
    FROM version_changes
    WHERE kernel = $kernel AND provider = $provider AND metric = 'latency'
      AND ($gpu IS NULL OR gpu = $gpu) AND ($mode IS NULL OR mode = $mode)
    UNION ALL
    SELECT case_key, gpu, mode, new_version, new_median
    FROM version_changes
    WHERE kernel = $kernel AND provider = $provider AND metric = 'latency'
      AND ($gpu IS NULL OR gpu = $gpu) AND ($mode IS NULL OR mode = $mode)
)
"""
GPU_SPEEDUPS_SQL = """
SELECT gpu, mode, speedup FROM speedups
WHERE kernel = $kernel AND provider = $provider AND metric = 'latency'
  AND ($mode IS NULL OR mode = $mode)
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "chart",
        help="draw a chart of the index to a PNG (speedups, versions, gpus, regressions)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = parser.add_subparsers(dest="chart", required=True, metavar="KIND")

    def kind(name: str, help_text: str, kernel_required: bool) -> argparse.ArgumentParser:
        sub = kinds.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "-o", "--output", type=Path, required=True, metavar="FILE.png", help="the PNG"
        )
        sub.add_argument("--kernel", required=kernel_required, help="e.g. layer_norm")
        sub.add_argument("--mode", help="one pass: forward, backward or full")
        sub.set_defaults(func=run)
        return sub

    speedups = kind("speedups", "speedups over the baseline per kernel and provider", False)
    speedups.add_argument("--gpu", help="one GPU as the index names it ('NVIDIA H100 80GB HBM3')")
    versions = kind("versions", "one kernel's median latency across Liger versions", True)
    versions.add_argument("--provider", default="liger")
    versions.add_argument("--gpu")
    versions.add_argument(
        "--series",
        type=int,
        default=DEFAULT_SERIES,
        help=f"at most this many series, those most versions measured ({DEFAULT_SERIES})",
    )
    kind("gpus", "one kernel's speedup over the baseline on each GPU", True).add_argument(
        "--provider", default="liger"
    )
    regressions = kind(
        "regressions", "one kernel's time relative to its baseline across versions", False
    )
    regressions.add_argument("--provider", help="default: the series judged most regressed")
    regressions.add_argument("--gpu")
    regressions.add_argument("--metric", default="latency", choices=("latency", "memory"))


def rows(con: duckdb.DuckDBPyConnection, sql: str, **params: Any) -> list[dict[str, Any]]:
    relation = con.execute(sql, {k: v for k, v in params.items() if f"${k}" in sql})
    columns = [d[0] for d in relation.description]
    return [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]


def most_measured(points: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    versions: dict[str, int] = defaultdict(int)
    for p in points:
        versions[p["series"]] += 1
    kept = set(sorted(versions, key=lambda s: (-versions[s], s))[:limit])
    return [p for p in points if p["series"] in kept]


def draw(con: duckdb.DuckDBPyConnection, args: argparse.Namespace) -> tuple[bytes | None, str]:
    """The PNG (None when the index holds nothing to draw) and what it shows."""

    scope = ", ".join(v for v in (args.kernel, getattr(args, "gpu", None), args.mode) if v)
    if args.chart == "speedups":
        runs = rows(con, SPEEDUP_RUNS_SQL, kernel=args.kernel, gpu=args.gpu, mode=args.mode)
        title = "Speedups over the baseline" + (f" ({scope})" if scope else "")
        return charts.speedup_chart_png(runs, title=title), title
    if args.chart == "regressions":
        return regressions_chart(con, args)
    params = {"kernel": args.kernel, "provider": args.provider, "mode": args.mode}
    if args.chart == "versions":
        points = rows(con, VERSION_POINTS_SQL, gpu=args.gpu, **params)
        title = f"{scope} ({args.provider}) across Liger versions"
        return charts.versions_chart_png(most_measured(points, args.series), title), title
    speedups = rows(con, GPU_SPEEDUPS_SQL, **params)
    title = f"{scope} ({args.provider}) across GPUs"
    return charts.gpus_chart_png(speedups, title), title


def regressions_chart(
    con: duckdb.DuckDBPyConnection, args: argparse.Namespace
) -> tuple[bytes | None, str]:
    series = regressions.pick_series(
        con,
        kernel=args.kernel,
        provider=args.provider,
        mode=args.mode,
        gpu=args.gpu,
        metric=args.metric,
    )
    if series is None:
        scope = ", ".join(v for v in (args.kernel, args.provider, args.mode, args.gpu) if v)
        return None, f"regressions ({scope or 'any series'})"
    history = regressions.series_history(con, series)
    title = series.title()
    png = charts.regressions_chart_png(
        history.points, history.verdicts, title, history.baseline_provider
    )
    return png, title


def run(args: argparse.Namespace) -> int:
    if args.output.suffix.lower() != ".png":
        print(f"kindex chart: --output {args.output}: a .png file", file=sys.stderr)
        return 2
    con = open_locked(Settings.from_env())
    try:
        png, title = draw(con, args)
    except duckdb.Error as error:
        print(f"kindex chart: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    finally:
        con.close()
    if png is None:
        print(f"kindex chart: nothing to draw for {title!r} in the index", file=sys.stderr)
        return 1
    args.output.write_bytes(png)
    print(f"{args.output}: {title}", file=sys.stderr)
    return 0
