"""`kindex chart`: PNGs drawn from the index's views, and the chart functions behind them."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
from index_support import LIGER_CSV, csv_bytes, index_settings, ingest_bytes

from pipelines import charts
from pipelines.cli import main

__all__ = ["index_settings"]  # a fixture

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def newer_version_of(kernel: str, version: str, factor: float) -> bytes:
    """The shared CSV's rows of one kernel, re-measured by a later Liger version."""
    with LIGER_CSV.open(newline="") as handle:
        header, *records = list(csv.reader(handle))
    column = {name: i for i, name in enumerate(header)}
    rows = []
    for record in records:
        if record[column["kernel_name"]] != kernel:
            continue
        record = list(record)
        record[column["liger_version"]] = version
        record[column["timestamp"]] = "2026-11-30 12:00:00"
        for name in ("y_value_50", "y_value_20", "y_value_80"):
            record[column[name]] = repr(float(record[column[name]]) * factor)
        rows.append(record)
    return csv_bytes(header, rows)


@pytest.fixture
def two_versions(s3_store: Any, index_settings: Any) -> Any:
    ingest_bytes(
        s3_store,
        index_settings,
        [
            ("incoming/all_benchmark_data.csv", LIGER_CSV.read_bytes()),
            ("incoming/layer_norm-next.csv", newer_version_of("layer_norm", "9.1.0", 0.8)),
        ],
    )
    return index_settings


@pytest.mark.slow
def test_chart_writes_each_kind_from_the_index(
    two_versions: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for kind, extra in (
        ("speedups", ["--gpu", "NVIDIA H100 80GB HBM3"]),
        ("versions", ["--kernel", "layer_norm", "--mode", "forward"]),
        ("gpus", ["--kernel", "layer_norm"]),
    ):
        target = tmp_path / f"{kind}.png"
        assert main(["chart", kind, "-o", str(target), *extra]) == 0, capsys.readouterr().err
        data = target.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, kind
    nothing = ["--kernel", "no_such_kernel", "-o", str(tmp_path / "x.png")]
    assert main(["chart", "versions", *nothing]) == 1
    assert "nothing to draw" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_chart_needs_a_png_and_answers_on_an_empty_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KINDEX_HOME", str(tmp_path / "home"))
    assert main(["chart", "speedups", "-o", str(tmp_path / "c.svg")]) == 2
    assert main(["chart", "speedups", "-o", str(tmp_path / "c.png")]) == 1
    assert "nothing to draw" in capsys.readouterr().err


def test_chart_functions_draw_names_with_dollars_as_text() -> None:
    points = [
        {"series": "a$b_c$ / GPU", "version": v, "median": m}
        for v, m in (("0.10.0", 3e6), ("0.9.0", 2e6), ("0.2.1", 1e6))
    ]
    png = charts.versions_chart_png(points, title="cost $x$ of_a kernel")
    assert png is not None and png.startswith(PNG_MAGIC)
    assert charts.versions_chart_png(points[:1], title="one version") is None
    assert sorted(["0.10.0", "0.9.0", "0.2.1"], key=charts.version_order) == [
        "0.2.1",
        "0.9.0",
        "0.10.0",
    ]
    rows = [
        {"gpu": "GPU $1$", "mode": m, "speedup": s}
        for m, s in (("forward", 1.5), ("backward", 0.7))
    ]
    png = charts.gpus_chart_png(rows, title="$gpus$")
    assert png is not None and png.startswith(PNG_MAGIC)
    assert charts.gpus_chart_png([], title="none") is None
    assert io.BytesIO(png).read(8) == PNG_MAGIC
