"""PyTorch OSS benchmark v3 records: what vLLM, TritonBench, torchao, ExecuTorch and PyTorch's
own CI upload to PyTorch's benchmark database (`.github/scripts/upload_benchmark_results.py` in
pytorch/test-infra; the table is `clickhouse_db_schema/benchmark.oss_ci_benchmark_v3`).

    [{"benchmark": {"name": "pr_time_benchmarks", "mode": "inference", "dtype": "bfloat16",
                    "extra_info": {"is_dynamic": false, "device": "cpu"}},
      "model": {"name": "add_loop_eager", "type": "add_loop", "backend": "eager"},
      "metric": {"name": "compile_time_instruction_count", "benchmark_values": [3086359081],
                 "target_value": 0, "extra_info": {}},
      "runners": [{"name": "...", "gpu_info": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
                   "extra_info": {"cuda_version": "12.8"}}],
      "dependencies": {"pytorch": {"repo": "pytorch/pytorch", "branch": "main",
                                   "sha": "0123...", "version": "2.9.0"}},
      "timestamp": 1754038800, "repo": "pytorch/pytorch", "head_sha": "0123..."}]

A file is a JSON array of records, one record, or JSON Lines of records or arrays of records
(as the uploader reads them). One run per record: each record holds ONE metric.

The metric's unit is read from its name by one rule (`metric_of`): a unit in parentheses
(`median_latency(ms)`, `memory_bandwidth(GB/s)`) is taken as written; otherwise a unit suffix
from `UNIT_SUFFIXES` (`latency_ms`, `p50_latency_us`, `tokens_per_second`,
`compile_time_instruction_count`), or a whole name from `UNIT_OF_NAME` (`speedup`, `tflops`);
otherwise `metric.extra_info.unit` where the producer states it. A name none of these gives a
unit is quarantined (`unknown_metric_unit`): a unit is never guessed. The statistic is the name's
first or last word when `STATISTIC_WORDS` has it (`median`, `mean`/`avg`, `p50` = median, `pNN`,
`min`, `max`, `std`), else `metric.extra_info.aggregation` (TritonBench's conversion writes
`p50`), else unstated (`unspecified`). Durations are stored in integer nanoseconds.

`benchmark_values` with ONE value is that statistic: a latency (a metric named `...latency...`)
whose statistic is median, mean, p05, p95, min or max becomes the run's `latencyNs`; every other
value is a measurement. SEVERAL values, whose name states no statistic, are samples (the table's
comment: "multiple runs"): the run holds their minimum, mean and maximum as measurements, each
with the sample count, computed here and named so; no harness-stated latency is made of them.
Several values for a name that states a statistic are quarantined (`ambiguous_values`): each
is that statistic of some repetition, and a statistic of statistics is not what the file says.

The device comes from `runners[0].gpu_info` (the GPU's name, curated by gpus.yaml), else from
`benchmark.extra_info.device`: `cpu` is no GPU, another device (`cuda`) names no GPU model, so
the environment's GPU is `unnamed <device> device` (never a guessed model; a CUDA device may be
NVIDIA's or, under ROCm, AMD's); a runner that lists no GPU, with no device stated, is no GPU;
a record with neither runners nor a device has an `unspecified` device. Only `runners[0]` is
read (its `gpu_count`, and `extra_info.cuda_version`). The record's time is `timestamp` (seconds
since the epoch, written by the uploader; 0, the table's default, is no time); a record without
one (a result file before upload, as the sample files are) takes the object's receipt time.

What was computed is `model.name` (its family too; `model.type` and the benchmark's name are
labels); the implementation is `model.backend`, in the project the uploader's `repo` names (the
repository whose CI ran the benchmark) at `head_sha`, its version that of the dependency of the
same repository; a record without `repo` names no project (`unspecified`). Integer settings in
`benchmark/model/metric.extra_info` are the case's sizes; other settings, `benchmark.dtype` and
the inputs' dtypes are run labels; `dependencies` are the environment's libraries (a version,
else `<name>_commit`), PyTorch's version its framework. The external id is the record's names
(benchmark, mode, dtype, model, backend, metric) and a digest of its extra_info settings; a
second record of one external id in a file is quarantined (`duplicate_external_id`, as in any
source). The records state no timer, warm-up or iteration count, nor shapes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.records import RowOutcome
from pipelines.records.rules import DURATION_NS, NAME_LIMIT, UNSPECIFIED, Reason, key_of
from pipelines.sources.json_input import (
    JsonInputError,
    Marks,
    is_json_lines,
    raw_text,
    read_document,
    read_lines,
)
from pipelines.sources.measured import (
    LATENCY_STATISTICS,
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

SOURCE = "pytorch-benchmark-v3"
FORMAT_REPOSITORY = "https://github.com/pytorch/test-infra"
_SNIFF_START = re.compile(r"^[\[{]")
_SNIFF_VALUES = re.compile(r'"benchmark_values"\s*:\s*\[|"metric"\s*:\s*\[\s*"[^"]*"\s*,\s*\[')
_SNIFF_BENCHMARK = re.compile(r'"(?:benchmark|model)"\s*:\s*[\{\[]')
# The table's tuples (clickhouse_db_schema/benchmark.oss_ci_benchmark_v3/schema.sql), in order:
# the first uploads (November 2024) wrote each tuple as a JSON array of its fields.
TUPLE_FIELDS = {
    "benchmark": ("name", "mode", "dtype", "extra_info"),
    "model": ("name", "type", "backend", "origins", "extra_info"),
    "metric": ("name", "benchmark_values", "target_value", "extra_info"),
}

# --- the metric name: one rule ---------------------------------------------------------------

# A unit suffix (the name's last words, lower case) → (unit, whether the words leave the name).
# A count or a rate keeps its words (`compile_time_instruction_count` is the metric's name).
UNIT_SUFFIXES: dict[str, tuple[str, bool]] = {
    "ns": ("ns", True),
    "us": ("us", True),
    "ms": ("ms", True),
    "s": ("s", True),
    "sec": ("s", True),
    "secs": ("s", True),
    "seconds": ("s", True),
    "count": ("count", False),
    "per_second": ("per_second", False),
    "per_sec": ("per_second", False),
    "per_s": ("per_second", False),
    "gbps": ("gb_per_s", True),
    "tflops": ("tflops", False),
    "gb": ("gb", True),
    "mb": ("mb", True),
    "percent": ("percent", True),
    "pct": ("percent", True),
    "ratio": ("ratio", False),
    # A speedup is a ratio of two times (Helion's `helion_speedup`, TritonBench's), never a time.
    "speedup": ("x", False),
    # TritonBench's accuracy: whether an input's output matched the baseline's (1.0 or 0.0).
    "accuracy": ("boolean", False),
}
# Whole names (once the statistic is taken off) whose unit is known.
UNIT_OF_NAME: dict[str, str] = {
    "speedup": "x",
    "tflops": "tflops",
    "gbps": "gb_per_s",
    "flops": "flops",
}
# The producers whose own code states what a record does not: each is known by a field's value
# it writes, (field, subfield) → value → producer.
PRODUCERS: dict[tuple[str, str], dict[str, str]] = {
    ("benchmark", "name"): {
        "Helion Benchmark": "helion",
        "vLLM benchmark": "vllm",
        "TorchAO benchmark": "torchao",
    },
    # TritonBench's .ci/test_infra/oss_ci_benchmark_v3.py: the model is the operator
    ("model", "type"): {"tritonbench-oss": "tritonbench"},
}
# Metric names whose unit only their producer's code states: (producer, metric.name). vLLM's
# benchmark_latency.py writes `latency`, each value one iteration's time.perf_counter()
# difference, in seconds; TritonBench's conversion writes its `latency`, the p50 in ms;
# torchao's llama generate.py writes `tok/s` (tokens per second) and `mem/s` (its bandwidth,
# GB/s), and its segment-anything benchmark `img_s(avg)` (1000 / ms per image: images per s).
UNIT_OF_PRODUCER_METRIC: dict[tuple[str, str], str] = {
    ("vllm", "latency"): "s",
    ("tritonbench", "latency"): "ms",
    ("torchao", "tok/s"): "per_second",
    ("torchao", "mem/s"): "gb_per_s",
    ("torchao", "img_s(avg)"): "per_second",
}
# Units as written in parentheses or in extra_info that have another spelling here.
UNIT_SPELLINGS: dict[str, str] = {
    "µs": "us",
    "sec": "s",
    "secs": "s",
    "seconds": "s",
    "%": "percent",
    "x": "x",
}
# A statistic word, first or last in the name → the statistic's name in records.
STATISTIC_WORDS: dict[str, str] = {
    "median": "median",
    "p50": "median",
    "mean": "mean",
    "avg": "mean",
    "average": "mean",
    "min": "minimum",
    "minimum": "minimum",
    "max": "maximum",
    "maximum": "maximum",
    "std": "stdev",
    "stdev": "stdev",
}
_PERCENTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")
_PAREN_UNIT = re.compile(r"^(?P<base>.*?)\s*\((?P<unit>[^()]+)\)\s*$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_PER_SECOND = re.compile(r"\s*/\s*(?:s|sec|second)$", re.IGNORECASE)

# Producers whose `benchmark_values` are one value per input, not repeated samples: Helion's
# `benchmarks/run.py` (`write_results_to_json`) writes one value per row of TritonBench's
# output, one row per input, and since 65f07a1 names each input in the record's `shape`. A
# record with a `shape` list as long as its values is read so whoever wrote it.
PER_INPUT_PRODUCERS = frozenset({"helion"})
# Producers that write 0 for a time or speedup they failed to measure (Helion's run.py and
# TritonBench's conversion both store 0.0 for an empty or error cell, e.g. "CUDA OOM").
ZERO_IS_FAILED = frozenset({"helion", "tritonbench"})
# A device as a device type (`cuda`, `cuda:0`, `cpu`), not a GPU's name (`NVIDIA H100`).
_DEVICE_TYPE = re.compile(r"^(?:cpu|cuda|hip|rocm|xpu|mps|npu|mtia|tpu|meta)(?::\d+)?$")
FAILED_INPUT = Reason.MEASUREMENT_FAILED


def producer_of(record: Mapping[str, Any]) -> str:
    """The producer a record's fields name (PRODUCERS), or ""."""
    for (field, subfield), producers in PRODUCERS.items():
        part = record.get(field)
        value = part.get(subfield) if isinstance(part, dict) else None
        if isinstance(value, str) and value.strip() in producers:
            return producers[value.strip()]
    return ""


MARKS = Marks.of(
    (_SNIFF_VALUES.pattern, "no metric with benchmark_values"),
    (_SNIFF_BENCHMARK.pattern, "no benchmark or model"),
    ('"metric"\\s*:', "no metric"),
)


@dataclass(frozen=True, slots=True)
class MetricName:
    """What a metric's name (and extra_info) says: the quantity, its unit, its statistic."""

    metric: str  # lower snake case
    unit: str  # as stated: `ms`, `count`, `gb_per_s`...
    statistic: str | None  # None: unstated

    @property
    def is_duration(self) -> bool:
        return self.unit in DURATION_NS

    @property
    def is_latency(self) -> bool:
        return "latency" in self.metric.split("_")


def _statistic_word(word: str) -> str | None:
    if word in STATISTIC_WORDS:
        return STATISTIC_WORDS[word]
    percentile = _PERCENTILE.match(word)
    if percentile:
        value = percentile.group(1)
        return "median" if float(value) == 50 else f"p{value.replace('.', '_').zfill(2)}"
    return None


def _unit_text(text: str) -> str:
    unit = text.strip().lower()
    unit = UNIT_SPELLINGS.get(unit, unit)
    if unit in DURATION_NS:
        return unit
    return key_of(unit.replace("/", "_per_").replace("%", "percent"))


def metric_of(name: str, extra_info: Mapping[str, Any], producer: str = "") -> MetricName:
    """The one rule for a v3 metric's name: its unit, its statistic, its quantity. `producer`:
    the record's producer (`producer_of`), for the names its own code gives a unit."""
    unit: str | None = UNIT_OF_PRODUCER_METRIC.get((producer, name.strip()))
    text = name.strip()
    paren = _PAREN_UNIT.match(text)
    stated_statistic = None
    if paren:
        # torchao's `time_ms(avg)`: a statistic in parentheses, the unit in the name
        stated_statistic = _statistic_word(key_of(paren.group("unit")))
        if stated_statistic is None and unit is None:
            unit = _unit_text(paren.group("unit"))
        text = paren.group("base")
    # a rate written with a slash (`tok/s`): "per second", never seconds
    text = _PER_SECOND.sub("_per_second", text)
    words = [w for w in key_of(text).split("_") if w]
    if unit is None:
        for size in (2, 1):
            suffix = "_".join(words[-size:])
            if len(words) > size and suffix in UNIT_SUFFIXES:
                unit, strip = UNIT_SUFFIXES[suffix]
                if strip:
                    words = words[:-size]
                break
    statistic = stated_statistic
    if statistic is None and len(words) > 1:
        for index in (0, -1):
            statistic = _statistic_word(words[index])
            if statistic is not None:
                del words[index]
                break
    metric = "_".join(words) or key_of(name)
    if unit is None and metric in UNIT_OF_NAME:
        unit = UNIT_OF_NAME[metric]
    stated_unit = extra_info.get("unit")
    if unit is None and isinstance(stated_unit, str) and stated_unit.strip():
        unit = _unit_text(stated_unit)
    if unit is None:
        raise ObservationError(Reason.UNKNOWN_METRIC_UNIT, f"no unit in the metric name {name!r}")
    aggregation = extra_info.get("aggregation")
    if statistic is None and isinstance(aggregation, str):
        statistic = _statistic_word(key_of(aggregation)) or key_of(aggregation)
    return MetricName(metric, unit, statistic)


# --- the reader ------------------------------------------------------------------------------


class PyTorchBenchmarkV3(HarnessSource):
    name = "pytorch-benchmark-v3"
    format_version = "kindex-pytorch-v3/2"

    title = "PyTorch OSS benchmark v3 records"
    marks = MARKS
    shape = "not a JSON array, object or lines of records"

    def shows(self, head: str) -> bool:
        return bool(
            _SNIFF_START.match(head)
            and _SNIFF_VALUES.search(head)
            and _SNIFF_BENCHMARK.search(head)
            and '"metric"' in head
        )

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        for item in _records(data):
            if isinstance(item, RowOutcome):
                yield item
                continue
            line, pointer, value = item
            for entry in observe(value, line, pointer, lambda r: _observation(r, context)):
                if isinstance(entry, FailedInput):
                    at = f"{pointer}/metric/benchmark_values/{entry.index}"
                    yield quarantined(line, at, raw_text(value), entry.reason, entry.detail)
                    continue
                yield entry


def _records(data: bytes) -> Iterator[tuple[int, str, Any] | RowOutcome]:
    """(line, pointer, record) in file order, or the quarantine row of a JSON Lines line that
    cannot be read. A line holding an array gives each element, its pointer `/i` within that
    line; a document's records have their pointers within the document. A file whose first
    line is broken is JSON Lines when it is no document but some of its lines are records: each
    line is then its own record or row, so one bad line never costs the others."""
    lines = is_json_lines(data)
    if not lines:
        try:
            document = read_document(data, named=PyTorchBenchmarkV3.title)
        except JsonInputError as unreadable:
            if unreadable.reason != Reason.JSON_SYNTAX or not _some_line_is_a_record(data):
                raise
            lines = True
    if lines:
        for json_line in read_lines(data):
            if json_line.error is not None:
                bad = json_line.error
                yield quarantined(json_line.line, "", json_line.text, bad.reason, bad.detail)
            elif isinstance(json_line.value, list):
                for index, item in enumerate(json_line.value):
                    yield json_line.line, f"/{index}", item
            else:
                yield json_line.line, "", json_line.value
        return
    if isinstance(document, list):
        for index, item in enumerate(document):
            yield 1, f"/{index}", item
    else:
        yield 1, "", document


def _some_line_is_a_record(data: bytes) -> bool:
    """Whether one of the first lines of the file is a v3 record (or an array of them) alone."""
    for json_line in itertools.islice(read_lines(data[: 1 << 20]), 64):
        value = json_line.value
        first = value[0] if isinstance(value, list) and value else value
        if isinstance(first, dict) and "metric" in first:
            return True
    return False


def _object(record: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    value = record.get(field)
    if value is None:
        return {}
    names = TUPLE_FIELDS.get(field)
    if isinstance(value, list) and names is not None:  # a tuple as an array of its fields
        if len(value) > len(names):
            detail = f"{field} has {len(value)} fields, the table's tuple {len(names)}"
            raise ObservationError(Reason.MALFORMED_RECORD, detail)
        return dict(zip(names, value, strict=False))
    if not isinstance(value, dict):
        raise ObservationError(Reason.MALFORMED_RECORD, f"{field} is not an object")
    return value


def _text(value: Any) -> str:
    """A field's text: a string as written, another JSON value as JSON, nothing as ''."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class FailedInput:
    """One input of a per-input record that failed: its own quarantine row."""

    index: int
    reason: str
    detail: str


def _observation(record: Any, context: SourceContext) -> Observation | list[Any]:
    if not isinstance(record, dict):
        raise ObservationError(Reason.MALFORMED_RECORD, "a v3 record is an object")
    if "metric" not in record:
        raise ObservationError(Reason.MISSING_FIELD, "no metric: not a benchmark record")
    record = {**record, **{f: _object(record, f) for f in TUPLE_FIELDS if f in record}}
    benchmark = _object(record, "benchmark")
    model = _object(record, "model")
    metric = _object(record, "metric")
    metric_extra = _object(metric, "extra_info")
    _object(benchmark, "extra_info")  # each must be an object, if there
    _object(model, "extra_info")
    metric_name = _text(metric.get("name"))
    model_name = _text(model.get("name"))
    if not metric_name:
        raise ObservationError(Reason.MISSING_FIELD, "metric.name")
    if not model_name:
        raise ObservationError(Reason.MISSING_FIELD, "model.name")
    producer = producer_of(record)
    named = metric_of(metric_name, metric_extra, producer)
    values = metric.get("benchmark_values")
    if not isinstance(values, list) or not values:
        raise ObservationError(
            Reason.MISSING_FIELD, "metric.benchmark_values is not a list of values"
        )
    inputs = _inputs_of(record, producer, values)
    if inputs is not None:
        return _per_input(record, context, named, metric_name, values, inputs)
    numbers = [number(v, f"metric.benchmark_values[{i}]") for i, v in enumerate(values)]
    if producer in ZERO_IS_FAILED and numbers == [0] and _failed_if_zero(named):
        detail = f"its {metric_name} is 0, {producer}'s mark of a measurement that failed"
        raise ObservationError(FAILED_INPUT, detail)
    latency, measurements, samples, primary = _numbers(named, numbers, metric_name)
    return _built(record, context, metric_name, latency, measurements, samples, primary)


def _inputs_of(
    record: Mapping[str, Any], producer: str, values: list[Any]
) -> list[str | None] | None:
    """Each value's input when the values are one per input (see PER_INPUT_PRODUCERS): the
    input's shape as the record names it, else None; None when the values are samples."""
    shape = record.get("shape")
    if isinstance(shape, list) and len(shape) == len(values):
        return [_text(s) or None for s in shape]
    if producer in PER_INPUT_PRODUCERS:
        return [None] * len(values)
    return None


def _failed_if_zero(named: MetricName) -> bool:
    """Whether 0 cannot be this metric's value: a time or a speedup."""
    return named.is_duration or named.unit == "x"


def _per_input(
    record: Mapping[str, Any],
    context: SourceContext,
    named: MetricName,
    metric_name: str,
    values: list[Any],
    inputs: list[str | None],
) -> list[Observation | FailedInput]:
    """One run per input: its value is that input's statistic, as one value of a record is."""
    entries: list[Observation | FailedInput] = []
    for index, (value, shape) in enumerate(zip(values, inputs, strict=True)):
        where = f"metric.benchmark_values[{index}]"
        try:
            amount = number(value, where)
            if amount == 0 and _failed_if_zero(named):
                where = f"input {index}{f' {shape}' if shape else ''}"
                detail = f"{where} failed: its {metric_name} is 0, the mark of a failed input"
                raise ObservationError(FAILED_INPUT, detail)
            latency, measurements, samples, primary = _numbers(named, [amount], metric_name)
        except ObservationError as error:
            entries.append(FailedInput(index, error.reason, error.detail))
            continue
        case = {"input_index": index}
        labels = {"input_shape": shape} if shape else {}
        entries.append(
            _built(
                record,
                context,
                metric_name,
                latency,
                measurements,
                samples,
                primary,
                case=case,
                labels=labels,
            )
        )
    return entries


def _built(
    record: Mapping[str, Any],
    context: SourceContext,
    metric_name: str,
    latency: dict[str, int],
    measurements: tuple[Measurement, ...],
    samples: int | None,
    primary: str,
    case: Mapping[str, int] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Observation:
    benchmark = _object(record, "benchmark")
    model = _object(record, "model")
    metric = _object(record, "metric")
    metric_extra = _object(metric, "extra_info")
    benchmark_extra = _object(benchmark, "extra_info")
    model_extra = _object(model, "extra_info")
    model_name = _text(model.get("name"))

    benchmark_name = _text(benchmark.get("name")) or UNSPECIFIED
    backend = _text(model.get("backend")) or UNSPECIFIED
    axes, parameters = _case(benchmark_extra, model_extra, metric_extra, benchmark, record)
    axes.update(case or {})
    native: dict[str, float] = {}
    target = metric.get("target_value")
    numeric = isinstance(target, int | float) and not isinstance(target, bool)
    if numeric and target and math.isfinite(target):
        native["target_value"] = float(target)
    description = _text(benchmark_extra.get("description")) or None
    model_type = _text(model.get("type"))
    origins = model.get("origins")
    run_labels = dict(labels or {})
    labels = {"benchmark": benchmark_name[:NAME_LIMIT]}
    if model_type:
        labels["model_type"] = model_type[:NAME_LIMIT]
    if isinstance(origins, list) and origins:
        labels["origins"] = ",".join(_text(o) for o in origins)[:NAME_LIMIT]
    external_id = _external_id(benchmark, model, metric, benchmark_name, backend, metric_name)
    if case:
        external_id += "".join(f"[{k}={v}]" for k, v in case.items())
    return Observation(
        source=SOURCE,
        external_id=external_id,
        operation=Operation(
            name=model_name,
            family=model_name,
            title=f"{model_name} ({benchmark_name})",
            description=description,
            labels=labels,
        ),
        workload_axes=axes,
        implementation=_implementation(record, backend),
        protocol=Protocol(
            harness=benchmark_name,
            timer=UNSPECIFIED,
            primary_statistic=primary,
            family=f"pytorch_v3_{key_of(benchmark_name)}",
            repository=None,
            notes=(
                "A PyTorch OSS benchmark v3 record (pytorch/test-infra): the metric's unit and "
                "statistic are read from its name; several benchmark_values are samples whose "
                "minimum, mean and maximum kindex computes. The record states no timer, "
                "warm-up or iteration count."
            ),
        ),
        environment=_environment(record, benchmark_extra),
        observed_at=_observed_at(record, context),
        latency_ns=latency,
        samples=samples,
        measurements=measurements,
        benchmark=benchmark_name,
        mode=_text(benchmark.get("mode")) or None,
        parameters=parameters,
        labels=run_labels,
        native_metrics=native,
    )


def _numbers(
    named: MetricName, values: list[float], metric_name: str
) -> tuple[dict[str, int], tuple[Measurement, ...], int | None, str]:
    """(latencyNs, measurements, sample count, primary statistic) of a metric's values."""
    unit = "ns" if named.is_duration else named.unit

    def amount(value: float) -> float:
        return float(to_ns(value, named.unit)) if named.is_duration else value

    if len(values) == 1:
        statistic = named.statistic or UNSPECIFIED
        value = amount(values[0])
        if named.is_latency and named.is_duration and statistic in LATENCY_STATISTICS:
            return {statistic: int(value)}, (), None, statistic
        return {}, (Measurement(named.metric, unit, statistic, value),), None, statistic
    if named.statistic is not None:
        raise ObservationError(
            Reason.AMBIGUOUS_VALUES,
            f"{len(values)} values for {metric_name!r}, which names one statistic",
        )
    count = len(values)
    computed = (
        ("minimum", min(values)),
        ("mean", math.fsum(values) / count),
        ("maximum", max(values)),
    )
    measurements = tuple(
        Measurement(named.metric, unit, statistic, amount(value), count)
        for statistic, value in computed
    )
    return {}, measurements, count, "mean"


def _case(
    benchmark_extra: Mapping[str, Any],
    model_extra: Mapping[str, Any],
    metric_extra: Mapping[str, Any],
    benchmark: Mapping[str, Any],
    record: Mapping[str, Any],
) -> tuple[dict[str, int], dict[str, str]]:
    """The case's integer settings (workload axes) and its other settings (run labels)."""
    axes: dict[str, int] = {}
    parameters: dict[str, str] = {}
    settings: list[tuple[str, Any]] = [
        *((k, v) for k, v in model_extra.items()),
        *((k, v) for k, v in benchmark_extra.items() if k != "description"),
        *((k, v) for k, v in metric_extra.items() if k not in ("unit", "aggregation")),
    ]
    dtype = _text(benchmark.get("dtype"))
    if dtype:
        settings.append(("dtype", dtype))
    inputs = record.get("inputs")
    if isinstance(inputs, dict):
        for name, spec in inputs.items():
            if isinstance(spec, dict) and spec.get("dtype"):
                settings.append((f"input_{name}_dtype", spec["dtype"]))
    for name, value in settings:
        key = key_of(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            axes[key] = value
        elif value is not None:
            parameters[key] = _text(value)
    return axes, parameters


def _external_id(
    benchmark: Mapping[str, Any],
    model: Mapping[str, Any],
    metric: Mapping[str, Any],
    benchmark_name: str,
    backend: str,
    metric_name: str,
) -> str:
    """Which case a record measured, stable across files: its names, and a digest of the
    settings that tell two cases with those names apart."""
    parts = [
        benchmark_name,
        _text(benchmark.get("mode")),
        _text(benchmark.get("dtype")),
        _text(model.get("name")),
        backend,
        metric_name,
    ]
    readable = "/".join(p for p in parts if p)
    settings = {
        "benchmark": benchmark.get("extra_info") or {},
        "model": model.get("extra_info") or {},
        "metric": metric.get("extra_info") or {},
    }
    if not any(settings.values()):
        return readable
    canonical = json.dumps(settings, sort_keys=True, ensure_ascii=False, default=str)
    return f"{readable}#{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def _implementation(record: Mapping[str, Any], backend: str) -> Implementation:
    repo = _text(record.get("repo"))
    if not repo:
        return Implementation(backend, Project(UNSPECIFIED))
    project = Project(repo, f"https://github.com/{repo}")
    sha = _text(record.get("head_sha")).lower()
    version = None
    dependencies = record.get("dependencies")
    if isinstance(dependencies, dict):
        for dependency in dependencies.values():
            if isinstance(dependency, dict) and _text(dependency.get("repo")) == repo:
                version = _text(dependency.get("version")) or None
    return Implementation(
        backend, project, commit=sha if _SHA.match(sha) else None, version=version
    )


def _environment(record: Mapping[str, Any], benchmark_extra: Mapping[str, Any]) -> Environment:
    runners = record.get("runners")
    runner = runners[0] if isinstance(runners, list) and runners else None
    gpu: str | None = None
    count = cuda = None
    if isinstance(runner, dict):
        gpu = _text(runner.get("gpu_info")) or None
        gpu_count = runner.get("gpu_count")
        if isinstance(gpu_count, int) and not isinstance(gpu_count, bool) and gpu_count > 0:
            count = gpu_count
        extra = runner.get("extra_info")
        if isinstance(extra, dict):
            cuda = _text(extra.get("cuda_version")) or None
    if gpu is None:
        stated = _text(benchmark_extra.get("device"))
        device = stated.lower()
        if device and not _DEVICE_TYPE.match(device):
            gpu = stated  # a device's name (Helion writes torch.cuda.get_device_name())
        elif device and device != "cpu":
            gpu = f"unnamed {device} device"
        elif not device and not isinstance(runner, dict):
            gpu = UNSPECIFIED  # neither a runner nor a device: the record names no hardware
    framework = None
    libraries: dict[str, str] = {}
    dependencies = record.get("dependencies")
    if isinstance(dependencies, dict):
        for name, dependency in dependencies.items():
            if not isinstance(dependency, dict):
                continue
            version = _text(dependency.get("version"))
            sha = _text(dependency.get("sha"))
            if version:
                libraries[key_of(name)] = version
                if key_of(name) in ("pytorch", "torch"):
                    framework = ("pytorch", version)
            elif sha:
                libraries[f"{key_of(name)}_commit"] = sha
    return Environment(gpu=gpu, count=count, cuda=cuda, framework=framework, libraries=libraries)


def _observed_at(record: Mapping[str, Any], context: SourceContext) -> str:
    timestamp = record.get("timestamp")
    if timestamp == 0:  # the table's default: not set
        timestamp = None
    if isinstance(timestamp, bool):
        raise ObservationError(Reason.BAD_TIMESTAMP, f"timestamp is {timestamp!r}")
    if isinstance(timestamp, int | float | str) and timestamp != "":
        return utc_instant(timestamp)
    received = context.received_time()
    if received is None:
        raise ObservationError(Reason.MISSING_FIELD, "no timestamp, and no time the file arrived")
    return utc_instant(received)
