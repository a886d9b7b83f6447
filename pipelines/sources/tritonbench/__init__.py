"""TritonBench `--output-json` (meta-pytorch/tritonbench: `run.py` writes
`BenchmarkOperatorResult.userbenchmark_dict` of `tritonbench/utils/triton_op.py`): a flat map of
metric keys to values; the nightly run (`benchmarks/nightly/run.py`) wraps it with the run's
environment and GitHub context.

    {"name": "nightly",
     "env": {"benchmark_date": "2025-08-01T09:00:00", "cuda_version": "12.8",
             "device": "NVIDIA H100", "pytorch_commit": "0123...", "triton_commit": "89ab...",
             "tritonbench_commit": "0efd...", ...},
     "metrics": {"tritonbench_gemm_fwd[x_(256, 256, 256)-aten_matmul]_latency": "0.010208",
                 "tritonbench_gemm_fwd[x_(256, 256, 256)-aten_matmul]_tflops": 3.287,
                 "tritonbench_gemm_fwd[x_average-aten_matmul]_tflops": 3.287,
                 "tritonbench_gemm_fwd[aten_matmul]-tflops-avg": 3.287,
                 "tritonbench_gemm_fwd-pass": 1},
     "github": {"RUNNER_TYPE": "gcp-h100-runner", ...}}

A key `tritonbench_<op>_<mode>[x_<input>-<backend>]_<metric>` is one metric of one backend on
one input: one run per (op, mode, input, backend), its keys folded together. `latency` is the
run's latency: TritonBench writes its `Latency` as a string of the p50 (the median of the
do_bench times) in milliseconds, so it is the run's median. `tflops`, `gbps` and `speedup` are
measurements TritonBench derives from that p50 latency (statistic `derived`); `accuracy` is
TritonBench's check against the baseline (1 or 0). A per-input key with another metric is
quarantined alone (`unknown_metric_unit`): its unit is not known here, and the rest of its run
lands. An input that is an integer or a tuple of integers (`x_(256, 256, 256)`) gives the case's
sizes (named from `OP_AXES` where the operator's x-value is known, else `x0, x1, ...`); another
input is a run label. The mode is the benchmark name's last part when it is one of TritonBench's
modes (`fwd`, `bwd`, `fwd_bwd`, `fwd_no_grad`); otherwise the whole name is the operator.

Keys of other shapes are not runs: per-backend averages (`...[x_average-<backend>]_<metric>`,
`...[<backend>]-<metric>-avg`) and the whole benchmark's status (`..._<mode>-pass`) are each a
quarantine row with reason `aggregate_metric` (they restate runs the file holds, or say whether
all inputs ran), never silently dropped.

The device is `env.device` (the GPU's name; curated by gpus.yaml); a bare `--output-json` map,
which has no `env`, names no device (`unspecified`) and no time (the object's receipt time is
used). The run's time is `env.benchmark_date` (written without a zone: read as UTC). The
implementation is the backend: a backend of PyTorch's (`aten`, `aten_*`) is PyTorch's at
`env.pytorch_commit`; every other backend is TritonBench's code (its operators vendor their
kernels) at `env.tritonbench_commit`. The file does not record how latency was measured
(`--latency-measure-mode`, default `triton_do_bench`), nor warm-up or repetitions, nor dtypes.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pipelines.records.rules import UNSPECIFIED, Reason, name_of
from pipelines.sources.json_input import (
    KeyedObject,
    Marks,
    escape,
    raw_text,
    unpacked,
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

SOURCE = "tritonbench"
REPOSITORY = "https://github.com/meta-pytorch/tritonbench"
_SNIFF = re.compile(r'^\{.*?"tritonbench_[0-9A-Za-z_]+(?:\[[^"\]]*\]|-pass")', re.DOTALL)

# One per-input metric key: `tritonbench_<op>_<mode>[x_<input>-<backend>]_<metric>`.
_PER_INPUT = re.compile(
    r"^tritonbench_(?P<bench>[^\[\]]+)\[x_(?P<input>.*)-(?P<backend>[A-Za-z0-9_.]+)\]"
    r"_(?P<metric>.+)$",
    re.DOTALL,
)
# The aggregates TritonBench adds: a backend's average, and the whole benchmark's status.
_AGGREGATE = re.compile(r"^tritonbench_[^\[\]]+(?:\[[A-Za-z0-9_.]+\]-.+|-pass)$", re.DOTALL)
AVERAGE_INPUT = "average"
MODES = ("fwd_no_grad", "fwd_bwd", "fwd", "bwd")  # longest first

# A metric's unit and statistic. `latency` is the run's latency (ms, TritonBench's p50).
LATENCY = "latency"
METRICS: dict[str, tuple[str, str]] = {
    "tflops": ("tflops", "derived"),
    "gbps": ("gb_per_s", "derived"),
    "speedup": ("x", "derived"),
    "accuracy": ("bool", "value"),
}
# Operators whose x-value TritonBench names (`@register_x_val(label=...)`).
OP_AXES: dict[str, tuple[str, ...]] = {"gemm": ("m", "n", "k")}
_INTEGERS = re.compile(r"^\(\s*\d+(?:\s*,\s*\d+)*\s*,?\s*\)$|^\d+$")

TRITONBENCH = Project("TritonBench", REPOSITORY, "library")
PYTORCH = Project("PyTorch", "https://github.com/pytorch/pytorch", "library")
PROTOCOL_NOTES = (
    "TritonBench (meta-pytorch/tritonbench): latency is the p50 of the times its latency "
    "measurement returns (triton do_bench by default; the file does not say which mode ran), in "
    "ms; tflops, gbps and speedup are derived from that p50."
)


MARKS = Marks.of(
    ('"tritonbench_', "no tritonbench_<op> keys"),
    (
        '"tritonbench_[0-9A-Za-z_]+(?:\\[[^"\\]]*\\]|-pass")',
        "no tritonbench_<op>[x_<input>-<backend>] keys",
    ),
)


class TritonBenchJson(HarnessSource):
    name = "tritonbench-json"
    format_version = "kindex-tritonbench/1"

    title = "TritonBench --output-json"
    marks = MARKS
    shape = "not a JSON object"

    def shows(self, head: str) -> bool:
        return bool(_SNIFF.search(head))

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        document = self.json_object(data)
        wrapped = isinstance(document.get("metrics"), dict)
        metrics: dict[str, Any] = document["metrics"] if wrapped else document
        prefix = "/metrics" if wrapped else ""
        env = document.get("env") if wrapped else None
        run = _Run.of(env if isinstance(env, dict) else None, context)
        lines = _KeyLines(data, metrics)
        groups: dict[str, _Group] = {}
        order: list[_Group | Entry] = []
        duplicates = set(getattr(metrics, "duplicates", ()))
        for key, value in metrics.items():
            pointer = f"{prefix}/{escape(key)}"
            line = lines.line_of(key)
            per_input = _PER_INPUT.match(key)
            if per_input and per_input["input"] != AVERAGE_INPUT:
                metric = per_input["metric"]
                if metric != LATENCY and metric not in METRICS:
                    detail = f"TritonBench metric {metric!r} of {key!r} has no known unit"
                    order.append(
                        _single(line, pointer, key, value, Reason.UNKNOWN_METRIC_UNIT, detail)
                    )
                    continue
                case = key[: -len(metric) - 1]
                group = groups.get(case)
                if group is None:
                    group = groups[case] = _Group(case, per_input, line, pointer)
                    order.append(group)
                group.add(key, value, metric, pointer, line, key in duplicates)
            elif per_input or _AGGREGATE.match(key):
                detail = f"{key!r} aggregates the file's runs (an average or the pass status)"
                order.append(_single(line, pointer, key, value, Reason.AGGREGATE_METRIC, detail))
            else:
                detail = f"{key!r} is not a TritonBench metric key"
                order.append(_single(line, pointer, key, value, Reason.MALFORMED_RECORD, detail))
        for item in order:
            if isinstance(item, _Group):
                build = partial(_observation, item, run)
                yield from observe(item.record, item.line, item.pointer, build)
            else:
                yield item


def _single(line: int, pointer: str, key: str, value: Any, reason: str, detail: str) -> Entry:
    return quarantined(line, pointer, raw_text({key: value}), reason, detail)


class _KeyLines:
    """The line each key of the metrics object is written on (a document small enough that
    its objects know their lines); else the object's own line."""

    def __init__(self, data: bytes, metrics: Mapping[str, Any]) -> None:
        self.start = getattr(metrics, "line", None) or 1
        self.text = ""
        self.newlines: list[int] = []
        self.cursor = 0
        if getattr(metrics, "line", None):
            self.text = unpacked(data).decode("utf-8-sig", errors="replace")
            self.newlines = [m.start() for m in re.finditer("\n", self.text)]
            self.cursor = self.newlines[self.start - 2] + 1 if self.start > 1 else 0

    def line_of(self, key: str) -> int:
        if not self.text:
            return self.start
        for spelling in (json.dumps(key), json.dumps(key, ensure_ascii=False)):
            found = self.text.find(spelling, self.cursor)
            while found >= 0:  # a key is followed by its colon; a value of that text is not
                end = found + len(spelling)
                if self.text[end : end + 64].lstrip().startswith(":"):
                    self.cursor = end
                    return bisect.bisect_left(self.newlines, found) + 1
                found = self.text.find(spelling, end)
        return self.start


@dataclass
class _Group:
    """The keys of one (op, mode, input, backend): one run."""

    case: str  # the keys' shared part, `tritonbench_<op>_<mode>[x_<input>-<backend>]`
    match: re.Match[str]
    line: int
    pointer: str
    record: KeyedObject = field(default_factory=KeyedObject)
    metrics: dict[str, Any] = field(default_factory=dict)

    def add(
        self, key: str, value: Any, metric: str, pointer: str, line: int, duplicate: bool
    ) -> None:
        self.record[key] = value
        self.metrics[metric] = value
        if duplicate:
            self.record.duplicates.append(key)
        if metric == LATENCY:  # the run is where its latency is
            self.line, self.pointer = line, pointer


@dataclass(frozen=True, slots=True)
class _Run:
    """What the nightly wrapper's `env` says of every run in the file."""

    gpu: str
    cuda: str | None
    date: Any  # env.benchmark_date as written, or None
    received: str | None
    commits: Mapping[str, str]

    def observed_at(self) -> str:
        if self.date is not None:
            if not isinstance(self.date, str):
                raise ObservationError(Reason.BAD_TIMESTAMP, f"benchmark_date is {self.date!r}")
            return utc_instant(self.date)
        if self.received is None:
            raise ObservationError(Reason.MISSING_FIELD, "no benchmark_date, and no receipt time")
        return utc_instant(self.received)

    @classmethod
    def of(cls, env: Mapping[str, Any] | None, context: SourceContext) -> _Run:
        env = env or {}
        date = env.get("benchmark_date")
        if isinstance(date, str) and not date.strip():
            date = None
        commits = {
            name: str(env[f"{name}_commit"]).strip()
            for name in ("pytorch", "triton", "tritonbench")
            if env.get(f"{name}_commit")
        }
        device = env.get("device")
        gpu = device.strip() if isinstance(device, str) and device.strip() else UNSPECIFIED
        cuda = env.get("cuda_version")
        cuda_version = str(cuda).strip() if cuda else None
        return cls(gpu, cuda_version, date, context.received_time(), commits)


def _observation(group: _Group, run: _Run, record: Any) -> Observation:
    """The run of one group's keys (`record`: those keys and values, as `observe` checked)."""
    bench, backend, case_input = group.match["bench"], group.match["backend"], group.match["input"]
    op, mode = _op_and_mode(bench)
    latency: dict[str, int] = {}
    measurements: list[Measurement] = []
    for metric, value in group.metrics.items():
        if value is None:  # TritonBench writes None for a metric it could not take
            continue
        if metric == LATENCY:
            latency["median"] = to_ns(number(value, metric), "ms")
            continue
        unit, statistic = METRICS[metric]
        amount = float(value) if isinstance(value, bool) else number(value, metric)
        measurements.append(Measurement(metric, unit, statistic, amount))
    if not latency and not measurements:
        raise ObservationError(Reason.MISSING_FIELD, f"no value for {group.case!r}")
    axes, parameters = _input(op, case_input)
    project = PYTORCH if backend == "aten" or backend.startswith("aten_") else TRITONBENCH
    commit_of = "pytorch" if project is PYTORCH else "tritonbench"
    libraries = {f"{k}_commit": v for k, v in run.commits.items() if k != "tritonbench"}
    return Observation(
        source=SOURCE,
        external_id=group.case,
        operation=Operation(
            name=name_of("tritonbench", op),
            family=op,
            title=f"TritonBench {op}",
            axes=dict.fromkeys(OP_AXES.get(op, ())),
        ),
        workload_axes=axes,
        implementation=Implementation(
            backend, project, language="python", commit=run.commits.get(commit_of)
        ),
        protocol=Protocol(
            harness="TritonBench",
            repository=REPOSITORY,
            commit=run.commits.get("tritonbench"),
            timer=UNSPECIFIED,
            primary_statistic="median",
            family="tritonbench",
            notes=PROTOCOL_NOTES,
        ),
        environment=Environment(gpu=run.gpu, cuda=run.cuda, libraries=libraries),
        observed_at=run.observed_at(),
        latency_ns=latency,
        measurements=tuple(measurements),
        benchmark=bench,
        mode=mode,
        parameters=parameters,
    )


def _op_and_mode(bench: str) -> tuple[str, str | None]:
    for mode in MODES:
        if bench.endswith(f"_{mode}") and len(bench) > len(mode) + 1:
            return bench[: -len(mode) - 1], mode
    return bench, None


def _input(op: str, text: str) -> tuple[dict[str, int], dict[str, str]]:
    """An input of integers as the case's sizes; another as a run label."""
    text = text.strip()
    if not _INTEGERS.match(text):
        return {}, {"input": text}
    sizes = [int(s) for s in re.findall(r"\d+", text)]
    names = OP_AXES.get(op, ())
    if len(names) != len(sizes):
        names = ("x",) if len(sizes) == 1 else tuple(f"x{i}" for i in range(len(sizes)))
    return dict(zip(names, sizes, strict=True)), {}
