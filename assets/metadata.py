"""What a person reads on a materialization in the Dagster UI: markdown previews and a chart.

Plain functions over run rows (the columns of a record set's runs.parquet); Dagster-free so
they are cheap to test, but they only serve the UI, hence they live in assets/.
"""

from __future__ import annotations

import base64
import io
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Liger's baselines, most specific first: a cohort's speedup is baseline median / provider median.
BASELINE_PROVIDERS = ("huggingface", "torch", "torch_compile")
PREVIEW_ROWS = 10


def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")[:120]


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "_none_"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def top_reasons(reasons: Iterable[str | None], n: int = 5) -> list[tuple[str, int]]:
    return Counter(r or "unknown" for r in reasons).most_common(n)


def reasons_markdown(reasons: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"`{reason}` × {count}" for reason, count in reasons) or "none"


def speedups(runs: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per kernel/provider, the speedups over the cohort's baseline provider (same kernel,
    mode, GPU and case; latency only)."""
    cohorts: dict[tuple[str, str, str, str], dict[str, int]] = defaultdict(dict)
    for r in runs:
        if r["metric"] == "latency" and r["median"] and r["median"] > 0:
            cohort = (r["kernel"], r["mode"], r["gpu"], r["case_key"])
            cohorts[cohort][r["provider"]] = r["median"]
    result: dict[str, list[float]] = defaultdict(list)
    for (kernel, *_), medians in cohorts.items():
        baseline = next((p for p in BASELINE_PROVIDERS if p in medians), None)
        if baseline is None:
            continue
        for provider, median in medians.items():
            if provider != baseline:
                result[f"{kernel}: {provider} vs {baseline}"].append(medians[baseline] / median)
    return dict(result)


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def speedup_chart_png(runs: Iterable[Mapping[str, Any]], title: str) -> bytes | None:
    """A horizontal bar chart of geometric-mean speedups per kernel and provider, or None when
    the file holds no comparable cohort."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a daemon subprocess renders to memory
    from matplotlib import pyplot as plt

    by_series = speedups(runs)
    if not by_series:
        return None
    labels = sorted(by_series, key=lambda s: geometric_mean(by_series[s]))
    values = [geometric_mean(by_series[s]) for s in labels]
    height = 1.2 + 0.28 * len(labels)
    figure, axes = plt.subplots(figsize=(8, min(height, 30)), dpi=80)
    try:
        colors = ["#2a9d8f" if v >= 1 else "#e76f51" for v in values]
        axes.barh(labels, values, color=colors)
        axes.axvline(1.0, color="black", linewidth=0.8)
        axes.set_xscale("log")
        axes.set_xlabel("speedup over baseline (geometric mean over cases, log scale)")
        axes.set_title(title, fontsize=10)
        axes.tick_params(axis="y", labelsize=7)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(figure)


def png_markdown(png: bytes, alt: str) -> str:
    """Inline the image: the Dagster UI renders markdown metadata, data URIs included."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"
