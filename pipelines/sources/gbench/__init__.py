"""Google Benchmark JSON (`--benchmark_out=FILE --benchmark_out_format=json`, written by
`src/json_reporter.cc` in google/benchmark): the runs of a C++ benchmark program.

    {"context": {"date": "2019-11-29T21:26:59+01:00", "host_name": "box",
                 "executable": "./a.out", "num_cpus": 4, "mhz_per_cpu": 2700,
                 "library_version": "v1.8.3", "library_build_type": "release",
                 "gpu_name": "NVIDIA H100 80GB HBM3"},          # a custom context key
     "benchmarks": [
       {"name": "BM_copy/64/repeats:3", "run_name": "BM_copy/64/repeats:3",
        "run_type": "iteration", "repetitions": 3, "repetition_index": 0, "threads": 1,
        "iterations": 1000, "real_time": 215.0, "cpu_time": 213.6, "time_unit": "ns",
        "bytes_per_second": 1.2e9},
       ...,
       {"name": "BM_copy/64/repeats:3_median", "run_name": "BM_copy/64/repeats:3",
        "run_type": "aggregate", "aggregate_name": "median", "aggregate_unit": "time",
        "real_time": 214.9, "cpu_time": 213.5, "time_unit": "ns", ...}]}

Which rows are runs:
- a run name with aggregates (`--benchmark_repetitions`): ONE run, read from its `median`
  aggregate (the latency median; primary statistic median; without a median, the mean), with
  its `mean` aggregate as the latency mean and every other aggregate (stddev, cv, user
  statistics), cpu_time and counter as a measurement under that statistic. Its iteration rows
  (the repetitions) are folded into it: they are counted as its samples and give no outcome of
  their own. The run's pointer is its representative aggregate's; its externalId is the run
  name every folded row carries.
- complexity aggregates (`BigO`, `RMS`) of a run name are one run of their own, measurements only.
- any other iteration row is a run: `real_time` is the mean time of one iteration over
  `iterations` (primary statistic mean, samples = iterations).
- a row with `error_occurred` is a run with status runtime_error and no timing (its
  `error_message` as the label `error_message`); a row skipped with a message (`skipped`) is a
  quarantine row with reason `skipped_state`.

`real_time` is wall-clock time unless the benchmark reports manual time (`/manual_time` in
its name: timed by the program itself, e.g. with CUDA events). Integer arguments of the name
(`/64`, `/m:64`, `/threads:4`) are the case's sizes; other parts are run labels, and the
non-numeric arguments (not harness settings such as `repeats:`) are the run's mode. The file
names no GPU unless the program added one as a custom context key (`gpu`, `gpu_name`, `device`,
...); without one the run is a CPU benchmark. It names no project, no operation beyond the
function name, no dtypes, and no units for user counters; `date` is the local time of the
machine, with its offset only in newer versions (without one it is read as UTC).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from pipelines.records.rules import DURATION_NS, NAME_LIMIT, UNSPECIFIED, Reason
from pipelines.sources.json_input import (
    Marks,
    defect,
    raw_text,
)
from pipelines.sources.measured import (
    Entry,
    Environment,
    Implementation,
    Measurement,
    Observation,
    ObservationError,
    Operation,
    Project,
    Protocol,
    number,
    observe,
    quarantined,
    to_ns,
    utc_instant,
)
from pipelines.sources.source import HarnessSource, SourceContext

SOURCE = "google-benchmark"
REPOSITORY = "https://github.com/google/benchmark"
_OPENING = re.compile(r'\{\s*"context"\s*:\s*\{')
_CONTEXT_KEY = re.compile(r'"(?:num_cpus|mhz_per_cpu|cpu_scaling_enabled|library_build_type)"\s*:')

PROJECT = Project(UNSPECIFIED)  # the program's code is not named by the file

# Keys of a row that are not user counters.
_RESERVED = frozenset(
    {
        "name",
        "run_name",
        "run_type",
        "family_index",
        "per_family_instance_index",
        "repetitions",
        "repetition_index",
        "threads",
        "aggregate_name",
        "aggregate_unit",
        "error_occurred",
        "error_message",
        "skipped",
        "skip_message",
        "iterations",
        "real_time",
        "cpu_time",
        "time_unit",
        "label",
        "cpu_coefficient",
        "real_coefficient",
        "big_o",
        "rms",
    }
)
# Memory-manager results: (metric, unit, statistic).
_MEMORY = {
    "allocs_per_iter": ("allocations", "count", "mean"),
    "max_bytes_used": ("memory_used", "bytes", "maximum"),
    "total_allocated_bytes": ("memory_allocated", "bytes", "total"),
    "net_heap_growth": ("heap_growth", "bytes", "value"),
    "memory_iterations": ("memory_iterations", "count", "count"),
}
# Counters Google Benchmark names itself (SetBytesProcessed, SetItemsProcessed).
_COUNTER_UNITS = {"bytes_per_second": "bytes_per_second", "items_per_second": "items_per_second"}
_COMPLEXITY = ("BigO", "RMS")
_AGGREGATE_ORDER = {"median": 0, "mean": 1, "stddev": 2, "cv": 3}
_STATISTICS = {"stddev": "stdev", "min": "minimum", "max": "maximum"}
# Name parts that are settings of the harness, not sizes of the case.
_SETTINGS = frozenset({"repeats", "iterations", "min_time", "min_warmup_time"})
_TIMERS = frozenset({"real_time", "manual_time", "process_time"})

# Custom context keys (AddCustomContext, `--benchmark_context=k=v`) that name the GPU.
_GPU_KEYS = (
    "gpu",
    "gpu_name",
    "gpu_model",
    "gpu_device",
    "device",
    "device_name",
    "cuda_device",
    "cuda_device_name",
)
_NOT_A_GPU_NAME = re.compile(r"^(?:cpu|cuda|gpu|none|n/a|)(?::?\d+)?$", re.IGNORECASE)
_ARCH_KEYS = ("compute_capability", "cuda_arch", "gpu_arch", "sm", "sm_version", "architecture")
_ARCH = re.compile(r"^(?:sm_?(\d+[a-z]?)|(\d+)\.(\d))$", re.IGNORECASE)
_CUDA_KEYS = ("cuda_version", "cuda", "cuda_runtime_version", "cudart_version")
_DRIVER_KEYS = ("driver_version", "cuda_driver_version", "nvidia_driver", "driver")


MARKS = Marks.of(
    ('"context"\\s*:\\s*\\{', "no context object"),
    ('"(?:num_cpus|library_build_type)"\\s*:', "no context with num_cpus or library_build_type"),
    ('"benchmarks"\\s*:\\s*\\[', "no benchmarks list"),
    (
        '"(?:real_time|cpu_time|time_unit)"\\s*:',
        "no benchmark with real_time, cpu_time or time_unit",
    ),
)


class GoogleBenchmarkJson(HarnessSource):
    name = "google-benchmark-json"
    format_version = "kindex-gbench/2"

    title = "Google Benchmark JSON"
    marks = MARKS
    shape = "not a JSON object with a context"

    def shows(self, head: str) -> bool:
        return bool(_OPENING.match(head) and _CONTEXT_KEY.search(head))

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        document = self.json_object(data, listing="benchmarks")
        header = document.get("context")
        header = header if isinstance(header, dict) else {}
        rows = document["benchmarks"]
        outcomes: dict[int, list[Entry]] = {}
        clean: list[_Row] = []
        names = {r.get("name") for r in rows if isinstance(r, dict)}
        for i, row in enumerate(rows):
            pointer = f"/benchmarks/{i}"
            line = getattr(row, "line", None) or 1
            problem = defect(row)
            if not isinstance(row, dict) or problem is not None:
                reason, detail = problem or (
                    Reason.MALFORMED_RECORD,
                    "a benchmark row is an object",
                )
                outcomes[i] = [quarantined(line, pointer, raw_text(row), reason, detail)]
                continue
            try:
                clean.append(_Row.of(i, row, names))
            except ObservationError as error:
                outcomes[i] = [
                    quarantined(line, pointer, raw_text(row), error.reason, error.detail)
                ]
        clean = _repetitions_numbered(clean)
        file: _File | ObservationError
        try:
            file = _File.of(header, context)
        except ObservationError as error:
            file = error
        for group in _groups(clean):
            i = group.representative.index
            outcomes[i] = observe(
                group.representative.row,
                group.representative.line,
                f"/benchmarks/{i}",
                partial(_group_observation, file, group),
            )
        for i in sorted(outcomes):
            yield from outcomes[i]


@dataclass(frozen=True, slots=True)
class _Row:
    """One row of benchmarks[], classified."""

    index: int
    row: Mapping[str, Any]
    line: int
    name: str
    run_name: str
    aggregate: str | None  # the aggregate's name; None for an iteration row
    # Files before repetition_index (before v1.5) wrote each repetition as a row of the same
    # name: its place among them (from 0), when its name repeats; None otherwise.
    repetition: int | None = None

    @classmethod
    def of(cls, index: int, row: Mapping[str, Any], names: set[Any]) -> _Row:
        name = row.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ObservationError(Reason.MISSING_FIELD, "the row has no name")
        aggregate = row.get("aggregate_name")
        run_name = row.get("run_name")
        if row.get("run_type") == "aggregate" or aggregate is not None:
            suffix = re.fullmatch(r"(.+)_(mean|median|stddev|cv)", name)
            if aggregate is None and suffix:  # run_type came a release before aggregate_name
                aggregate = suffix.group(2)
            if aggregate is None:  # an aggregate that names no statistic: its numbers stay,
                aggregate = UNSPECIFIED  # under no statistic
            if not isinstance(aggregate, str) or not aggregate:
                raise ObservationError(Reason.BAD_VALUE, f"aggregate_name is {aggregate!r}")
        elif row.get("run_type") is None:  # files before run_type: `BM_x/repeats:3_mean`
            old = re.fullmatch(r"(.+)_(mean|median|stddev|cv)", name)
            if old and ("repeats:" in old.group(1) or old.group(1) in names):
                aggregate, run_name = old.group(2), run_name or old.group(1)
        if not isinstance(run_name, str) or not run_name:
            run_name = name
            if aggregate and name.endswith(f"_{aggregate}"):
                run_name = name[: -len(aggregate) - 1]
        line = getattr(row, "line", None) or 1
        return cls(index, row, line, name, run_name, aggregate)


def _repetitions_numbered(rows: list[_Row]) -> list[_Row]:
    """Iteration rows of one name, without repetition_index (before v1.5): each is one
    repetition, numbered in file order."""
    unnumbered = [r for r in rows if r.aggregate is None and "repetition_index" not in r.row]
    counts = Counter(r.name for r in unnumbered)
    seen: Counter[str] = Counter()
    numbered = []
    for row in rows:
        if row.aggregate is None and "repetition_index" not in row.row and counts[row.name] > 1:
            row = replace(row, repetition=seen[row.name])
            seen[row.name] += 1
        numbered.append(row)
    return numbered


@dataclass(slots=True)
class _Group:
    """The rows that make one run: its representative row first."""

    kind: str  # "iteration", "aggregates", "complexity"
    run_name: str
    rows: list[_Row] = field(default_factory=list)
    folded: int = 0  # iteration rows counted into the aggregates' run

    @property
    def representative(self) -> _Row:
        return self.rows[0]


def _groups(rows: list[_Row]) -> list[_Group]:
    aggregates: dict[str, _Group] = {}
    complexity: dict[str, _Group] = {}
    for row in rows:
        if row.aggregate is None or _failed(row.row):
            continue
        target, kind = (
            (complexity, "complexity")
            if row.aggregate in _COMPLEXITY
            else (aggregates, "aggregates")
        )
        target.setdefault(row.run_name, _Group(kind, row.run_name)).rows.append(row)
    result: list[_Group] = []
    for group in aggregates.values():
        # The median first (the run's representative), then the others in an order of their
        # own, so that a run does not depend on the order of its rows.
        group.rows.sort(key=lambda r: (_AGGREGATE_ORDER.get(r.aggregate or "", 9), r.name))
        result.append(group)
    for group in complexity.values():
        group.rows.sort(key=lambda r: r.aggregate != "BigO")
        result.append(group)
    # aggregates that name one statistic twice contradict each other (quarantined): a
    # repetition is not folded into them, but stays a run of its own
    contradicted = {
        run
        for run, group in aggregates.items()
        if len({r.aggregate for r in group.rows}) < len(group.rows)
    }
    for row in rows:
        if row.aggregate is not None and not _failed(row.row):
            continue
        folding = row.run_name in aggregates and row.run_name not in contradicted
        if not _failed(row.row) and folding:
            aggregates[row.run_name].folded += 1
            continue
        result.append(_Group("iteration", row.run_name, [row]))
    return result


def _failed(row: Mapping[str, Any]) -> bool:
    return row.get("error_occurred") is True or row.get("skipped") is True


@dataclass(frozen=True, slots=True)
class _File:
    """What the context says for every run."""

    observed_at: str
    program: str
    environment: Environment
    version: str | None
    notes: str

    @classmethod
    def of(cls, header: Mapping[str, Any], context: SourceContext) -> _File:
        date = header.get("date")
        if isinstance(date, str) and date.strip():
            observed_at = utc_instant(date)
        else:
            received = context.received_time()
            if received is None:
                raise ObservationError(Reason.MISSING_FIELD, "no time: the context has no date")
            observed_at = utc_instant(received)
        executable = header.get("executable")
        program = UNSPECIFIED
        if isinstance(executable, str) and executable.strip():
            program = re.split(r"[\\/]", executable.strip())[-1] or UNSPECIFIED
        version = header.get("library_version")
        notes = [
            "Google Benchmark: each repetition runs the function for `iterations` iterations and "
            "reports the mean time of one; aggregates summarize the repetitions."
        ]
        build = header.get("library_build_type")
        if isinstance(build, str) and build:
            notes.append(f"Library build type: {build}.")
        if header.get("cpu_scaling_enabled") is True:
            notes.append("CPU frequency scaling was enabled.")
        return cls(
            observed_at=observed_at,
            program=program,
            environment=_environment(header),
            version=version if isinstance(version, str) and version else None,
            notes=" ".join(notes),
        )


def _custom(header: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    lowered = {k.lower(): v for k, v in header.items() if isinstance(k, str)}
    for key in keys:
        value = lowered.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _environment(header: Mapping[str, Any]) -> Environment:
    gpu = _custom(header, _GPU_KEYS)
    if gpu is None or _NOT_A_GPU_NAME.match(gpu):
        return Environment(gpu=None)
    architecture = None
    arch = _custom(header, _ARCH_KEYS)
    match = _ARCH.match(arch) if arch else None
    if match:
        architecture = f"sm_{match.group(1) or match.group(2) + match.group(3)}".lower()
    return Environment(
        gpu=gpu,
        architecture=architecture,
        cuda=_custom(header, _CUDA_KEYS),
        driver=_custom(header, _DRIVER_KEYS),
    )


# --- one run ------------------------------------------------------------------------------


def _group_observation(file: _File | ObservationError, group: _Group, row: Any) -> Observation:
    return _observation(file, group)


def _observation(file: _File | ObservationError, group: _Group) -> Observation:
    if isinstance(file, ObservationError):
        raise file
    row = group.representative
    if row.row.get("skipped") is True:
        message = row.row.get("skip_message")
        raise ObservationError(Reason.SKIPPED_STATE, str(message) if message else "skipped")
    family, axes, parameters, timer, mode = _case(group.run_name)
    labels: dict[str, str] = {}
    label = row.row.get("label")
    if isinstance(label, str) and label:
        labels["label"] = label
    status: Any = "passed"
    if row.row.get("error_occurred") is True:
        status, facts, primary = "runtime_error", _Facts(), "mean"
        message = row.row.get("error_message")
        labels["error_message"] = str(message) if message else "error"
    elif group.kind == "iteration":
        facts = _iteration(row)
        primary = "mean"
    elif group.kind == "aggregates":
        facts = _aggregates(group)
        primary = "median" if "median" in facts.latency else "mean"
        if not facts.latency:
            primary = _statistic(row.aggregate or "value")
    else:
        facts = _complexity(group, labels)
        primary = "coefficient"
    external_id = group.run_name
    if group.kind == "iteration":
        external_id = row.name
        repetitions, index = row.row.get("repetitions"), row.row.get("repetition_index")
        if isinstance(repetitions, int) and repetitions > 1 and isinstance(index, int):
            external_id = f"{row.name}#repetition:{index}"
        elif row.repetition is not None:
            external_id = f"{row.name}#repetition:{row.repetition}"
    elif group.kind == "complexity":
        external_id = f"{group.run_name}_BigO"
    if status == "passed" and not facts.latency and not facts.measurements:
        raise ObservationError(Reason.MISSING_FIELD, "the row has no time or counter")
    return Observation(
        source=SOURCE,
        external_id=external_id,
        operation=Operation(name=family, family=family, title=family),
        workload_axes=axes,
        implementation=Implementation(file.program, PROJECT, language="cpp"),
        protocol=Protocol(
            harness="google-benchmark",
            harness_version=file.version,
            repository=REPOSITORY,
            timer=timer,
            primary_statistic=primary,
            family="google_benchmark_complexity"
            if group.kind == "complexity"
            else "google_benchmark",
            notes=file.notes,
        ),
        environment=file.environment,
        observed_at=file.observed_at,
        status=status,
        latency_ns=facts.latency,
        samples=facts.samples,
        measurements=tuple(facts.measurements),
        benchmark=family,
        mode=mode,
        parameters=parameters,
        labels=labels,
    )


@dataclass(slots=True)
class _Facts:
    latency: dict[str, int] = field(default_factory=dict)
    samples: int | None = None
    measurements: list[Measurement] = field(default_factory=list)


def _time_unit(row: Mapping[str, Any]) -> str:
    unit = row.get("time_unit", "ns")
    if unit not in DURATION_NS:
        raise ObservationError(Reason.UNKNOWN_UNIT, f"time_unit {unit!r}")
    return str(unit)


def _iteration(row: _Row) -> _Facts:
    unit = _time_unit(row.row)
    facts = _Facts()
    if "real_time" in row.row:
        facts.latency["mean"] = to_ns(number(row.row["real_time"], "real_time"), unit)
    iterations = row.row.get("iterations")
    if isinstance(iterations, int) and not isinstance(iterations, bool) and iterations > 0:
        facts.samples = iterations
    if "cpu_time" in row.row:
        cpu = to_ns(number(row.row["cpu_time"], "cpu_time"), unit)
        facts.measurements.append(Measurement("cpu_time", "ns", "mean", cpu, facts.samples))
    facts.measurements += _counters(row.row, "value", fraction=False)
    return facts


def _aggregates(group: _Group) -> _Facts:
    facts = _Facts()
    representative = group.representative.row
    repetitions = representative.get("repetitions")
    if group.folded:
        facts.samples = group.folded
    elif isinstance(repetitions, int) and not isinstance(repetitions, bool) and repetitions > 0:
        facts.samples = repetitions
    seen: set[str] = set()
    for row in group.rows:
        name = row.aggregate or "value"
        if name in seen:
            raise ObservationError(Reason.DUPLICATE_AGGREGATE, f"aggregate {name!r} appears twice")
        seen.add(name)
        statistic = _statistic(name)
        fraction = row.row.get("aggregate_unit") == "percentage"
        unit = _time_unit(row.row)
        for key, metric in (("real_time", "real_time"), ("cpu_time", "cpu_time")):
            if key not in row.row:
                continue
            value = number(row.row[key], f"{row.name} {key}")
            if fraction:
                facts.measurements.append(
                    Measurement(metric, "fraction", statistic, value, facts.samples)
                )
            elif key == "real_time" and statistic in ("median", "mean"):
                facts.latency[statistic] = to_ns(value, unit)
            else:
                ns = to_ns(value, unit)
                facts.measurements.append(Measurement(metric, "ns", statistic, ns, facts.samples))
        facts.measurements += _counters(row.row, statistic, fraction=fraction)
    return facts


def _complexity(group: _Group, labels: dict[str, str]) -> _Facts:
    facts = _Facts()
    for row in group.rows:
        if row.aggregate == "BigO":
            factor = DURATION_NS[_time_unit(row.row)]
            for key in ("real_coefficient", "cpu_coefficient"):
                if key in row.row:
                    value = number(row.row[key], key) * factor
                    metric = key.replace("_coefficient", "_time")
                    facts.measurements.append(Measurement(metric, "ns", "coefficient", value))
            big_o = row.row.get("big_o")
            if isinstance(big_o, str) and big_o:
                labels["big_o"] = big_o
        elif "rms" in row.row:
            rms = number(row.row["rms"], "rms")
            facts.measurements.append(Measurement("fit_error", "fraction", "rms", rms))
        facts.measurements += _counters(row.row, _statistic(row.aggregate or "value"), False)
    return facts


def _counters(row: Mapping[str, Any], statistic: str, fraction: bool) -> list[Measurement]:
    """User counters (any other numeric key) and memory results, as measurements."""
    measurements = []
    for key, value in row.items():
        if key in _RESERVED or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if key in _MEMORY:
            metric, unit, own = _MEMORY[key]
            stat = own if statistic == "value" else statistic
        else:
            metric, stat = key, statistic
            unit = _COUNTER_UNITS.get(key, UNSPECIFIED)
        if fraction:
            unit = "fraction"
        measurements.append(Measurement(metric, unit, stat, number(value, key)))
    return measurements


def _statistic(aggregate: str) -> str:
    return _STATISTICS.get(aggregate, aggregate)


def _case(run_name: str) -> tuple[str, dict[str, int], dict[str, str], str, str | None]:
    """A run name's function (the operation), its integer arguments (the case's sizes), its
    other settings (run labels), its timer, and its mode (the arguments that are not numbers,
    which tell its series apart: the case key holds only integer arguments):
    `BM_copy<float>/64/m:8/threads:2/manual_time`."""
    family, *parts = run_name.split("/")
    axes: dict[str, int] = {}
    parameters: dict[str, str] = {}
    timer = "wall_clock"
    position = 0
    variant = []
    for part in parts:
        if part in _TIMERS:
            if part == "manual_time":
                timer = "manual"
            parameters[part] = "true"
            continue
        key, sep, value = part.partition(":")
        if not sep:
            key, value = f"arg{position}", part
            position += 1
        if key not in _SETTINGS and re.fullmatch(r"\d+", value) and len(value) < 16:
            axes[key] = int(value)
        else:
            parameters[key] = value
            if key not in _SETTINGS:
                variant.append(part)
    return family or run_name, axes, parameters, timer, "/".join(variant)[:NAME_LIMIT] or None
