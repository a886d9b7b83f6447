"""nvbench JSON (`--json FILE`, written by `nvbench/json_printer.cu` in NVIDIA/nvbench): every
state (one benchmark at one point of its axes, on one device) that a CUDA benchmark program
measured.

    {"meta": {"argv": ["bin/nvbench.example.axes", "--json", "out.json"],
              "version": {"json": {"string": "1.0.0"},
                          "nvbench": {"string": "0.1.0", "git_sha": "348acbd6...", ...}}},
     "devices": [{"id": 0, "name": "Quadro GV100", "sm_version": 700,
                  "global_memory_size": 34086060032, ...}],
     "benchmarks": [{"name": "copy_sweep_grid_shape", "axes": [{"name": "BlockSize",
        "type": "int64", "flags": "pow2", "values": [...]}, ...],
        "states": [{"name": "Device=0 BlockSize=2^6 NumBlocks=2^6", "device": 0,
          "axis_values": [{"name": "BlockSize", "type": "int64", "value": "64"}, ...],
          "summaries": [{"tag": "nv/cold/time/gpu/mean", "hint": "duration",
                         "data": [{"name": "value", "type": "float64", "value": "1.0e-3"}]},
                        ...],
          "is_skipped": false}]}]}

One run per measured state; a skipped state (`is_skipped`, with its `skip_reason`) is a
quarantine row with reason `skipped_state`. Summary values are strings; durations are seconds.
The primary number is nvbench's "GPU Time", `nv/cold/time/gpu/mean`: the mean of isolated
("cold") executions timed with CUDA events. Integer axes are the case's sizes; float, string and
type axes (`In=I8`: written as strings) are run labels. Every other summary with a value is a
measurement.

The file records no time, nor which project's code the program benchmarks (only the program,
`meta.argv[0]`), nor the CUDA toolkit or driver.

Every layout `json_printer.cu` has written is read:
- 2022 on (JSON 1.0, above): states a list, summaries a list of {tag, hint, data}.
- June 2021 (commits 0491e9c..668a98e): states an object keyed by the state's name, summaries an
  object keyed by their display name, each value `{name: {type, value}}` (values as strings,
  or, before 668a98e, as numbers); axis values an object too. No `meta`.
- March 2021 (b1269b2): states a list, summaries a list of {index, name, values: [{name, type,
  value}]}: a display name and no tag.
A 2021 summary's display name is read as the tag nvbench renamed it to in January 2022
(commit 6dee1ee, `TAG_OF_NAME`): `Average GPU Time (Cold)` is `nv/cold/time/gpu/mean`, so a
2021 state's latency is the same GPU time a 1.0 file states. A name that commit did not rename
is a measurement under its display name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

from pipelines.records.rules import UNSPECIFIED, Reason
from pipelines.sources.json_input import (
    Marks,
    defect,
    escape,
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
    to_ns,
    utc_instant,
)
from pipelines.sources.source import HarnessSource, SourceContext

SOURCE = "nvbench"
REPOSITORY = "https://github.com/NVIDIA/nvbench"
# A device list (`sm_version` beside `ptx_version`), a summary tag, or nvbench's version block.
_SNIFF = re.compile(
    r'"sm_version"\s*:\s*\d+\s*,\s*"ptx_version"'
    r'|"tag"\s*:\s*"nv/'
    r'|"nvbench"\s*:\s*\{[^{}]*"git_sha"'
)

# The program's code is not named by the file: its project is unknown.
PROJECT = Project(UNSPECIFIED)
PROTOCOL_NOTES = (
    "nvbench cold measurement: each sample is one isolated kernel execution timed with CUDA "
    "events (nvbench flushes the L2 cache before each by default; the file does not say whether "
    "a benchmark disabled it), repeated until min_samples and min_time are met and the relative "
    "standard deviation is below max_noise, or the timeout passes. Latency is the mean."
)

# `nv/cold/time/gpu/<statistic>`: the run's latency (seconds), by kernelindex statistic.
_LATENCY_TAGS = {
    "nv/cold/time/gpu/mean": "mean",
    "nv/cold/time/gpu/median": "median",
    "nv/cold/time/gpu/min": "minimum",
    "nv/cold/time/gpu/max": "maximum",
}
SAMPLES_TAG = "nv/cold/sample_size"

# The display names 2021's nvbench keyed summaries by → the tag each became in January 2022
# (NVIDIA/nvbench 6dee1ee, "Refactor summary API": measure_cold.cu, measure_hot.cu, state.cu).
TAG_OF_NAME = {
    "Number of Samples (Cold)": "nv/cold/sample_size",
    "Average CPU Time (Cold)": "nv/cold/time/cpu/mean",
    "CPU Relative Standard Deviation (Cold)": "nv/cold/time/cpu/stdev/relative",
    "Average GPU Time (Cold)": "nv/cold/time/gpu/mean",
    "GPU Relative Standard Deviation (Cold)": "nv/cold/time/gpu/stdev/relative",
    "Element Throughput": "nv/cold/bw/item_rate",
    "Average Global Memory Throughput": "nv/cold/bw/global/bytes_per_second",
    "Percent Peak Global Memory Throughput": "nv/cold/bw/global/utilization",
    "Number of Samples (Batch)": "nv/batch/sample_size",
    "Average GPU Time (Batch)": "nv/batch/time/gpu/mean",
}
# A 2021 name made of a prefix and a column name (`Element count: Items`) → the 2022 tag prefix.
TAG_PREFIX_OF_NAME = {"Element count: ": "nv/element_count/"}

# A tag's last parts that name a statistic, and the statistic's name in a measurement.
_STATISTIC_SUFFIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("stdev", "relative"), "stdev_relative"),
    (("stdev", "absolute"), "stdev"),
    (("ir", "relative"), "iqr_relative"),
    (("ir", "absolute"), "iqr"),
    (("mean",), "mean"),
    (("median",), "median"),
    (("min",), "minimum"),
    (("max",), "maximum"),
)
# A summary's hint → the unit of its measurement (durations are converted from s to ns).
_UNITS = {
    "duration": "ns",
    "percentage": "fraction",  # nvbench writes 0.005 for 0.5 %
    "sample_size": "count",
    "item_rate": "items_per_second",
    "byte_rate": "bytes_per_second",
    "bytes": "bytes",
}


MARKS = Marks.of(
    ('"benchmarks"\\s*:\\s*\\[', "no benchmarks list"),
    (
        '"sm_version"\\s*:\\s*\\d+\\s*,\\s*"ptx_version"|"tag"\\s*:\\s*"nv/|"nvbench"\\s*:\\s*\\{[^{}]*"git_sha"',
        "no devices with sm_version, nv/ summary tags nor nvbench version",
    ),
    ('"states"\\s*:', "no states"),
    ('"summaries"\\s*:', "no summaries"),
)


class NvbenchJson(HarnessSource):
    name = "nvbench-json"
    format_version = "kindex-nvbench/2"

    title = "nvbench JSON"
    marks = MARKS
    shape = "not a JSON object with benchmarks"

    def shows(self, head: str) -> bool:
        return head.startswith("{") and '"benchmarks"' in head and bool(_SNIFF.search(head))

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        document = self.json_object(data, listing="benchmarks")
        header = _Header.of(document)
        yield from self._entries(document, header, context)

    def _entries(
        self, document: Mapping[str, Any], header: _Header, context: SourceContext
    ) -> Iterator[Entry]:
        for b, bench in enumerate(document["benchmarks"]):
            pointer = f"/benchmarks/{b}"
            line = getattr(bench, "line", None) or 1
            states = bench.get("states") if isinstance(bench, dict) else None
            if not isinstance(states, list | dict) or not states:
                yield from observe(bench, line, pointer, _no_states)
                continue
            # 2021: states keyed by their name; later, a list whose states name themselves.
            named = states.items() if isinstance(states, dict) else enumerate(states)
            for s, state in named:
                key = s if isinstance(s, str) else None
                yield from observe(
                    state,
                    getattr(state, "line", None) or line,
                    f"{pointer}/states/{escape(s)}",
                    partial(_state_entry, header, bench, key=key, context=context),
                )


def _no_states(bench: Any) -> Entry:
    """A benchmark with no states measured nothing (a `--list` file, or all filtered out)."""
    if not isinstance(bench, dict):
        raise ObservationError(Reason.MALFORMED_RECORD, "a benchmark is an object")
    raise ObservationError(Reason.NO_STATES, "the benchmark lists no measured states")


class _Header:
    """What the file says once for every state: the program, nvbench's version, the devices."""

    def __init__(
        self, program: str, version: str | None, commit: str | None, dirty: bool, devices: Any
    ) -> None:
        self.program = program
        self.version = version
        self.commit = commit
        self.dirty = dirty
        self.devices = devices

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> _Header:
        meta = document.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        argv = meta.get("argv")
        program = UNSPECIFIED
        if isinstance(argv, list) and argv and isinstance(argv[0], str) and argv[0].strip():
            program = re.split(r"[\\/]", argv[0].strip())[-1] or UNSPECIFIED
        versions = meta.get("version")
        nvbench = versions.get("nvbench") if isinstance(versions, dict) else None
        nvbench = nvbench if isinstance(nvbench, dict) else {}
        version = nvbench.get("string")
        commit = nvbench.get("git_sha")
        return cls(
            program=program,
            version=version if isinstance(version, str) and version else None,
            commit=commit.lower() if isinstance(commit, str) else None,
            dirty=nvbench.get("git_is_dirty") is True,
            devices=document.get("devices"),
        )

    def device(self, device_id: Any) -> Mapping[str, Any]:
        if isinstance(self.devices, list):
            for device in self.devices:
                if isinstance(device, dict) and device.get("id") == device_id:
                    problem = defect(device)
                    if problem is not None:
                        raise ObservationError(problem[0], f"device {device_id}: {problem[1]}")
                    return device
        raise ObservationError(Reason.MISSING_FIELD, f"device {device_id!r} is not in devices[]")


def _state_entry(
    header: _Header,
    bench: Mapping[str, Any],
    state: Any,
    *,
    key: str | None,
    context: SourceContext,
) -> Entry:
    if not isinstance(state, dict):
        raise ObservationError(Reason.MALFORMED_RECORD, "a state is an object")
    if state.get("is_skipped") is True:
        reason = state.get("skip_reason")
        raise ObservationError(
            Reason.SKIPPED_STATE, str(reason) if reason else "skipped (no reason)"
        )
    return _observation(header, bench, state, key, context)


def _observation(
    header: _Header,
    bench: Mapping[str, Any],
    state: Mapping[str, Any],
    key: str | None,
    context: SourceContext,
) -> Observation:
    bench_name = bench.get("name")
    if not isinstance(bench_name, str) or not bench_name.strip():
        raise ObservationError(Reason.MISSING_FIELD, "the benchmark has no name")
    device = header.device(state.get("device"))
    received = context.received_time()
    if received is None:
        raise ObservationError(Reason.MISSING_FIELD, "no time: the file records none")
    axes, parameters = _case(state.get("axis_values"))
    latency: dict[str, int] = {}
    samples: int | None = None
    measurements: list[Measurement] = []
    for tag, hint, values in _summaries(state.get("summaries")):
        if "value" not in values:
            continue  # a summary that points elsewhere (a file of sample times)
        kind, raw = values["value"]
        if kind == "string" or raw is None:
            continue  # a label, or a value JSON could not hold (older files write null)
        if tag in _LATENCY_TAGS:
            latency[_LATENCY_TAGS[tag]] = to_ns(number(raw, tag), "s")
        elif tag == SAMPLES_TAG:
            samples = _count(raw, tag)
        else:
            measurement = _measurement(tag, hint, kind, raw)
            if measurement is not None:
                measurements.append(measurement)
    if not latency:  # the run's number is its first measurement: a duration if it has one
        if samples:
            measurements.append(Measurement("cold_sample_size", "count", "count", samples))
        if not measurements:
            raise ObservationError(Reason.MISSING_FIELD, "the state has no summary with a value")
        measurements.sort(key=lambda m: m.unit != "ns")
    state_name = state.get("name") or key or state.get("description") or _state_name(state)
    return Observation(
        source=SOURCE,
        external_id=f"{bench_name}/{state_name}",
        operation=Operation(
            name=bench_name,
            family=bench_name,
            title=bench_name,
            axes=_integer_axes(bench.get("axes")),
        ),
        workload_axes=axes,
        implementation=Implementation(header.program, PROJECT, language="cuda"),
        protocol=_protocol(header, state, timed=bool(latency)),
        environment=_environment(device),
        observed_at=utc_instant(received),
        latency_ns=latency,
        samples=samples if samples else None,
        measurements=tuple(measurements),
        benchmark=bench_name,
        parameters=parameters,
    )


def _summaries(summaries: Any) -> Iterator[tuple[str, str | None, dict[str, tuple[str, Any]]]]:
    """Each summary as (tag, hint, {value name: (type, value)}), in every layout: a list of
    {tag, hint, data: [{name, type, value}]} (1.0), a list of {name, values: [...]} (March
    2021), or an object keyed by display name whose body is {name: {type, value}} (June 2021)
    or {values: [...]}. A display name is read as the tag nvbench gave it later."""
    listed: list[tuple[str, str | None, Any]] = []
    if isinstance(summaries, dict):
        for name, body in summaries.items():
            if not isinstance(body, dict):
                raise ObservationError(
                    Reason.MALFORMED_RECORD, f"summary {name!r} is not an object"
                )
            listed.append((_tag_of(name), None, _named_values(body)))
    elif isinstance(summaries, list):
        for summary in summaries:
            if not isinstance(summary, dict):
                raise ObservationError(Reason.MALFORMED_RECORD, "a summary is not an object")
            tag, name = summary.get("tag"), summary.get("name")
            if isinstance(tag, str):
                hint = summary.get("hint")
                listed.append((tag, hint if isinstance(hint, str) else None, summary.get("data")))
            elif isinstance(name, str) and "values" in summary:
                listed.append((_tag_of(name), None, summary.get("values")))
            else:
                raise ObservationError(
                    Reason.MALFORMED_RECORD, "a summary has neither tag nor name"
                )
    elif summaries is None:
        return
    else:
        raise ObservationError(Reason.MALFORMED_RECORD, "summaries is neither a list nor an object")
    for tag, hint, data in listed:
        values: dict[str, tuple[str, Any]] = {}
        for item in data if isinstance(data, list) else []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                values[item["name"]] = (str(item.get("type")), item.get("value"))
        if hint is None and "hint" in values and isinstance(values["hint"][1], str):
            hint = values["hint"][1]
        yield tag, hint, values


def _tag_of(name: str) -> str:
    """A summary's tag: a 2021 display name as nvbench renamed it, any other key as it is."""
    if name in TAG_OF_NAME:
        return TAG_OF_NAME[name]
    for prefix, tag in TAG_PREFIX_OF_NAME.items():
        if name.startswith(prefix):
            return tag + name.removeprefix(prefix)
    return name


def _named_values(body: Mapping[str, Any]) -> Any:
    """A June 2021 summary's values, {name: {type, value}}, as the list the others hold."""
    if isinstance(body.get("values"), list):
        return body["values"]
    return [{"name": k, **v} for k, v in body.items() if isinstance(v, dict)]


def _measurement(tag: str, hint: str | None, kind: str, raw: Any) -> Measurement | None:
    parts = tag.split("/")
    if parts[0] == "nv" and len(parts) > 1:
        parts = parts[1:]
    statistic = "value"
    for suffix, name in _STATISTIC_SUFFIXES:
        if len(parts) > len(suffix) and tuple(parts[-len(suffix) :]) == suffix:
            parts, statistic = parts[: -len(suffix)], name
            break
    if hint == "sample_size":
        statistic = "count"
    elif parts[-1] == "walltime":
        statistic = "total"
    try:
        value = number(raw, tag)
    except ObservationError as error:
        if error.reason == Reason.NON_FINITE_NUMBER:
            return None  # nvbench writes "nan"/"inf" noise for too few samples: no number
        raise
    unit = _UNITS.get(hint or "") or (key_of_hint(hint) if hint else None)
    if unit is None:
        unit = "count" if kind == "int64" else UNSPECIFIED
    if unit == "ns":
        value = to_ns(value, "s")
    elif kind == "int64" and value.is_integer():
        value = int(value)  # a count stays a whole number
    return Measurement("_".join(parts), unit, statistic, value)


def key_of_hint(hint: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", hint.lower()).strip("_") or UNSPECIFIED


def _count(raw: Any, what: str) -> int:
    value = number(raw, what)
    if not value.is_integer():
        raise ObservationError(Reason.BAD_VALUE, f"{what} is {raw!r}, not a count")
    return int(value)


def _case(axis_values: Any) -> tuple[dict[str, int], dict[str, str]]:
    """A state's axis values: integer ones are the case's sizes, the others run labels."""
    axes: dict[str, int] = {}
    parameters: dict[str, str] = {}
    if axis_values is None:
        return axes, parameters
    if isinstance(axis_values, dict):  # June 2021: {name: {type, value}}
        axis_values = [
            {"name": k, **v} if isinstance(v, dict) else v for k, v in axis_values.items()
        ]
    if not isinstance(axis_values, list):
        raise ObservationError(Reason.MALFORMED_RECORD, "axis_values is a list")
    for item in axis_values:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ObservationError(Reason.MALFORMED_RECORD, "an axis value has no name")
        name, kind, value = item["name"], item.get("type"), item.get("value")
        if kind == "int64":
            size = _count(value, f"axis {name}") if not _is_negative(value) else None
            if size is None:
                parameters[name] = str(value)
            else:
                axes[name] = size
        elif isinstance(value, str | int | float) and not isinstance(value, bool):
            parameters[name] = str(value)
        else:
            raise ObservationError(Reason.BAD_VALUE, f"axis {name} has value {value!r}")
    return axes, parameters


def _is_negative(value: Any) -> bool:
    return isinstance(value, str | int) and str(value).strip().startswith("-")


def _integer_axes(axes: Any) -> dict[str, int | None]:
    """The benchmark's int64 axes, each variable (a state picks its value)."""
    if isinstance(axes, dict):  # the older layout: {name: {type, values}}
        axes = [{"name": k, **v} for k, v in axes.items() if isinstance(v, dict)]
    if not isinstance(axes, list):
        return {}
    return {
        a["name"]: None
        for a in axes
        if isinstance(a, dict) and a.get("type") == "int64" and isinstance(a.get("name"), str)
    }


def _state_name(state: Mapping[str, Any]) -> str:
    values = state.get("axis_values")
    parts = [f"Device={state.get('device')}"]
    if isinstance(values, list):
        parts += [f"{v.get('name')}={v.get('value')}" for v in values if isinstance(v, dict)]
    return " ".join(parts)


def _protocol(header: _Header, state: Mapping[str, Any], timed: bool) -> Protocol:
    """How the state was measured; a state without a GPU time (a CPU-only benchmark) names no
    timer."""
    criteria = [
        f"{key}={state[key]}"
        for key in ("min_samples", "min_time", "max_noise", "skip_time", "timeout")
        if isinstance(state.get(key), int | float) and not isinstance(state.get(key), bool)
    ]
    notes = PROTOCOL_NOTES
    if criteria:
        notes += f" Stopping criteria: {', '.join(criteria)} (times in s)."
    if header.dirty:
        notes += " nvbench was built from a modified (dirty) tree."
    return Protocol(
        harness="nvbench",
        harness_version=header.version,
        repository=REPOSITORY,
        commit=header.commit,
        timer="cuda_events" if timed else UNSPECIFIED,
        primary_statistic="mean",
        family="nvbench_cold",
        notes=notes,
    )


def _environment(device: Mapping[str, Any]) -> Environment:
    name = device.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ObservationError(Reason.MISSING_FIELD, f"device {device.get('id')!r} has no name")
    sm = device.get("sm_version")
    architecture = None
    if isinstance(sm, int) and not isinstance(sm, bool) and sm > 0:
        architecture = f"sm_{sm // 10}"  # 700 → sm_70, 1000 → sm_100
    memory = device.get("global_memory_size")
    memory_bytes = memory if isinstance(memory, int) and not isinstance(memory, bool) else None
    return Environment(gpu=name, architecture=architecture, memory_bytes=memory_bytes or None)
