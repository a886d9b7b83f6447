"""Write a large Liger CSV for benchmarks: the given CSV's rows repeated, each copy shifted in time
(one day per copy) so every row stays distinct (no duplicate externalIds)."""

from __future__ import annotations

import csv
import sys
from datetime import datetime, timedelta
from pathlib import Path


def replicate(source: Path, target: Path, rows: int) -> Path:
    with source.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        data = list(reader)
    stamp = header.index("timestamp")
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        written, copy = 0, 0
        while written < rows:
            shift = timedelta(days=copy)
            for row in data[: rows - written]:
                moved = list(row)
                when = datetime.strptime(row[stamp], "%Y-%m-%d %H:%M:%S") + shift
                moved[stamp] = when.strftime("%Y-%m-%d %H:%M:%S")
                writer.writerow(moved)
            written += min(len(data), rows - written)
            copy += 1
    return target


if __name__ == "__main__":
    replicate(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
