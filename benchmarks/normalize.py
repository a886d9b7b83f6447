"""Benchmark `kindex normalize` against DuckDB's CSV→Parquet on the same file, in one run.

Replicates the shared Liger CSV (each copy shifted one day, so rows stay distinct) to 300k rows,
then runs, as separate processes and one after another in each round, DuckDB
`COPY (read_csv) TO parquet (zstd)`, `kindex normalize FILE` (JSON lines to /dev/null) and
`kindex normalize --summary FILE`. Prints each round's ratios to DuckDB's rows/s and their
medians, and each command's peak RSS (of its largest process: `kindex normalize` of a large file
runs its parts in worker processes); exits non-zero when the median ratio of `kindex normalize`
is under TARGET. With --write-docs, writes the figures into docs/benchmarks.md.

    .venv/bin/python benchmarks/normalize.py [--rows 300000] [--repeat 3] [--write-docs]
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
from report import Figure, add_write_docs, write_figures

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[300_000])
    parser.add_argument("--repeat", type=int, default=3)
    add_write_docs(parser)
    args = parser.parse_args()
    below = False
    figures = []
    with tempfile.TemporaryDirectory() as scratch:
        for rows in args.rows:
            csv_path = replicate(SOURCE, Path(scratch) / f"liger-{rows}.csv", rows)
            parquet = Path(scratch) / "out.parquet"
            print(f"{rows:,} rows ({csv_path.stat().st_size / 2**20:.0f} MiB CSV)")
            commands = {
                "duckdb": [sys.executable, "-c", DUCKDB_COPY, str(csv_path), str(parquet)],
                "lines": [*KINDEX, "normalize", str(csv_path)],
                "summary": [*KINDEX, "normalize", "--summary", str(csv_path)],
            }
            rates: dict[str, list[float]] = {name: [] for name in commands}
            peaks: dict[str, int] = dict.fromkeys(commands, 0)
            ratios: dict[str, list[float]] = {"lines": [], "summary": []}
            for round_ in range(1, args.repeat + 1):
                for name, command in commands.items():
                    seconds, peak = timed(command)
                    rates[name].append(rows / seconds)
                    peaks[name] = max(peaks[name], peak)
                for name in ratios:
                    ratios[name].append(rates[name][-1] / rates["duckdb"][-1])
                print(
                    f"  round {round_}: duckdb {rates['duckdb'][-1]:>9,.0f} rows/s,"
                    f" normalize {rates['lines'][-1]:>7,.0f} ({ratios['lines'][-1]:.3f}x),"
                    f" --summary {rates['summary'][-1]:>7,.0f} ({ratios['summary'][-1]:.3f}x)"
                )
            median = {name: statistics.median(values) for name, values in rates.items()}
            lines, summary = (statistics.median(ratios[name]) for name in ("lines", "summary"))
            print(
                f"  median ratio to duckdb: normalize {lines:.3f}, --summary {summary:.3f}"
                f" (target >= {TARGET}); peak RSS MiB: duckdb {peaks['duckdb']},"
                f" normalize {peaks['lines']}, --summary {peaks['summary']}"
            )
            below |= lines < TARGET
            figures.append(
                Figure(
                    f"normalize: {rows:,}-row Liger CSV vs DuckDB CSV->Parquet",
                    f"{lines:.3f}x ({median['lines']:,.0f} vs {median['duckdb']:,.0f} rows/s;"
                    f" rounds {', '.join(f'{r:.3f}' for r in ratios['lines'])}),"
                    f" --summary {summary:.3f}x; peak RSS {peaks['lines']} MiB"
                    f" (largest process; DuckDB {peaks['duckdb']} MiB)",
                    f">= {TARGET}x",
                )
            )
    if args.write_docs:
        write_figures(figures)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
