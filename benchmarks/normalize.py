"""Benchmark `kindex normalize` against DuckDB's CSV→Parquet on the same file, in one run.

Replicates the shared Liger CSV (each copy shifted one day, so rows stay distinct) to 300k rows,
then runs, as separate processes, `kindex normalize FILE` (JSON lines to /dev/null),
`kindex normalize --summary FILE`, and DuckDB `COPY (read_csv) TO parquet (zstd)`. Prints median
rows/s, the ratio to DuckDB and each command's peak RSS; exits non-zero when `kindex normalize`
is under TARGET times DuckDB's rows/s.

    .venv/bin/python benchmarks/normalize.py [--rows 300000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replicate import replicate

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
KINDEX = [sys.executable, "-m", "pipelines.cli"]
TARGET = 0.15
DUCKDB_COPY = (
    "import duckdb, sys; duckdb.sql(f\"COPY (SELECT * FROM read_csv('{sys.argv[1]}', header=true)) "
    "TO '{sys.argv[2]}' (FORMAT parquet, COMPRESSION zstd)\")"
)


def timed(command: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (MiB) of one child process; its stdout goes to /dev/null."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{command} failed with status {status}")
    return elapsed, usage.ru_maxrss // 1024


def measure(label: str, command: list[str], rows: int, repeat: int) -> tuple[float, int]:
    samples = [timed(command) for _ in range(repeat)]
    seconds = statistics.median(s for s, _ in samples)
    peak = max(m for _, m in samples)
    print(
        f"  {label:<28} {rows / seconds:>10,.0f} rows/s   median {seconds:6.2f} s"
        f"   peak RSS {peak:5d} MiB"
    )
    return rows / seconds, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[300_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    below = False
    with tempfile.TemporaryDirectory() as scratch:
        for rows in args.rows:
            csv_path = replicate(SOURCE, Path(scratch) / f"liger-{rows}.csv", rows)
            parquet = Path(scratch) / "out.parquet"
            print(f"{rows:,} rows ({csv_path.stat().st_size / 2**20:.0f} MiB CSV)")
            baseline, _ = measure(
                "duckdb csv->parquet",
                [sys.executable, "-c", DUCKDB_COPY, str(csv_path), str(parquet)],
                rows,
                args.repeat,
            )
            lines, _ = measure(
                "kindex normalize", [*KINDEX, "normalize", str(csv_path)], rows, args.repeat
            )
            summary, _ = measure(
                "kindex normalize --summary",
                [*KINDEX, "normalize", "--summary", str(csv_path)],
                rows,
                args.repeat,
            )
            print(
                f"  ratio to duckdb: normalize {lines / baseline:.3f},"
                f" --summary {summary / baseline:.3f} (target >= {TARGET})"
            )
            below |= lines / baseline < TARGET
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
