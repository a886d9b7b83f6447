"""`kindex normalize` on every core (pipelines/sources/liger/relay.py) writes the serial path's
bytes, in
input order: segments cut inside quoted fields, duplicates across segments, damaged rows; and
its counts are the serial path's."""

from __future__ import annotations

import io
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from liger_support import HEADER, LIGER_CSV, csv_lines
from test_liger_bad_inputs import GOOD_FIELDS, row_with

from pipelines.sources.liger.columnar import count_outcomes, normalized_batches, write_json_lines
from pipelines.sources.liger.relay import normalize_file


def serial(path: Path) -> tuple[bytes, Counter[str]]:
    out, counts = io.BytesIO(), Counter[str]()
    with path.open("rb") as stream:
        for batch in normalized_batches(stream):
            write_json_lines(batch, out)
            count_outcomes(batch, counts)
    return out.getvalue(), counts


def relayed(
    path: Path, tmp_path: Path, workers: int, segment_bytes: int
) -> tuple[bytes, Counter[str]]:
    target = tmp_path / f"out-{workers}-{segment_bytes}.jsonl"
    with target.open("wb") as out:
        counts = normalize_file(path, out, workers, segment_bytes)
    return target.read_bytes(), counts


def messy_file(tmp_path: Path) -> Path:
    good = csv_lines(list(range(2, 400)))
    quoted_newline = row_with(liger_version="0.6\nsecond line")
    rows = [
        *good[:150],
        quoted_newline,
        *good[150:200],
        "",
        "garbage",
        row_with(y_value_50="1e-05"),
        *good[100:160],  # duplicates of rows in earlier segments
        '"an open quote,' + ",".join(GOOD_FIELDS[1:]),  # swallows the lines after it
        *good[200:],
    ]
    path = tmp_path / "messy.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("workers", "segment_bytes"), [(2, 700), (3, 2000), (2, 50_000), (1, 3000)]
)
def test_relay_equals_the_serial_path(tmp_path: Path, workers: int, segment_bytes: int) -> None:
    path = messy_file(tmp_path)
    expected_bytes, expected_counts = serial(path)
    got_bytes, got_counts = relayed(path, tmp_path, workers, segment_bytes)
    assert got_bytes == expected_bytes
    assert got_counts == expected_counts
    assert expected_counts["quarantined:duplicate_external_id"] >= 60


def test_relay_on_the_shared_csv_counts_only(tmp_path: Path) -> None:
    counts = normalize_file(LIGER_CSV, None, 2, 100_000)
    assert counts == {"ok:latency": 1649, "ok:memory": 799}


def test_relay_output_closed_early_is_quiet(tmp_path: Path) -> None:
    """`kindex normalize big.csv | head -1`: no traceback, and every worker is gone."""
    big = tmp_path / "big.csv"
    lines = LIGER_CSV.read_text(encoding="utf-8").splitlines()
    big.write_text("\n".join([lines[0], *lines[1:] * 14]) + "\n", encoding="utf-8")
    assert big.stat().st_size >= 8 << 20
    command = f"{sys.executable} -m pipelines.cli normalize {big} | head -c 100"
    result = subprocess.run(
        command, shell=True, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0
    assert len(result.stdout) == 100
    assert "Traceback" not in result.stderr, result.stderr


def test_a_worker_keeps_freed_memory_for_its_next_batch() -> None:
    """reuse_freed_memory (run first in each relay worker) moves Arrow onto malloc, which it
    tells to keep freed blocks: in a fresh process, so this one keeps its allocator."""
    script = (
        "import pyarrow as pa\n"
        "from pipelines.forked import reuse_freed_memory\n"
        "reuse_freed_memory()\n"
        "table = pa.table({'x': pa.array(range(1_000_000))})\n"
        "print(pa.default_memory_pool().backend_name, pa.total_allocated_bytes() > 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["system", "True"]
