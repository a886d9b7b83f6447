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

from pipelines import curation

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def speedups(
    runs: Iterable[Mapping[str, Any]], baseline_ranks: Mapping[str, int] | None = None
) -> dict[str, list[float]]:
    """Per kernel/provider, the speedups over the cohort's baseline provider (same kernel,
    mode, GPU and case; latency only). The baseline is the lowest-ranked curated one present."""
    ranks = curation.load().baseline_ranks() if baseline_ranks is None else baseline_ranks
    cohorts: dict[tuple[str, str, str, str], dict[str, int]] = defaultdict(dict)
    newest: dict[tuple[str, str, str, str, str], tuple[Any, Any]] = {}
    for r in runs:
        if r["metric"] == "latency" and r["median"] and r["median"] > 0:
            cohort = (r["kernel"], r["mode"], r["gpu"], r["case_key"])
            # A provider's newest run of the cohort, as the `speedups` view takes it (rows
            # without a time: the last one).
            when = (r.get("observed_at") or "", r.get("run_digest") or "")
            if when >= newest.get((*cohort, r["provider"]), ("", "")):
                newest[(*cohort, r["provider"])] = when
                cohorts[cohort][r["provider"]] = r["median"]
    result: dict[str, list[float]] = defaultdict(list)
    for (kernel, *_), medians in cohorts.items():
        present = [p for p in medians if p in ranks]
        if not present:
            continue
        baseline = min(present, key=lambda p: ranks[p])
        for provider, median in medians.items():
            if provider != baseline:
                result[f"{kernel}: {provider} vs {baseline}"].append(medians[baseline] / median)
    return dict(result)


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _plain_number(value: float, _position: int) -> str:
    return f"{value:g}"


def speedup_chart_png(runs: Iterable[Mapping[str, Any]], title: str) -> bytes | None:
    """A horizontal bar chart of geometric-mean speedups per kernel and provider, or None when
    the rows hold no comparable cohort."""
    return speedup_bars_png(speedups(runs), title)


def speedup_bars_png(by_series: Mapping[str, Sequence[float]], title: str) -> bytes | None:
    """The speedup chart of speedups already computed (`speedups`' result)."""
    if not by_series:
        return None
    labels = sorted(by_series, key=lambda s: geometric_mean(by_series[s]))
    values = [geometric_mean(by_series[s]) for s in labels]
    height = 1.2 + 0.28 * len(labels)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

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
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

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
    legend = axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    for text in legend.get_texts():
        text.set_parse_math(False)
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
    from matplotlib.figure import Figure

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
    legend = axes.legend(fontsize=7)
    for text in legend.get_texts():
        text.set_parse_math(False)
    figure.tight_layout()
    return _png(figure)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
