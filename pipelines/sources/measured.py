"""What a benchmark harness measured, as kernelindex.dev/v1alpha1 records.

Every harness source (nvbench, Google Benchmark, KernelBench, PyTorch's v3 records, TritonBench,
FlashInfer-Trace) parses its format into `Observation`s and hands them here: one pure builder per
record kind turns an observation into the seven manifests of a run, so the rules a record obeys
(names, units, the GPU vocabulary, what a harness that says nothing gets) are written once, here.
A format's own rules (which field is which, its units) live in its folder.

What a format does not report is left out of a manifest, never guessed. Where the schema
requires a field the format lacks, the value says so (`UNSPECIFIED`), the same way for every
format (docs/formats.md lists what each format lacks).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from pipelines import API_VERSION
from pipelines.curation import Curation
from pipelines.curation import load as load_curation
from pipelines.curation.gaps import (
    Gap,
    gap_labels,
    gpu_hardware,
)
from pipelines.records import Record, RowOutcome, RunFacts, rules
from pipelines.records.canonical import manifest_digest
from pipelines.records.manifests import first_schema_error
from pipelines.records.rules import (
    DURATION_NS,
    MAX_SAFE_INTEGER,
    NAME_LIMIT,
    SHORT_LIMIT,
    UNSPECIFIED,
    Reason,
    family_of,
    key_of,
    name_of,
)
from pipelines.sources.json_input import defect, raw_text

# The hardware of an environment whose harness reported no GPU (a CPU benchmark).
NO_GPU = {"vendor": "none", "product": "no GPU", "architecture": "none"}

RunStatus = Literal[
    "passed",
    "incorrect_shape",
    "incorrect_dtype",
    "incorrect_numerical",
    "compile_error",
    "runtime_error",
    "timeout",
    "resource_exceeded",
    "invalid_reference",
    "policy_violation",
    "suspected_reward_hack",
    "incomplete_evidence",
    "revoked",
]

# Latency statistics a run's `timing.latencyNs` holds (integer nanoseconds), in schema order.
LATENCY_STATISTICS = ("median", "mean", "p05", "p95", "minimum", "maximum", "mad")


class ObservationError(ValueError):
    """An observation a format could not make from a record: quarantined with this reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# --- what a format reports ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    shape: tuple[int | str, ...]  # sizes, or names of the operation's axes
    dtype: str  # as the format writes it; the curation's dtype names map it


@dataclass(frozen=True, slots=True)
class Operation:
    """What was computed. `axes`: each axis's constant value, or None for a variable axis."""

    name: str
    family: str
    title: str | None = None
    description: str | None = None
    axes: Mapping[str, int | None] = field(default_factory=dict)
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    reference_language: str | None = None  # the language of the reference implementation
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Project:
    name: str
    repository: str | None = None
    kind: Literal["library", "individual", "vendor"] | None = None


@dataclass(frozen=True, slots=True)
class Implementation:
    name: str  # the provider, backend or solution as the harness names it
    project: Project
    language: str = UNSPECIFIED
    symbol: str | None = None
    version: str | None = None
    commit: str | None = None  # 40 hex digits, or left out
    architectures: tuple[str, ...] = ()
    products: tuple[str, ...] = ()
    source_digest: str | None = None  # sha256 of the implementation's source, when carried


@dataclass(frozen=True, slots=True)
class Protocol:
    harness: str
    timer: str
    primary_statistic: str
    family: str
    harness_version: str | None = None
    repository: str | None = None
    commit: str | None = None
    samples: int | None = None
    warmup_iterations: int | None = None
    compile_included: bool | None = None
    notes: str | None = None


@dataclass(frozen=True, slots=True)
class Environment:
    gpu: str | None  # the device's name as the harness reports it; None: no GPU
    architecture: str | None = None  # when the harness says (nvbench's sm_version)
    memory_bytes: int | None = None
    count: int | None = None
    driver: str | None = None
    cuda: str | None = None
    framework: tuple[str, str] | None = None  # (name, version)
    libraries: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Measurement:
    metric: str
    unit: str
    statistic: str
    value: float
    samples: int | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """One measured case: what ran, on what, how, and the numbers, with where it was read."""

    source: str  # sourceNative.source: the format's name
    external_id: str
    operation: Operation
    workload_axes: Mapping[str, int]
    implementation: Implementation
    protocol: Protocol
    environment: Environment
    observed_at: str  # a UTC instant, `...Z`
    status: RunStatus = "passed"
    latency_ns: Mapping[str, int] = field(default_factory=dict)
    samples: int | None = None
    measurements: tuple[Measurement, ...] = ()
    correctness: Mapping[str, float | str] | None = None
    benchmark: str | None = None
    mode: str | None = None
    parameters: Mapping[str, str] = field(default_factory=dict)  # non-integer case settings
    labels: Mapping[str, str] = field(default_factory=dict)  # other facts a run's label keeps
    native_metrics: Mapping[str, float] = field(default_factory=dict)
    # Where it was read (`observe` fills these in): the record's 1-based line, its JSON
    # pointer ("" for a whole line of JSON Lines), and its text.
    line: int = 0
    pointer: str = ""
    raw: str = ""


# --- rules of every source's records: pipelines/records/rules.py states them ---------------


def to_ns(value: float, unit: str) -> int:
    """A duration in integer nanoseconds, rounded half up as the Liger rule does."""
    factor = DURATION_NS.get(unit)
    if factor is None:
        raise ObservationError(Reason.UNKNOWN_UNIT, f"no duration unit {unit!r}")
    return half_up(value * factor)


def half_up(value: float) -> int:
    """The rulebook's rounding of a value a record stores as a non-negative safe integer."""
    if not math.isfinite(value):
        raise ObservationError(Reason.NON_FINITE_NUMBER, f"{value} is not a number")
    result = rules.half_up(value)
    if not 0 <= result <= MAX_SAFE_INTEGER:
        raise ObservationError(Reason.BAD_VALUE, f"{value} is out of range")
    return result


def utc_instant(value: str | float | datetime) -> str:
    """A UTC instant as records write it (`2026-03-17T14:19:52.543Z`): an ISO text without a
    zone is read as UTC (as Liger's are), one with an offset is converted; a number is seconds
    since the epoch."""
    try:
        if isinstance(value, datetime):
            moment = value
        elif isinstance(value, int | float):
            moment = datetime.fromtimestamp(value, UTC)
        else:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError) as error:
        raise ObservationError(Reason.BAD_TIMESTAMP, f"{value!r}: {error}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def dtype_of(name: str, curation: Curation) -> str:
    """A dtype in kernelindex's names: the curation maps a harness's (`float16` → `fp16`)."""
    return curation.dtypes.get(name) or key_of(name)


def hardware_of(environment: Environment, curation: Curation) -> dict[str, Any]:
    """The hardware a GPU name stands for (the curation's policy, pipelines/curation/gaps.py: a
    name gpus.yaml knows gets its curated hardware whichever source saw it; another is an
    uncurated GPU, its name as reported, the architecture only where the harness said it)."""
    if environment.gpu is None:
        return dict(NO_GPU)
    hardware, _ = gpu_hardware(curation, environment.gpu, environment.architecture)
    if environment.memory_bytes:
        hardware["memoryBytes"] = environment.memory_bytes
    if environment.count:
        hardware["count"] = environment.count
    return hardware


def gpu_name(environment: Environment) -> str:
    """The `gpu` a run is filed under: the name the GPU was reported by, as gpus.yaml keys it
    (Liger's `gpu_name`, KernelBench's `hardware`), so one GPU is one name in every source."""
    return NO_GPU["product"] if environment.gpu is None else environment.gpu.strip()


def gaps_of(observation: Observation, curation: Curation) -> list[Gap]:
    """What the curation lacks for an observation: a harness names its own operations,
    implementations and protocols, so only its GPU can be a gap (gaps.py)."""
    return [] if is_curated_gpu(observation.environment, curation) else [Gap.GPU]


def is_curated_gpu(environment: Environment, curation: Curation) -> bool:
    """Whether gpus.yaml knows the GPU; no GPU, or one the file did not name, is no gap."""
    name = (environment.gpu or "").strip()
    return name in ("", UNSPECIFIED) or name in curation.gpus


# --- one builder per record kind -----------------------------------------------------------


def _manifest(kind: str, name: str, spec: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    meta = {"name": name, **{k: v for k, v in metadata.items() if v}}
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": meta, "spec": spec}


def _tensor(tensor: Tensor, curation: Curation) -> dict[str, Any]:
    shape = [s if isinstance(s, int) else key_of(s) for s in tensor.shape]
    body: dict[str, Any] = {"shape": shape, "dtype": dtype_of(tensor.dtype, curation)}
    if not shape:  # a 0-d tensor is a scalar
        return {"name": key_of(tensor.name), "scalar": {"dtype": body["dtype"]}}
    return {"name": key_of(tensor.name), "tensor": body}


def operation_manifest(operation: Operation, curation: Curation) -> dict[str, Any]:
    axes: dict[str, Any] = {}
    for axis, value in operation.axes.items():
        entry: dict[str, Any] = {"role": "variable", "type": "integer"}
        if value is not None:
            entry = {"role": "constant", "type": "integer", "value": value}
        axes[key_of(axis)] = entry
    # The schema asks for one input and output at least; a format that names none says so.
    inputs = [_tensor(t, curation) for t in operation.inputs] or [{"name": UNSPECIFIED}]
    outputs = [_tensor(t, curation) for t in operation.outputs] or [{"name": UNSPECIFIED}]
    spec: dict[str, Any] = {
        "family": family_of(operation.family),
        "axes": axes,
        "inputs": inputs,
        "outputs": outputs,
        "semantics": {"mutation": "none", "determinism": "unspecified"},
    }
    if operation.reference_language:
        spec["reference"] = {"language": key_of(operation.reference_language)}
    return _manifest(
        "OperationSpec",
        name_of(operation.name),
        spec,
        title=operation.title,
        description=(operation.description or "")[:2000],
        labels=dict(operation.labels),
    )


def workload_manifest(
    operation: Operation, operation_digest: str, axes: Mapping[str, int], curation: Curation
) -> dict[str, Any]:
    """The case: the operation's constant axes and the run's variable ones, and each tensor's
    shape once every axis it names has a size."""
    sizes = {key_of(a): v for a, v in operation.axes.items() if v is not None}
    sizes.update({key_of(a): v for a, v in axes.items()})
    tensors: dict[str, Any] = {}
    for tensor in (*operation.inputs, *operation.outputs):
        shape = [s if isinstance(s, int) else sizes.get(key_of(s)) for s in tensor.shape]
        if shape and all(isinstance(s, int) for s in shape):
            tensors[key_of(tensor.name)] = {
                "shape": shape,
                "dtype": dtype_of(tensor.dtype, curation),
            }
    spec = {
        "operationSpecDigest": operation_digest,
        "axes": dict(sorted(sizes.items())),
        "tensors": tensors,
        "correctness": {"comparator": UNSPECIFIED},
    }
    case_key = case_key_of(sizes)
    name = name_of(operation.name, case_key)
    return _manifest("WorkloadCase", name, spec, labels={"case_key": case_key} if sizes else {})


def case_key_of(axes: Mapping[str, int], parameters: Mapping[str, str] | None = None) -> str:
    """Like Liger's case keys: each axis and its size, in name order; then the case's settings
    that are not sizes (`in=I8`), which v1alpha1's workload has no place for, so that runs of
    two such cases are never one series."""
    sizes = [f"{axis}{size}" for axis, size in sorted(axes.items())]
    settings = [f"{key_of(k)}={v}" for k, v in sorted((parameters or {}).items())]
    return "-".join(sizes + settings)


def project_manifest(project: Project) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": project.name}
    if project.kind:
        spec["kind"] = project.kind
    if project.repository:
        spec["repository"] = project.repository
        github = re.match(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?/?$", project.repository)
        if github:
            spec["host"] = {"kind": "github", "id": github.group(1)}
    return _manifest("SoftwareProject", name_of(project.name), spec)


def implementation_manifest(
    implementation: Implementation, operation: Operation, operation_digest: str, curation: Curation
) -> dict[str, Any]:
    revision: dict[str, Any] = {}
    if implementation.project.repository:
        revision["repository"] = implementation.project.repository
    if implementation.commit and re.fullmatch(r"[0-9a-f]{40}", implementation.commit):
        revision["commit"] = implementation.commit
    if implementation.version:
        revision["version"] = implementation.version[:SHORT_LIMIT]
    call: dict[str, Any] = {"language": key_of(implementation.language)}
    if implementation.symbol:
        call["symbol"] = implementation.symbol[:NAME_LIMIT]
    dtypes = sorted({dtype_of(t.dtype, curation) for t in (*operation.inputs, *operation.outputs)})
    support: dict[str, Any] = {
        "hardwareArchitectures": sorted({key_of(a) for a in implementation.architectures}),
        "dtypes": dtypes,
    }
    if implementation.products:
        support["productsTested"] = sorted({p[:SHORT_LIMIT] for p in implementation.products})
    spec: dict[str, Any] = {
        "projectRevision": revision,
        "operation": {"specDigest": operation_digest},
        "callable": call,
        "support": support,
        "licensing": {},
    }
    if implementation.source_digest:
        spec["source"] = {"contentDigest": implementation.source_digest}
    name = name_of(implementation.project.name, implementation.name, operation.name)
    return _manifest(
        "ImplementationRevision",
        name,
        spec,
        title=f"{operation.title or operation.name} · {implementation.name}"[:NAME_LIMIT],
        labels={"provider": implementation.name[:NAME_LIMIT]},
    )


def protocol_manifest(protocol: Protocol) -> dict[str, Any]:
    harness: dict[str, Any] = {"name": protocol.harness}
    if protocol.harness_version:
        harness["version"] = protocol.harness_version
    if protocol.repository:
        harness["repository"] = protocol.repository
    if protocol.commit and re.fullmatch(r"[0-9a-f]{40}", protocol.commit):
        harness["commit"] = protocol.commit
    measurement: dict[str, Any] = {
        "timer": key_of(protocol.timer),
        "primaryStatistic": key_of(protocol.primary_statistic),
    }
    if protocol.samples:
        measurement["samples"] = protocol.samples
    if protocol.warmup_iterations is not None:
        measurement["warmupIterations"] = protocol.warmup_iterations
    if protocol.compile_included is not None:
        measurement["compileIncluded"] = protocol.compile_included
    comparability: dict[str, Any] = {"family": key_of(protocol.family)}
    if protocol.notes:
        comparability["notes"] = protocol.notes[:2000]
    spec = {"harness": harness, "measurement": measurement, "comparability": comparability}
    name = name_of(protocol.family, protocol.primary_statistic)
    return _manifest("BenchmarkProtocol", name, spec)


def environment_manifest(environment: Environment, curation: Curation) -> dict[str, Any]:
    software: dict[str, Any] = {}
    if environment.driver:
        software["driver"] = environment.driver[:SHORT_LIMIT]
    if environment.cuda:
        software["cudaToolkit"] = environment.cuda[:SHORT_LIMIT]
    if environment.framework:
        framework, version = environment.framework
        software["framework"] = {"name": key_of(framework), "version": version[:SHORT_LIMIT]}
    if environment.libraries:
        software["libraries"] = {
            key_of(k): str(v)[:SHORT_LIMIT] for k, v in sorted(environment.libraries.items())
        }
    hardware = hardware_of(environment, curation)
    labels = {} if is_curated_gpu(environment, curation) else gap_labels([Gap.GPU])
    name = name_of(hardware["product"], hardware.get("formFactor", ""))
    return _manifest(
        "ExecutionEnvironment",
        name,
        {"hardware": hardware, "software": software},
        labels=labels,
    )


def run_manifest(
    observation: Observation, digests: Mapping[str, str], name: str, gaps: Sequence[Gap] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "implementationDigest": digests["ImplementationRevision"],
        "workloadDigest": digests["WorkloadCase"],
        "protocolDigest": digests["BenchmarkProtocol"],
        "environmentDigest": digests["ExecutionEnvironment"],
        "status": observation.status,
    }
    if observation.correctness is not None:
        spec["correctness"] = dict(observation.correctness)
    latency = {
        s: observation.latency_ns[s] for s in LATENCY_STATISTICS if s in observation.latency_ns
    }
    if latency:
        timing: dict[str, Any] = {
            "primaryStatistic": key_of(observation.protocol.primary_statistic),
            "latencyNs": latency,
        }
        if observation.samples:
            timing["samples"] = observation.samples
        spec["timing"] = timing
    if observation.measurements:
        spec["measurements"] = [_measurement(m) for m in observation.measurements]
    native: dict[str, Any] = {"source": observation.source}
    if observation.benchmark:
        native["benchmark"] = observation.benchmark[:NAME_LIMIT]
    native["externalId"] = observation.external_id[:500]
    if observation.native_metrics:
        native["metrics"] = {key_of(k): v for k, v in sorted(observation.native_metrics.items())}
    spec["sourceNative"] = native
    spec["observedAt"] = observation.observed_at
    labels = {"mode": observation.mode[:NAME_LIMIT]} if observation.mode else {}
    for key, value in (*observation.parameters.items(), *observation.labels.items()):
        labels[key_of(key)] = str(value)[:NAME_LIMIT]
    labels.update(gap_labels(gaps))  # after the format's own: the policy's labels stand
    return _manifest("BenchmarkRun", name, spec, labels=labels)


def _measurement(measurement: Measurement) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metric": key_of(measurement.metric),
        "unit": key_of(measurement.unit),
        "statistic": key_of(measurement.statistic),
        "value": measurement.value,
    }
    if measurement.samples:
        body["sampleCount"] = measurement.samples
    return body


# --- an observation's outcome --------------------------------------------------------------


def record_of(manifest: dict[str, Any]) -> Record:
    return Record(manifest["kind"], manifest_digest(manifest), manifest)


def frozen(value: Any) -> Hashable:
    """A hashable stand-in for an observation's part (dataclasses, mappings, sequences)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if is_dataclass(value):
        return (type(value).__name__, *(frozen(getattr(value, f.name)) for f in fields(value)))
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), frozen(v)) for k, v in value.items()))
    return tuple(frozen(v) for v in value)


class BuiltRecords:
    """The records already built from equal parts: the runs of a file share their operation,
    project, protocol and environment, built and hashed once. Bounded; cleared when the
    curation changes (it is part of what a record says)."""

    LIMIT = 4096

    def __init__(self) -> None:
        self.curation: Curation | None = None
        self.records: dict[Hashable, Record] = {}
        self.keys: dict[int, tuple[Any, Hashable]] = {}

    def reset(self, curation: Curation) -> BuiltRecords:
        self.curation, self.records, self.keys = curation, {}, {}
        return self

    def key(self, part: Any) -> Hashable:
        """A part's hashable stand-in; a part a source passes again (its operation, protocol)
        is frozen once. Each key holds its part, so that part's id is not reused meanwhile."""
        if not is_dataclass(part):
            return frozen(part)
        held = self.keys.get(id(part))
        if held is None or held[0] is not part:
            held = self.keys[id(part)] = (part, frozen(part))
        return held[1]

    def record(self, builder: Callable[..., dict[str, Any]], *parts: Any) -> Record:
        key = (builder.__name__, *(self.key(p) for p in parts if not isinstance(p, Curation)))
        found = self.records.get(key)
        if found is None:
            if len(self.records) >= self.LIMIT:
                self.records.clear()
                self.keys.clear()
            found = self.records[key] = record_of(builder(*parts))
        return found


_BUILT = BuiltRecords()


def observation_outcome(observation: Observation, curation: Curation | None = None) -> RowOutcome:
    """The run an observation states, and every manifest it references (the run first), or a
    quarantine row naming the first manifest the schema refuses."""
    curation = curation or load_curation()
    built = _BUILT if _BUILT.curation is curation else _BUILT.reset(curation)
    implementation = observation.implementation
    operation = built.record(operation_manifest, observation.operation, curation)
    others = [
        built.record(
            workload_manifest,
            observation.operation,
            operation.digest,
            observation.workload_axes,
            curation,
        ),
        built.record(project_manifest, implementation.project),
        built.record(
            implementation_manifest,
            implementation,
            observation.operation,
            operation.digest,
            curation,
        ),
        built.record(protocol_manifest, observation.protocol),
        built.record(environment_manifest, observation.environment, curation),
    ]
    referenced = [operation, *others]
    digests = {r.kind: r.digest for r in referenced}
    name = name_of(observation.source, observation.external_id)
    run = record_of(run_manifest(observation, digests, name, gaps_of(observation, curation)))
    records = [run, *referenced]
    problem = first_invalid(records)
    if problem is not None:
        return quarantined(
            observation.line, observation.pointer, observation.raw, Reason.INVALID_RECORD, problem
        )
    return RowOutcome(
        observation.line,
        "ok",
        observation.raw,
        records=records,
        facts=run_facts_of(observation, records, curation),
        pointer=observation.pointer,
    )


def manifest_outcome(
    line: int, pointer: str, raw: str, manifests: Sequence[dict[str, Any]]
) -> RowOutcome:
    """An entry that states manifests but no run (a FlashInfer definition): they reach the
    index on their own."""
    records = [record_of(m) for m in manifests]
    problem = first_invalid(records)
    if problem is not None:
        return quarantined(line, pointer, raw, Reason.INVALID_RECORD, problem)
    return RowOutcome(line, "ok", raw, records=records, pointer=pointer)


# Digests of manifests found valid: the records a file's runs share (its operation, project,
# protocol, environment) are checked once, not once per run. A digest names its content.
_VALID: set[str] = set()
_VALID_LIMIT = 1 << 16


def first_invalid(records: Sequence[Record]) -> str | None:
    """What the schema refuses in the first invalid record ("<kind> <pointer>: <message>")."""
    for record in records:
        if record.digest in _VALID:
            continue
        problem = first_schema_error(record.manifest)
        if problem is not None:
            return f"{record.kind} {problem[0] or '/'}: {problem[1]}"
        if len(_VALID) >= _VALID_LIMIT:
            _VALID.clear()
        _VALID.add(record.digest)
    return None


def quarantined(line: int, pointer: str, raw: str, reason: str, detail: str) -> RowOutcome:
    return RowOutcome(line, "quarantined", raw, reason, detail, pointer=pointer)


Entry = Observation | RowOutcome


def observe(
    value: Any,
    line: int,
    pointer: str,
    build: Callable[[Any], Entry | Iterable[Entry]],
    raw: str | None = None,
) -> list[Entry]:
    """What one record of a file says, or its quarantine row: a record that holds NaN or a
    duplicate key, or that its format's reader cannot make sense of, is quarantined alone and
    its neighbours land. `line`: the record's own line where the reader knows it. `raw`: its
    text where the reader has it (a line of JSON Lines), else it is written from the value."""
    line = getattr(value, "line", None) or line
    raw = raw_text(value) if raw is None else raw
    problem = defect(value)
    if problem is not None:
        return [quarantined(line, pointer, raw, *problem)]
    try:
        built = build(value)
    except ObservationError as error:
        return [quarantined(line, pointer, raw, error.reason, error.detail)]
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        detail = f"{type(error).__name__}: {error}"
        return [quarantined(line, pointer, raw, Reason.MALFORMED_RECORD, detail)]
    entries = [built] if isinstance(built, Observation | RowOutcome) else list(built)
    return [
        replace(e, line=line, pointer=pointer, raw=raw) if isinstance(e, Observation) else e
        for e in entries
    ]


def number(value: Any, what: str) -> float:
    """A number a format wrote as a number or as a string of one (nvbench, TritonBench)."""
    if isinstance(value, bool):
        raise ObservationError(Reason.BAD_VALUE, f"{what} is {value!r}, not a number")
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ObservationError(Reason.BAD_VALUE, f"{what} is {value!r}, not a number") from None
    if not math.isfinite(result):
        raise ObservationError(Reason.NON_FINITE_NUMBER, f"{what} is {value!r}")
    if result < 0:
        raise ObservationError(Reason.BAD_VALUE, f"{what} is negative: {value!r}")
    return result


def run_facts_of(
    observation: Observation, records: Sequence[Record], curation: Curation
) -> RunFacts:
    """The readable columns of a measured run. A run whose primary number is not a latency (an
    instruction count, a throughput) is stored under that metric and unit, its value in the
    `median` column only when it is a median."""
    latency = observation.latency_ns
    hardware = hardware_of(observation.environment, curation)
    primary = key_of(observation.protocol.primary_statistic)
    if latency:
        metric, unit = "latency", "ns"
        median = latency.get("median")
    elif observation.measurements:
        first = observation.measurements[0]
        metric, unit = key_of(first.metric), key_of(first.unit)
        whole = first.statistic == "median" and float(first.value).is_integer()
        median = int(first.value) if whole else None
    else:
        metric, unit, median = UNSPECIFIED, UNSPECIFIED, None
    by_kind = {r.kind: r.manifest["spec"] for r in records}
    software = by_kind["ExecutionEnvironment"].get("software") or {}
    extra: dict[str, Any] = {
        "status": observation.status,
        "samples": observation.samples,
        "mean": latency.get("mean"),
        "p05": latency.get("p05"),
        "p95": latency.get("p95"),
        "min": latency.get("minimum"),
        "max": latency.get("maximum"),
        "mad": latency.get("mad"),
        "correctness": dict(observation.correctness) if observation.correctness else None,
        "software": software or None,
        "memory_bytes": hardware.get("memoryBytes"),
        "gpu_count": hardware.get("count"),
        "protocol_family": key_of(observation.protocol.family),
        "timer": key_of(observation.protocol.timer),
        "primary_statistic": primary,
        "project": observation.implementation.project.name,
        "implementation": observation.implementation.name,
        "implementation_version": observation.implementation.version,
        "pointer": observation.pointer,
        "source": observation.source,
    }
    case_axes = by_kind["WorkloadCase"]["axes"]
    dtypes = sorted({dtype_of(t.dtype, curation) for t in observation.operation.inputs})
    return RunFacts(
        metric=metric,
        unit=unit,
        kernel=family_of(observation.operation.family),
        provider=observation.implementation.name,
        mode=observation.mode or UNSPECIFIED,
        gpu=gpu_name(observation.environment),
        architecture=hardware["architecture"],
        dtype=dtypes[0] if len(dtypes) == 1 else None,
        case_key=case_key_of(case_axes, observation.parameters)
        or name_of(observation.operation.name),
        median=median,
        p20=None,
        p80=None,
        observed_at=observation.observed_at,
        external_id=observation.external_id[:500],
        liger_version=None,
        origin="measured",
        extra={k: v for k, v in extra.items() if v is not None},
    )
