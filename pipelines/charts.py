"""Charts of run rows as PNG bytes, for the Dagster UI and `kindex chart`.

matplotlib's object API only (`Figure`, never pyplot): pyplot's global state is not
thread-safe, and a run draws charts for several files at once. Text is never read as mathtext
(kernel and provider names hold `$` and `_`), and tick labels are plain numbers.
matplotlib is imported when a chart is drawn: the processes that import this module (a
Dagster run starting) do not wait for it.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend


# The columns of the `speedups` view (pipelines/index/views.sql, where a speedup, its cohort and
# its baseline are defined once) a speedup chart reads.
SPEEDUP_COLUMNS = ("kernel", "provider", "baseline_provider", "speedup")


def speedup_series(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Rows of the `speedups` view as the chart's series: per kernel and provider, its speedups
    over the baseline provider of each cohort, labelled `kernel: provider vs baseline`."""
    result: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        label = f"{r['kernel']}: {r['provider']} vs {r['baseline_provider']}"
        result[label].append(float(r["speedup"]))
    return dict(result)


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _plain_number(value: float, _position: int) -> str:
    return f"{value:g}"


def speedup_chart_png(rows: Iterable[Mapping[str, Any]], title: str) -> bytes | None:
    """A horizontal bar chart of geometric-mean speedups per kernel and provider, from rows of
    the `speedups` view, or None when there are none."""
    return speedup_bars_png(speedup_series(rows), title)


def speedup_bars_png(by_series: Mapping[str, Sequence[float]], title: str) -> bytes | None:
    """The speedup chart of series already made (`speedup_series`' result)."""
    if not by_series:
        return None
    labels = sorted(by_series, key=lambda s: geometric_mean(by_series[s]))
    values = [geometric_mean(by_series[s]) for s in labels]
    height = 1.2 + 0.28 * len(labels)
    from matplotlib.figure import Figure  # noqa: PLC0415  loaded when a chart is drawn
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415  loaded when a chart is drawn

    figure = Figure(figsize=(8, min(height, 30)), dpi=80)
    axes = figure.subplots()
    colors = ["#2a9d8f" if v >= 1 else "#e76f51" for v in values]
    axes.barh(range(len(labels)), values, color=colors)
    axes.set_yticks(range(len(labels)), labels, fontsize=7, parse_math=False)
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(_plain_number))
    axes.xaxis.set_minor_formatter(FuncFormatter(lambda _v, _p: ""))
    axes.set_xlabel(
        "speedup over baseline (geometric mean over cases, log scale)", parse_math=False
    )
    axes.set_title(title, fontsize=10, parse_math=False)
    figure.tight_layout()
    return _png(figure)


def version_order(version: str) -> tuple[int | str, ...]:
    """Liger versions sort numerically (0.5.10 after 0.5.8)."""
    return tuple(int(p) if p.isdigit() else p for p in version.split("."))


def versions_chart_png(points: Iterable[Mapping[str, Any]], title: str) -> bytes | None:
    """One line per series (`series`: a case, GPU and pass) of its median (`median`, ns) at
    each Liger version (`version`) that measured it; None when no series has two versions."""
    by_series: dict[str, dict[str, float]] = defaultdict(dict)
    for p in points:
        if p["median"] and p["median"] > 0:
            by_series[p["series"]][p["version"]] = p["median"] / 1e6
    by_series = {s: v for s, v in by_series.items() if len(v) >= 2}
    if not by_series:
        return None
    versions = sorted({v for values in by_series.values() for v in values}, key=version_order)
    from matplotlib.figure import Figure  # noqa: PLC0415  loaded when a chart is drawn
    from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: PLC0415  as above

    figure = Figure(figsize=(9, 5), dpi=80)
    axes = figure.subplots()
    for series in sorted(by_series):
        values = by_series[series]
        xs = [i for i, v in enumerate(versions) if v in values]
        axes.plot(xs, [values[versions[i]] for i in xs], marker="o", label=series)
    axes.set_xticks(range(len(versions)), versions, parse_math=False)
    axes.set_yscale("log")
    axes.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axes.yaxis.set_major_formatter(FuncFormatter(_plain_number))
    axes.yaxis.set_minor_formatter(FuncFormatter(lambda _v, _p: ""))
    axes.set_xlabel("Liger version", parse_math=False)
    axes.set_ylabel("median latency (ms, log scale)", parse_math=False)
    axes.set_title(title, fontsize=10, parse_math=False)
    _plain_legend(axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1)))
    figure.tight_layout()
    return _png(figure)


def gpus_chart_png(speedup_rows: Iterable[Mapping[str, Any]], title: str) -> bytes | None:
    """Grouped bars: per GPU (`gpu`) and pass (`mode`), the geometric mean of the `speedup`s
    over cases; None when there are none."""
    by_bar: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in speedup_rows:
        if r["speedup"] and r["speedup"] > 0:
            by_bar[(r["gpu"], r["mode"])].append(float(r["speedup"]))
    if not by_bar:
        return None
    gpus = sorted({gpu for gpu, _ in by_bar})
    modes = sorted({mode for _, mode in by_bar})
    width = 0.8 / len(modes)
    from matplotlib.figure import Figure  # noqa: PLC0415  loaded when a chart is drawn

    figure = Figure(figsize=(max(6, 1.6 * len(gpus) + 2), 4.5), dpi=80)
    axes = figure.subplots()
    for m, mode in enumerate(modes):
        xs = [g + (m - (len(modes) - 1) / 2) * width for g in range(len(gpus))]
        heights = [
            geometric_mean(by_bar[(gpu, mode)]) if (gpu, mode) in by_bar else 0.0 for gpu in gpus
        ]
        axes.bar(xs, heights, width=width * 0.95, label=mode)
    axes.set_xticks(range(len(gpus)), gpus, fontsize=7, rotation=15, parse_math=False)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_ylabel("speedup over baseline (geometric mean over cases)", parse_math=False)
    axes.set_title(title, fontsize=10, parse_math=False)
    _plain_legend(axes.legend(fontsize=7))
    figure.tight_layout()
    return _png(figure)


def regressions_chart_png(
    points: Sequence[tuple[str, float, int]],
    verdicts: Mapping[str, tuple[str, float, float, float]],
    title: str,
    relative_to: str | None,
) -> bytes | None:
    """One kernel-level series across its versions: `points` (version, geometric mean of the
    time relative to the baseline, cases) in order, a band of the noise its verdicts measured
    around it, and each adjacent change marked by its verdict (`verdicts`: new version ->
    (verdict, ratio, noise, evidence), as the `version_verdicts` view gives them). None when
    there are fewer than two points."""
    if len(points) < 2:
        return None
    from matplotlib.figure import Figure  # noqa: PLC0415  loaded when a chart is drawn

    versions = [p[0] for p in points]
    values = [p[1] for p in points]
    xs = list(range(len(points)))
    noise = [verdicts[v][2] if v in verdicts else 0.0 for v in versions]
    figure = Figure(figsize=(9, 4.5), dpi=80)
    axes = figure.subplots()
    axes.plot(xs, values, marker="o", color="tab:blue", label="geometric mean over cases")
    axes.fill_between(
        xs,
        [v * math.exp(-n) for v, n in zip(values, noise, strict=True)],
        [v * math.exp(n) for v, n in zip(values, noise, strict=True)],
        color="tab:blue",
        alpha=0.15,
        label="noise (the series' other changes)",
    )
    styles = {
        "regression": ("^", "tab:red"),
        "improvement": ("v", "tab:green"),
        "not enough evidence": ("s", "tab:gray"),
    }
    labelled: set[str] = set()
    for x, version, value in zip(xs, versions, values, strict=True):
        verdict = verdicts.get(version)
        if verdict is None or verdict[0] not in styles:
            continue
        marker, color = styles[verdict[0]]
        axes.plot(
            [x],
            [value],
            linestyle="none",
            marker=marker,
            markersize=11,
            color=color,
            label=None if verdict[0] in labelled else verdict[0],
        )
        labelled.add(verdict[0])
        if verdict[0] != "not enough evidence":
            axes.annotate(
                f"{verdict[1]:.2f}x",
                (x, value),
                textcoords="offset points",
                xytext=(0, 10),
                ha="center",
                fontsize=8,
            )
    axes.set_xticks(xs, versions, fontsize=8, rotation=15, parse_math=False)
    axes.set_xlabel("version", parse_math=False)
    axes.set_ylabel(
        f"time relative to {relative_to}" if relative_to else "time (ns)", parse_math=False
    )
    axes.set_title(title, fontsize=10, parse_math=False)
    _plain_legend(axes.legend(fontsize=7))
    figure.tight_layout()
    return _png(figure)


def _plain_legend(legend: Legend) -> None:
    """A legend's labels are names (kernels, providers), never mathtext."""
    for text in legend.get_texts():
        text.set_parse_math(False)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
