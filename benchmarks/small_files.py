"""Benchmark many small Liger files: each file's record set alone (`record_set`, one call per
file) against all of them read together (`record_sets`, batches that hold many files).

A fleet drops many small CSVs; a batch run builds up to 250 files' record sets in one call.
Cuts the shared Liger CSV into FILES files of ROWS rows, warms the normalizer's caches, then
times both ways in turn, REPEAT rounds, in this process. Prints ms per file and the ratio
(alone / together), and their medians; exits non-zero when the median ratio is under TARGET.
With --write-docs, writes the figure into docs/benchmarks.md.

    .venv/bin/python benchmarks/small_files.py [--files 250] [--rows 20] [--repeat 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
import time
from pathlib import Path

from report import Figure, add_write_docs, write_figures

from pipelines.sources.liger.normalize import parser_version, record_set, record_sets

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "data" / "liger" / "all_benchmark_data.csv"
TARGET = 2.0


def small_files(count: int, rows: int) -> list[tuple[bytes, str]]:
    """`count` files of `rows` consecutive rows of the shared CSV each (wrapping around)."""
    with SOURCE.open(newline="") as handle:
        header, *records = list(csv.reader(handle))
    files = []
    for i in range(count):
        start = i * rows % (len(records) - rows)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(records[start : start + rows])
        files.append((out.getvalue().encode(), f"sha256:{i:064x}"))
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=250)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    add_write_docs(parser)
    args = parser.parse_args()
    files = small_files(args.files, args.rows)
    version = parser_version()
    record_sets(files, version)  # warm: curation, templates, workloads

    def alone() -> object:
        return [record_set(data, digest, version) for data, digest in files]

    def together() -> object:
        return record_sets(files, version)

    per_file: dict[str, list[float]] = {"alone": [], "together": []}
    ratios = []
    for round_ in range(1, args.repeat + 1):
        for name, run in (("alone", alone), ("together", together)):
            start = time.perf_counter()
            run()
            per_file[name].append((time.perf_counter() - start) * 1000 / len(files))
        ratios.append(per_file["alone"][-1] / per_file["together"][-1])
        print(
            f"round {round_}: alone {per_file['alone'][-1]:.2f} ms/file,"
            f" together {per_file['together'][-1]:.2f} ms/file ({ratios[-1]:.1f}x)"
        )
    alone_ms, together_ms = (statistics.median(per_file[n]) for n in ("alone", "together"))
    ratio = statistics.median(ratios)
    print(
        f"median: alone {alone_ms:.2f} ms/file, together {together_ms:.2f} ms/file,"
        f" {ratio:.1f}x (target >= {TARGET}x)"
    )
    if args.write_docs:
        write_figures(
            [
                Figure(
                    f"record sets: {args.files} Liger files of {args.rows} rows, together vs alone",
                    f"{ratio:.1f}x ({together_ms:.2f} vs {alone_ms:.2f} ms/file;"
                    f" rounds {', '.join(f'{r:.1f}' for r in ratios)})",
                    f">= {TARGET}x",
                )
            ]
        )
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
