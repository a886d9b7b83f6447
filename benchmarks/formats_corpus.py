"""Every file of a folder of real result files through kindex's sources: per file, the format
(the source that read it), its layout, the records that hold a result (counted here from the
file itself, by its writer's layout, not by the reader), the runs kindex made, and the
quarantine rows by reason.

    .venv/bin/python benchmarks/formats_corpus.py DIR [--markdown] [--details]

Files are read by folder: the FlashInfer definitions of a folder resolve its traces and
solutions, as `kindex normalize FILE…` does (the local index is not asked). `*.md` and `*.tsv`
files (provenance notes) are skipped. Runs are timed by the files' modification times where a
format records no time.

Exits 1 when a file that holds results yields no run (refused, or every record quarantined);
a file whose runs are fewer than its records that hold a result is marked `SHORT` and counted.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from pipelines.commands.normalize import definitions_of  # noqa: E402
from pipelines.sources import SourceContext, normalize_object  # noqa: E402
from pipelines.sources.json_input import unpacked  # noqa: E402
from pipelines.sources.pytorch_v3 import PER_INPUT_PRODUCERS, producer_of  # noqa: E402

SKIPPED = (".md", ".tsv")


@dataclass
class FileResult:
    path: Path
    source: str
    layout: str
    held: int  # records that hold a result, by the writer's layout
    runs: int = 0
    manifests: int = 0  # outcomes with records but no run (a definition, a solution)
    quarantine: Counter[str] = field(default_factory=Counter)
    refused: str | None = None  # why no source read it

    @property
    def failed(self) -> bool:
        return self.held > 0 and self.runs == 0

    @property
    def short(self) -> bool:
        return self.runs < self.held


def files_of(folder: Path) -> dict[Path, list[Path]]:
    groups: dict[Path, list[Path]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.endswith(SKIPPED) and not path.name.startswith("."):
            groups.setdefault(path.parent, []).append(path)
    return groups


def read_folder(paths: list[Path]) -> Iterator[FileResult]:
    with definitions_of(paths, index=False) as lookup:
        for path in paths:
            data = path.read_bytes()
            received = _mtime(path)
            context = SourceContext(received_at=received, manifest_named=lookup)
            result = normalize_object(path.name, data, context=context)
            plain = unpacked(data)
            found = FileResult(path, result.source, layout_of(result.source, plain), 0)
            found.held = held_of(result.source, plain)
            for outcome in result.outcomes:
                if outcome.status == "ok":
                    if outcome.facts is not None:
                        found.runs += 1
                    else:
                        found.manifests += 1
                elif outcome.reason == "unrecognized_format":
                    found.refused = outcome.detail
                else:
                    found.quarantine[outcome.reason or "?"] += 1
            if found.refused is not None:
                found.held = max(held_of(source, plain) for source in HELD)
            yield found


def _mtime(path: Path) -> str:
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    return moment.isoformat().replace("+00:00", "Z")


# --- the records that hold a result, counted from each writer's layout ----------------------


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _lines(data: bytes) -> list[Any]:
    values = []
    for line in data.splitlines():
        if line.strip():
            try:
                values.append(json.loads(line))
            except ValueError:
                continue
    return values


def _number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def held_kernelbench(data: bytes) -> int:
    document = _json(data)
    if not isinstance(document, dict):
        return 0
    return sum(
        1
        for level in document.values()
        if isinstance(level, dict)
        for timing in level.values()
        if isinstance(timing, dict) and _number(timing.get("mean"))
    )


def _states(bench: Any) -> list[Any]:
    states = bench.get("states") if isinstance(bench, dict) else None
    if isinstance(states, dict):
        return list(states.values())
    return states if isinstance(states, list) else []


def held_nvbench(data: bytes) -> int:
    document = _json(data)
    benches = document.get("benchmarks") if isinstance(document, dict) else None
    return sum(
        1
        for bench in (benches if isinstance(benches, list) else [])
        for state in _states(bench)
        if isinstance(state, dict) and not state.get("is_skipped") and state.get("summaries")
    )


def _v3_records(data: bytes) -> list[Any]:
    document = _json(data)
    values = _lines(data) if document is None else [document]
    records: list[Any] = []
    for value in values:
        records.extend(value if isinstance(value, list) else [value])
    return [r for r in records if isinstance(r, dict)]


def _v3_field(record: dict[str, Any], name: str, index: int) -> Any:
    """A field of a record's tuple, written as an object or (the first uploads) an array."""
    part = record.get(name)
    keys = {"benchmark": ("name",), "metric": ("name", "benchmark_values")}[name]
    if isinstance(part, list):
        return part[index] if len(part) > index else None
    return part.get(keys[index]) if isinstance(part, dict) else None


def held_v3(data: bytes) -> int:
    count = 0
    for record in _v3_records(data):
        values = _v3_field(record, "metric", 1)
        if not isinstance(values, list) or not values:
            continue
        shape = record.get("shape")
        per_input = producer_of(record) in PER_INPUT_PRODUCERS or (
            isinstance(shape, list) and len(shape) == len(values)
        )
        # one result per input; Helion writes 0 for an input that failed
        count += sum(1 for v in values if _number(v) and float(v) != 0) if per_input else 1
    return count


def held_flashinfer(data: bytes) -> int:
    lines = _lines(data)
    return sum(1 for v in lines if isinstance(v, dict) and isinstance(v.get("evaluation"), dict))


def held_gbench(data: bytes) -> int:
    document = _json(data)
    rows = document.get("benchmarks") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        return 0
    identities: set[str] = set()
    aggregates: dict[str, list[str]] = {}
    seen: Counter[str] = Counter()
    timed = [r for r in rows if isinstance(r, dict) and isinstance(r.get("name"), str)]
    for row in timed:
        name = row["name"]
        has_time = _number(row.get("real_time")) or _number(row.get("cpu_time"))
        if not has_time and row.get("error_occurred") is not True:
            continue
        old = re.fullmatch(r"(.+)_(mean|median|stddev|cv)", name)
        if (
            row.get("run_type") == "aggregate"
            or row.get("aggregate_name")
            or ("run_type" not in row and old)
        ):
            run = row.get("run_name") or (old.group(1) if old else name)
            aggregates.setdefault(run, []).append(row.get("aggregate_name") or name)
            continue
        index = row.get("repetition_index", seen[name])
        seen[name] += 1
        identities.add(f"{name}#{index}")
    # a run name's aggregates are one result, when no statistic is given twice
    good = {run for run, names in aggregates.items() if len(names) == len(set(names))}
    folded = {i for i in identities if i.split("#")[0] in good}
    return len(identities - folded) + len(good)


def held_tritonbench(data: bytes) -> int:
    from pipelines.sources.tritonbench import _PER_INPUT

    document = _json(data)
    if not isinstance(document, dict):
        return 0
    wrapped = document.get("metrics")
    metrics: dict[str, Any] = wrapped if isinstance(wrapped, dict) else document
    cases = set()
    for key, value in metrics.items():
        match = _PER_INPUT.match(key)
        # `x_average` is TritonBench's average over the inputs, no input of its own
        if match and _number(value) and match.group("input") != "average":
            cases.add((match.group("bench"), match.group("input"), match.group("backend")))
    return len(cases)


def held_liger(data: bytes) -> int:
    import csv
    import io

    try:
        reader = csv.DictReader(io.StringIO(data.decode("utf-8-sig")))
        return sum(1 for row in reader if _number(row.get("y_value_50")))
    except (UnicodeDecodeError, csv.Error):
        return 0


HELD = {
    "kernelbench-timing": held_kernelbench,
    "nvbench-json": held_nvbench,
    "pytorch-benchmark-v3": held_v3,
    "flashinfer-trace": held_flashinfer,
    "google-benchmark-json": held_gbench,
    "tritonbench-json": held_tritonbench,
    "liger-csv": held_liger,
}


def held_of(source: str, data: bytes) -> int:
    counter = HELD.get(source)
    return counter(data) if counter is not None else 0


# --- the layout a file was written in, by what it holds -------------------------------------


def layout_of(source: str, data: bytes) -> str:
    try:
        return LAYOUTS[source](data) if source in LAYOUTS else "-"
    except (ValueError, TypeError, AttributeError, KeyError, IndexError):
        return "?"


def layout_kernelbench(data: bytes) -> str:
    document = _json(data) or {}
    timings = [t for level in document.values() if isinstance(level, dict) for t in level.values()]
    parts = [",".join(document)]
    if any(t is None for t in timings):
        parts.append("failed problems null")
    if any(isinstance(t, dict) and set(t) == {"mean"} for t in timings):
        parts.append("mean only")
    return "; ".join(parts)


def layout_nvbench(data: bytes) -> str:
    document = _json(data) or {}
    benches = document.get("benchmarks") or []
    states = [s for b in benches for s in _states(b) if isinstance(s, dict) and s.get("summaries")]
    keyed = any(isinstance(b.get("states"), dict) for b in benches if isinstance(b, dict))
    summaries = states[0]["summaries"] if states else None
    if "meta" in document or (isinstance(summaries, list) and summaries and "tag" in summaries[0]):
        return "JSON 1.0 (2022 on: tagged summaries)"
    if keyed or isinstance(summaries, dict):
        return "June 2021 (states and summaries keyed by name)"
    return "March 2021 (named summaries, no tag)"


def layout_v3(data: bytes) -> str:
    text = data.lstrip()
    shape = "JSON Lines" if _json(data) is None else ("array" if text[:1] == b"[" else "object")
    records = _v3_records(data)
    parts = [shape]
    if any(isinstance(r.get("metric"), list) for r in records):
        parts.append("tuples as arrays")
    per_input = any(producer_of(r) in PER_INPUT_PRODUCERS for r in records)
    if per_input or any(isinstance(r.get("shape"), list) for r in records):
        parts.append("one value per input (Helion)")
    return "; ".join(parts)


def layout_flashinfer(data: bytes) -> str:
    from pipelines.sources.flashinfer import kind_of

    kind = kind_of(data)
    if kind == "traces":
        lines = [v for v in _lines(data) if isinstance(v, dict)]
        workloads = [v.get("workload") or {} for v in lines]
        if any(isinstance(w, dict) and "uuid" in w for w in workloads):
            return "traces (workload uuid)"
        return "traces (2025 dataset schema: no workload uuid)"
    if kind == "definition" and data.lstrip()[:1] == b"[":
        return "definitions (a list, July 2025)"
    return str(kind)


def layout_gbench(data: bytes) -> str:
    document = _json(data) or {}
    rows = [r for r in document.get("benchmarks") or [] if isinstance(r, dict)]
    version = (document.get("context") or {}).get("library_version")
    if any("repetition_index" in r for r in rows):
        layout = "v1.5 on (repetition_index)"
    elif any("run_name" in r for r in rows):
        layout = "v1.4 (run_name, run_type)"
    elif any("run_type" in r for r in rows):
        layout = "2018 (run_type, no run_name)"
    else:
        layout = "before v1.4 (no run_type)"
    return f"{layout}; {version}" if version else layout


LAYOUTS = {
    "kernelbench-timing": layout_kernelbench,
    "nvbench-json": layout_nvbench,
    "pytorch-benchmark-v3": layout_v3,
    "flashinfer-trace": layout_flashinfer,
    "google-benchmark-json": layout_gbench,
    "tritonbench-json": lambda data: (
        "nightly (env, metrics)" if isinstance((_json(data) or {}).get("metrics"), dict) else "flat"
    ),
    "liger-csv": lambda data: "CSV",
}


# --- the table ----------------------------------------------------------------------------


def quarantine_text(result: FileResult) -> str:
    if result.refused is not None:
        return f"refused: {result.refused}"
    return ", ".join(f"{reason} {n}" for reason, n in sorted(result.quarantine.items())) or "-"


def print_table(results: list[FileResult], folder: Path, markdown: bool) -> None:
    header = ["file", "format", "layout", "held", "runs", "quarantine by reason", ""]
    rows = []
    for r in results:
        mark = "FAIL" if r.failed else ("SHORT" if r.short else "")
        name = str(r.path.relative_to(folder))
        runs = f"{r.runs}" + (f" (+{r.manifests} manifests)" if r.manifests else "")
        rows.append([name, r.source, r.layout, str(r.held), runs, quarantine_text(r), mark])
    if markdown:
        print("| " + " | ".join(header[:-1]) + " |")
        print("|" + "---|" * (len(header) - 1))
        for row in rows:
            cells = [c.replace("|", "\\|") for c in row[:-1]]
            cells[0] = f"`{cells[0]}`"
            print("| " + " | ".join(cells) + (f" **{row[-1]}**" if row[-1] else "") + " |")
    else:
        for row in rows:
            print("\t".join(row))


def summary(results: list[FileResult]) -> str:
    holding = [r for r in results if r.held > 0]
    by_format = Counter(r.source for r in results)
    quarantine: Counter[str] = Counter()
    for r in results:
        quarantine.update(r.quarantine)
    return (
        f"{len(results)} files ({', '.join(f'{k} {v}' for k, v in sorted(by_format.items()))}); "
        f"{len(holding)} hold results ({sum(r.held for r in results)} records): "
        f"{sum(r.runs for r in results)} runs, "
        f"{sum(1 for r in holding if r.failed)} yield none, "
        f"{sum(1 for r in holding if r.short)} yield fewer runs than records; "
        f"refused {sum(1 for r in results if r.refused is not None)}; quarantine: "
        + (", ".join(f"{k} {v}" for k, v in sorted(quarantine.items())) or "none")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    arguments = parser.parse_args()
    results: list[FileResult] = []
    for paths in files_of(arguments.folder).values():
        results.extend(read_folder(paths))
    print_table(results, arguments.folder, arguments.markdown)
    print()
    print(summary(results))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
