"""How fast, and with how much memory, hostile documents are refused (issue 5: under a second,
bounded memory), against a baseline measured in the same run: normalizing the example fixture.

For each document: wall seconds of `normalize_bundle_bytes` to its quarantine outcome, the peak
Python allocation during it (tracemalloc), and both as ratios to the fixture's.

    .venv/bin/python benchmarks/hostile_bundles.py [--repeat 5] [--write-docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bundle_support import FIXTURE, billion_laughs, over_size, ten_thousand_deep  # noqa: E402
from report import Figure, add_write_docs, write_figures  # noqa: E402

from pipelines.sources.bundles.normalize import normalize_bundle_bytes  # noqa: E402


def measure(data: bytes, repeat: int) -> tuple[float, float, str]:
    """Median seconds, peak MiB allocated, and the first outcome's reason (or 'ok')."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        outcomes = list(normalize_bundle_bytes(data))
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    list(normalize_bundle_bytes(data))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), peak / 2**20, outcomes[0].reason or "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    add_write_docs(parser)
    args = parser.parse_args()
    documents = {
        "fixture (baseline)": FIXTURE.read_bytes(),
        "billion laughs (10 levels)": billion_laughs(),
        "deeper laughs (30 levels)": billion_laughs(30),
        "10,000-deep JSON": ten_thousand_deep(),
        "16 MiB + 1 byte": over_size(),
    }
    results = {name: measure(data, args.repeat) for name, data in documents.items()}
    base_s, base_mib, _ = results["fixture (baseline)"]
    header = ("document", "reason", "ms", "x base", "peak MiB", "x base")
    print("{:28} {:18} {:>9} {:>7} {:>9} {:>7}".format(*header))
    for name, (seconds, mib, reason) in results.items():
        print(
            f"{name:28} {reason:18} {seconds * 1000:9.3f} {seconds / base_s:7.3f} "
            f"{mib:9.2f} {mib / base_mib:7.2f}"
        )
    if args.write_docs:
        refusals = [result for name, result in results.items() if name != "fixture (baseline)"]
        worst_s = max(seconds for seconds, _, _ in refusals)
        worst_mib = max(mib for _, mib, _ in refusals)
        write_figures(
            [
                Figure(
                    "hostile bundles: slowest refusal vs reading the example fixture",
                    f"{worst_s * 1000:.1f} ms ({worst_s / base_s:.1f}x the fixture), "
                    f"peak {worst_mib:.1f} MiB ({worst_mib / base_mib:.1f}x)",
                    "< 1 s, bounded memory",
                )
            ]
        )


if __name__ == "__main__":
    main()
