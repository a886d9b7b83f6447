"""A large FlashInfer-Trace JSON Lines file through its source, against orjson parsing the same
file in the same run, with the peak RSS of the process that normalizes it (target: bounded,
under 500 MB for 100 MB of traces, streamed).

The file is made from the shared sample's traces, repeated with a fresh workload uuid and batch
size each time (so each line is a distinct run), to `--megabytes`. Each measurement runs in a
fresh process, so its peak RSS is its own.

    .venv/bin/python benchmarks/formats.py [--megabytes 100] [--repeat 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from report import Figure, add_write_docs, write_figures  # noqa: E402

SAMPLES = ROOT / "tests" / "data" / "formats" / "flashinfer-trace"
TRACES = SAMPLES / "gemm_n128_k2048.traces.jsonl"
DEFINITION = SAMPLES / "gemm_n128_k2048.definition.json"


def make_traces(path: Path, megabytes: int) -> int:
    """Write about `megabytes` of distinct traces; the number of lines."""
    lines = [json.loads(line) for line in TRACES.read_text().splitlines() if line.strip()]
    target, written, count = megabytes * 1024 * 1024, 0, 0
    with path.open("w") as out:
        while written < target:
            trace = lines[count % len(lines)]
            trace["workload"]["uuid"] = f"bench-{count:08d}"
            trace["workload"]["axes"]["M"] = 1 + count % 8192
            text = json.dumps(trace) + "\n"
            out.write(text)
            written += len(text)
            count += 1
    return count


CHILD = """
import sys, time, resource
from pathlib import Path
mode, path, definition = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
data = path.read_bytes()
start = time.perf_counter()
if mode == "orjson":
    import orjson
    rows = sum(1 for line in data.splitlines() if line.strip() and orjson.loads(line) is not None)
else:
    import tempfile
    from pipelines.sources import SourceContext, normalize_object, source_of
    (defined,) = normalize_object(definition.name, definition.read_bytes()).outcomes
    manifest = defined.records[0].manifest
    context = SourceContext(
        manifest_named=lambda kind, name: manifest
        if (kind, name) == ("OperationSpec", manifest["metadata"]["name"]) else None,
        received_at="2026-01-01T00:00:00Z",
    )
    source = source_of(path.name, data)
    with tempfile.TemporaryDirectory() as parts:
        content = source.record_set(data, "sha256:" + "0" * 64, context, Path(parts))
    rows = content.rows
    assert content.row_count("runs") == rows, (content.row_count("runs"), rows)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(rows, seconds, peak)
"""


def measure(mode: str, path: Path) -> tuple[int, float, float]:
    """Rows, seconds and peak RSS (MiB) of one fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path), str(DEFINITION)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    rows, seconds, peak = done.stdout.split()
    return int(rows), float(seconds), float(peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    add_write_docs(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "traces.jsonl"
        lines = make_traces(path, args.megabytes)
        size = path.stat().st_size / 2**20
        print(f"{lines} traces, {size:.0f} MiB")
        ratios, kindex_rates, orjson_rates, peaks = [], [], [], []
        for _ in range(args.repeat):
            _, base_s, _ = measure("orjson", path)
            rows, seconds, peak = measure("kindex", path)
            orjson_rates.append(lines / base_s)
            kindex_rates.append(rows / seconds)
            ratios.append((rows / seconds) / (lines / base_s))
            peaks.append(peak)
            print(
                f"orjson {lines / base_s:10.0f} lines/s   kindex {rows / seconds:9.0f} runs/s   "
                f"ratio {ratios[-1]:.3f}   peak RSS {peak:.0f} MiB"
            )
    ratio, peak = statistics.median(ratios), max(peaks)
    kindex_rate, orjson_rate = statistics.median(kindex_rates), statistics.median(orjson_rates)
    print(
        f"median ratio {ratio:.3f} ({kindex_rate:.0f} vs {orjson_rate:.0f} /s), peak {peak:.0f} MiB"
    )
    if args.write_docs:
        write_figures(
            [
                Figure(
                    f"FlashInfer traces, {size:.0f} MiB JSONL: normalize vs orjson parse",
                    f"{ratio:.3f}x ({kindex_rate:.0f} runs/s vs {orjson_rate:.0f} lines/s), "
                    f"peak RSS {peak:.0f} MiB",
                    "peak RSS < 500 MB, streamed",
                )
            ]
        )


if __name__ == "__main__":
    main()
