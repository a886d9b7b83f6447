"""FlashInfer-Trace (flashinfer-ai/flashinfer-bench): definitions, solutions and traces, each
recognized by what it holds.

A definition (`definitions/<op_type>/<name>.json`) states an operation once: its axes, tensors
and a Python reference.

    {"name": "gemm_n128_k2048", "op_type": "gemm", "tags": ["status:verified"],
     "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 128}, ...},
     "inputs": {"A": {"shape": ["M", "K"], "dtype": "float16"}, ...}, "outputs": {...},
     "reference": "import torch\\ndef run(A, B): ...", "description": "..."}

It is one OperationSpec, named by `operation_name` (`flashinfer-<definition name>`), with no run.

A trace file (JSON Lines, `traces/<op_type>/<definition>.jsonl`) holds one evaluation a line:

    {"definition": "gemm_n128_k2048", "workload": {"axes": {"M": 6}, "inputs": {...},
     "uuid": "6ba7..."}, "solution": "gpt-5_gemm_...", "evaluation": {"status": "PASSED",
     "environment": {"hardware": "NVIDIA A800-SXM4-80GB", "libs": {"torch": "2.9.1+cu130",
     "triton": "3.5.1", "cuda": "13.0"}}, "timestamp": "2026-03-17T14:19:52.543776",
     "log": "...", "correctness": {"max_relative_error": 0.0, "max_absolute_error": 0.0,
     "extra": null}, "performance": {"latency_ms": 0.0921, "reference_latency_ms": 0.0170,
     "speedup_factor": 0.185}}}

One run a line, read line by line. A trace names its definition, which holds the constant axes
and the dtypes: the index is asked for the definition's OperationSpec by name
(`SourceContext.manifest_named`: the definitions among the files of the same batch, then the
index) and the operation is rebuilt from it, so a run is the same whichever file brought the
definition and whenever (`offers`: what a definition file gives the files beside it). A trace
whose definition is found nowhere yet is quarantined (`awaiting_definition`), and the file's
record set is written under a version that names the definitions it resolved (`version_of`): once
a definition lands, the waiting file is due again and its next read finds it. A line with a
workload but no solution nor evaluation (a workload file) is the definition's WorkloadCase, with
no run.

A solution (`solutions/<author>/<op_type>/<definition>/<name>.json`) is code for a definition:
its language, entry point, author and sources. A run's implementation is built from what the
trace says, the solution's name and the definition; a solution file states that same
ImplementationRevision (it needs the definition as a trace does), so the index holds it
whichever file arrives first. What only the solution file says (language, author, sources,
target hardware) is not folded into it: were it, a trace's run would differ by whether its
solution had arrived.

Every schema generation is read. The 2025 dataset schema (flashinfer_bench/trace.py and
benchmark.py before the September 2025 rewrite) has no workload `uuid`: a trace's workload is
then named by a digest of what it holds (its axes and inputs), so one workload is one case
whichever file holds it. Its environment names the GPU as `device` (later `hardware`); in July
2025 `device` was the torch device (`cuda:0`) and the GPU's name `libs.device_name`.

What the format lacks: the timer (flashinfer-bench times with CUPTI when it is installed, else
CUDA events; only a trace's log may say which), the trial count and any spread of the latency
(`latency_ms` is a mean of per-trial medians, `evaluators/default.py`), the GPU driver, and the
tolerances correctness was judged with. A failed trace has no performance, a compile or runtime
error no correctness either. `evaluation.log`, `performance.profile` and `correctness.extra`
are not read.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipelines.curation import load
from pipelines.records import RowOutcome
from pipelines.records.canonical import manifest_digest
from pipelines.records.rules import NAME_LIMIT, UNSPECIFIED, Reason, key_of, name_of
from pipelines.sources.json_input import (
    JsonInputError,
    KeyedObject,
    Marks,
    head_text,
    raw_text,
    read_document,
    read_lines,
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
    RunStatus,
    Tensor,
    implementation_manifest,
    manifest_outcome,
    number,
    observe,
    operation_manifest,
    project_manifest,
    quarantined,
    to_ns,
    utc_instant,
    workload_manifest,
)
from pipelines.sources.source import HarnessSource, SourceContext, record_set_of_outcomes

if TYPE_CHECKING:
    from pipelines.curation import Curation
    from pipelines.records.record_objects import RecordSetContent

SOURCE = "flashinfer-trace"
REPOSITORY = "https://github.com/flashinfer-ai/flashinfer-bench"
AWAITING_DEFINITION = Reason.AWAITING_DEFINITION

# The project a solution belongs to: a trace names the solution only, not who wrote it.
SOLUTIONS = Project("FlashInfer-Trace solutions")
PROTOCOL = Protocol(
    harness="flashinfer-bench",
    repository=REPOSITORY,
    timer=UNSPECIFIED,
    primary_statistic="mean",
    family="flashinfer_bench",
    notes=(
        "flashinfer-bench's evaluation: latency_ms is the mean over trials of each trial's "
        "median time, in ms (evaluators/default.py), timed with CUPTI when installed, else "
        "CUDA events (the trace does not say which); reference_latency_ms times the "
        "definition's reference the same way; speedup_factor is their ratio."
    ),
)

# FlashInfer's EvaluationStatus → a run's status.
STATUSES: dict[str, RunStatus] = {
    "PASSED": "passed",
    "INCORRECT_SHAPE": "incorrect_shape",
    "INCORRECT_NUMERICAL": "incorrect_numerical",
    "INCORRECT_DTYPE": "incorrect_dtype",
    "RUNTIME_ERROR": "runtime_error",
    "COMPILE_ERROR": "compile_error",
    "TIMEOUT": "timeout",
}
# The 2025 evaluator (benchmark.py before September 2025) had one status for outputs that failed
# its allclose comparison; the run keeps the status as written in a label.
STATUSES_2025: dict[str, RunStatus] = {"INCORRECT": "incorrect_numerical"}
COMPARATOR = "allclose"  # how flashinfer-bench judges outputs against the reference's
# Errors flashinfer-bench writes as strings when they are not finite (ser_json_inf_nan).
_NON_FINITE_TEXT = {"nan", "inf", "-inf", "infinity", "-infinity"}

_BUNDLE = re.compile(r'"apiVersion"\s*:\s*"kernelindex\.dev/')
# A trace line: its definition's name and its workload (any key order).
_TRACE_DEFINITION = re.compile(r'"definition"\s*:\s*"')
_TRACE_WORKLOAD = re.compile(r'"workload"\s*:\s*\{')
# A definition: axes typed var or const, and tensors.
_DEFINITION_AXES = re.compile(
    r'"axes"\s*:\s*\{\s*"[^"\\]+"\s*:\s*\{[^{}]*"type"\s*:\s*"(?:var|const)"'
)
_DEFINITION_TENSORS = re.compile(r'"(?:inputs|outputs)"\s*:\s*\{')
# A solution: the definition it implements, its sources and how it is called.
_SOLUTION_SOURCES = re.compile(r'"sources"\s*:\s*\[')
_SOLUTION_SPEC = re.compile(r'"(?:entry_point|author)"\s*:\s*"')
# A trace line that starts with its definition's name (as flashinfer-bench writes them).
_LEADING_DEFINITION = re.compile(rb'^\s*\{\s*"definition"\s*:\s*("(?:[^"\\]|\\.)*")')

MARKS = Marks.of(
    (r'"definition"\s*:\s*"', "no definition named"),
    (r'"workload"\s*:\s*\{', "no workload"),
    (r'"evaluation"\s*:', "no evaluation"),
    (r'"op_type"\s*:', "no op_type"),
    (r'"sources"\s*:\s*\[', "no sources"),
)

Kind = Literal["traces", "definition", "solution"]
OperationLookup = Callable[[str], "Operation | None"]


def operation_name(definition: str) -> str:
    """The OperationSpec a FlashInfer definition is: the one naming rule, for the definition
    file and for the traces and solutions that name it."""
    return name_of("flashinfer", definition)


def kind_of(data: bytes) -> Kind | None:
    head = head_text(data)
    if head.startswith("[") and not _BUNDLE.search(head):
        # the first dataset (July 2025) held a list of definitions in one file
        first = head[1:].lstrip()
        if first.startswith("{") and _DEFINITION_AXES.search(head):
            return "definition" if _DEFINITION_TENSORS.search(head) else None
        return None
    if not head.startswith("{") or _BUNDLE.search(head):
        return None
    # a trace line: any of the first lines (the first may be a bad one), each a whole object
    lines = head.split("\n")[:-1] or [head]
    if any(_TRACE_DEFINITION.search(x) and _TRACE_WORKLOAD.search(x) for x in lines[:64]):
        return "traces"
    if _DEFINITION_AXES.search(head) and _DEFINITION_TENSORS.search(head):
        return "definition"
    if (
        _TRACE_DEFINITION.search(head)
        and _SOLUTION_SOURCES.search(head)
        and _SOLUTION_SPEC.search(head)
    ):
        return "solution"
    return None


class FlashInferTrace(HarnessSource):
    name = "flashinfer-trace"
    format_version = "kindex-flashinfer/2"
    reads_index = True  # a trace names its definition, which another file carries

    title = "FlashInfer-Trace"
    marks = MARKS  # how near a file comes; what it lacks is one of three kinds, not a mark
    shape = (
        "no trace line (a definition's name and a workload on its first line), definition "
        "(axes typed var or const, and tensors) nor solution (a definition, sources and an "
        "entry point or author)"
    )

    def shows(self, head: str) -> bool:
        return kind_of(head.encode()) is not None

    def lacks(self, head: str) -> str | None:
        return None if self.shows(head) else self.shape

    def version_of(self, data: bytes, context: SourceContext) -> str:
        """The parser version, and for traces and solutions the definitions the index resolved
        for them: the file's records change when one arrives."""
        version = self.parser_version()
        if kind_of(data) == "definition":
            return version
        lookup = _Definitions(context)
        digests = set()
        try:
            for definition in definitions_named(data):
                try:
                    found = lookup.get(definition)
                except ObservationError:  # the index's OperationSpec cannot be read
                    continue
                if found is not None:
                    digests.add(manifest_digest(operation_manifest(found, lookup.curation)))
        except JsonInputError:
            pass
        if not digests:
            return f"{version}+defs-none"
        text = "\n".join(sorted(digests)).encode()
        return f"{version}+defs-{hashlib.sha256(text).hexdigest()[:12]}"

    def may_offer(self, head: bytes) -> bool:
        return kind_of(head) == "definition"

    def offers(self, data: bytes) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """What a definition file offers the files beside it: (kind, name, manifest) of each
        record it states, the OperationSpec its traces and solutions name. Other files: none."""
        if kind_of(data) != "definition":
            return
        for outcome in self.outcomes(data, SourceContext()):
            for record in outcome.records:
                yield record.kind, record.manifest["metadata"]["name"], record.manifest

    def record_set(
        self, data: bytes, snapshot_digest: str, context: SourceContext, parts_dir: Path
    ) -> RecordSetContent:
        # One index lookup per definition for both the version and the records.
        context = replace(context, manifest_named=_memo(context.manifest_named))
        version = self.version_of(data, context)
        outcomes = self.outcomes(data, context)
        return record_set_of_outcomes(outcomes, snapshot_digest, version, parts_dir)

    def entries(self, data: bytes, context: SourceContext) -> Iterator[Entry]:
        kind = kind_of(data)
        if kind == "definition":
            document = read_document(data, named=FlashInferTrace.title)
            if isinstance(document, list):
                for i, each in enumerate(document):
                    for entry in observe(each, 1, f"/{i}", _definition_outcome):
                        yield replace(entry, pointer=f"/{i}")
            else:
                yield from observe(document, 1, "", _definition_outcome)
        elif kind == "solution":
            document = read_document(data, named=FlashInferTrace.title)
            lookup = _Definitions(context)
            yield from observe(document, 1, "", lambda d: _solution_outcome(d, lookup))
        else:
            yield from trace_entries(data, _Definitions(context).get)


# --- definitions ------------------------------------------------------------------------------


def operation_of_definition(document: Any) -> Operation:
    """The operation a definition states."""
    if not isinstance(document, dict):
        raise ObservationError(Reason.MALFORMED_RECORD, "a definition is an object")
    name = _text(document, "name")
    family = document.get("op_type", document.get("type"))
    if not isinstance(family, str) or not family.strip():
        raise ObservationError(Reason.MISSING_FIELD, "no op_type")
    axes_doc = document.get("axes")
    if not isinstance(axes_doc, dict) or not axes_doc:
        raise ObservationError(Reason.MISSING_FIELD, "no axes")
    axes: dict[str, int | None] = {}
    for axis, spec in axes_doc.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind == "var":
            axes[axis] = None
        elif kind == "const":
            value = spec.get("value")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ObservationError(Reason.BAD_VALUE, f"axis {axis!r} has value {value!r}")
            axes[axis] = value
        else:
            raise ObservationError(Reason.BAD_VALUE, f"axis {axis!r} is neither var nor const")
    reference = document.get("reference")
    description = document.get("description")
    return Operation(
        name=operation_name(name),
        family=family,
        title=name[:NAME_LIMIT],
        description=description if isinstance(description, str) and description else None,
        axes=axes,
        inputs=_tensors(document, "inputs", axes),
        outputs=_tensors(document, "outputs", axes),
        reference_language="python" if isinstance(reference, str) and reference else None,
        labels=_labels(document.get("tags")),
    )


def _tensors(document: dict[str, Any], field: str, axes: Mapping[str, Any]) -> tuple[Tensor, ...]:
    tensors = document.get(field)
    if not isinstance(tensors, dict) or not tensors:
        raise ObservationError(Reason.MISSING_FIELD, f"no {field}")
    result = []
    for name, spec in tensors.items():
        if not isinstance(spec, dict):
            raise ObservationError(Reason.BAD_VALUE, f"{field} {name!r} is not an object")
        dtype = spec.get("dtype", UNSPECIFIED)  # the first definitions stated none
        if not isinstance(dtype, str) or not dtype:
            raise ObservationError(Reason.BAD_VALUE, f"{field} {name!r} has dtype {dtype!r}")
        shape = spec.get("shape")
        if shape is None:  # a scalar
            shape = []
        if not isinstance(shape, list) or any(a not in axes for a in shape):
            raise ObservationError(Reason.BAD_VALUE, f"{field} {name!r} names an axis not defined")
        result.append(Tensor(name, tuple(shape), dtype))
    return tuple(result)


_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def _labels(tags: Any) -> dict[str, str]:
    """Tags written `key:value` whose key is a label key; a key given twice joins its values."""
    labels: dict[str, str] = {}
    for tag in tags if isinstance(tags, list) else []:
        if not isinstance(tag, str) or ":" not in tag:
            continue
        key, _, value = tag.partition(":")
        if not _LABEL_KEY.match(key) or not value:
            continue
        joined = f"{labels[key]},{value}" if key in labels else value
        if len(joined) <= NAME_LIMIT:
            labels[key] = joined
    return labels


def _definition_outcome(document: Any) -> RowOutcome:
    manifest = operation_manifest(operation_of_definition(document), load())
    return manifest_outcome(1, "", raw_text(document), [manifest])


def operation_of_manifest(manifest: Mapping[str, Any]) -> Operation:
    """The operation an OperationSpec states, as `operation_manifest` would build it again:
    `operation_manifest(operation_of_manifest(m))` is `m`."""
    metadata = manifest["metadata"]
    spec = manifest["spec"]
    axes = {
        axis: (body.get("value") if body.get("role") == "constant" else None)
        for axis, body in spec["axes"].items()
    }
    reference = spec.get("reference") or {}
    return Operation(
        name=metadata["name"],
        family=spec["family"],
        title=metadata.get("title"),
        description=metadata.get("description"),
        axes=axes,
        inputs=_tensors_of_manifest(spec["inputs"]),
        outputs=_tensors_of_manifest(spec["outputs"]),
        reference_language=reference.get("language"),
        labels=dict(metadata.get("labels") or {}),
    )


def _tensors_of_manifest(items: list[dict[str, Any]]) -> tuple[Tensor, ...]:
    tensors = []
    for item in items:
        if "tensor" in item:
            body = item["tensor"]
            tensors.append(Tensor(item["name"], tuple(body["shape"]), body["dtype"]))
        elif "scalar" in item:
            tensors.append(Tensor(item["name"], (), item["scalar"]["dtype"]))
        # an item with neither stands for "none named": operation_manifest writes it again
    return tuple(tensors)


class _Definitions:
    """The operations of the definitions a file names, each looked up in the index once."""

    def __init__(self, context: SourceContext) -> None:
        self.context = context
        self.curation: Curation = load()
        self.found: dict[str, Operation | ObservationError | None] = {}

    def get(self, definition: str) -> Operation | None:
        if definition not in self.found:
            self.found[definition] = self._lookup(definition)
        found = self.found[definition]
        if isinstance(found, ObservationError):
            raise found
        return found

    def _lookup(self, definition: str) -> Operation | ObservationError | None:
        manifest = self.context.manifest_named("OperationSpec", operation_name(definition))
        if manifest is None:
            return None
        try:
            return operation_of_manifest(manifest)
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            detail = f"definition {definition}'s OperationSpec cannot be read: {error!r}"
            return ObservationError(Reason.INVALID_DEFINITION, detail)


def _memo(named: Callable[[str, str], dict[str, Any] | None]) -> Callable[..., Any]:
    seen: dict[tuple[str, str], dict[str, Any] | None] = {}

    def lookup(kind: str, name: str) -> dict[str, Any] | None:
        if (kind, name) not in seen:
            seen[kind, name] = named(kind, name)
        return seen[kind, name]

    return lookup


def _awaiting(definition: str) -> ObservationError:
    return ObservationError(AWAITING_DEFINITION, f"waits for definition {definition}")


def definitions_named(data: bytes) -> Iterator[str]:
    """The definitions a traces or solution file names, in file order (repeats included). A
    trace line that starts with its definition (as flashinfer-bench writes them) is not parsed
    whole; another line is."""
    if kind_of(data) == "solution":
        document = read_document(data, named=FlashInferTrace.title)
        if isinstance(document, dict) and isinstance(document.get("definition"), str):
            yield document["definition"]
        return
    data = unpacked(data)
    start, size = 0, len(data)
    while start < size:
        end = data.find(b"\n", start)
        end = size if end < 0 else end
        line = data[start:end]
        start = end + 1
        match = _LEADING_DEFINITION.match(line, 0, 4096)
        if match:
            try:
                name = json.loads(match.group(1))
            except ValueError:
                continue
            if isinstance(name, str):
                yield name
            continue
        for parsed in read_lines(line):
            value = parsed.value
            if isinstance(value, dict) and isinstance(value.get("definition"), str):
                yield value["definition"]


# --- solutions --------------------------------------------------------------------------------


def implementation_of(solution: str) -> Implementation:
    """The implementation a trace's solution is: what a trace says of it, its name."""
    if not solution.strip():
        raise ObservationError(Reason.MISSING_FIELD, "no solution")
    return Implementation(solution[:NAME_LIMIT], SOLUTIONS)


def _solution_outcome(document: Any, lookup: _Definitions) -> RowOutcome:
    if not isinstance(document, dict):
        raise ObservationError(Reason.MALFORMED_RECORD, "a solution is an object")
    definition = _text(document, "definition")
    implementation = implementation_of(_text(document, "name"))
    operation = lookup.get(definition)
    if operation is None:
        raise _awaiting(definition)
    curation = lookup.curation
    operation_digest = manifest_digest(operation_manifest(operation, curation))
    manifests = [
        implementation_manifest(implementation, operation, operation_digest, curation),
        project_manifest(implementation.project),
    ]
    return manifest_outcome(1, "", raw_text(document), manifests)


# --- traces -----------------------------------------------------------------------------------


def trace_entries(data: bytes, operation_of: OperationLookup) -> Iterator[Entry]:
    """What each line of a traces file states, in order: a run, a workload, or why not.
    `operation_of(definition)`: the operation a definition's name stands for, None when unknown."""
    for line in read_lines(data):
        if line.error is not None:
            yield quarantined(line.line, "", line.text, line.error.reason, line.error.detail)
            continue
        build = partial(_trace, line=line.line, operation_of=operation_of)
        yield from observe(_unmeasured_dropped(line.value), line.line, "", build, raw=line.text)


def _unmeasured_dropped(trace: Any) -> Any:
    """The 2025 evaluator wrote Infinity for what a failed evaluation did not measure (its
    latencies, and a runtime error's errors) and a speedup of 0.0: those are absent, not
    numbers. A passed evaluation's Infinity stays, and is quarantined as any record's is."""
    evaluation = trace.get("evaluation") if isinstance(trace, dict) else None
    if not isinstance(evaluation, dict) or evaluation.get("status") in (None, "PASSED"):
        return trace
    performance = evaluation.get("performance")
    correctness = evaluation.get("correctness")
    latency = performance.get("latency_ms") if isinstance(performance, dict) else None
    if not (isinstance(latency, float) and math.isinf(latency)) or _has_duplicates(trace):
        return trace
    evaluation = {**evaluation, "performance": None}
    if isinstance(correctness, dict):
        evaluation["correctness"] = {
            k: v for k, v in correctness.items() if not (isinstance(v, float) and math.isinf(v))
        }
    return {**trace, "evaluation": evaluation}


def _trace(trace: Any, line: int, operation_of: OperationLookup) -> Entry:
    if not isinstance(trace, dict):
        raise ObservationError(Reason.MALFORMED_RECORD, "a trace is an object")
    definition = _text(trace, "definition")
    workload = trace.get("workload")
    if not isinstance(workload, dict):
        raise ObservationError(Reason.MISSING_FIELD, "no workload")
    axes = _workload_axes(workload.get("axes"))
    operation = operation_of(definition)
    if operation is None:
        raise _awaiting(definition)
    if trace.get("solution") is None and trace.get("evaluation") is None:
        return _workload_outcome(operation, axes, line, raw_text(trace))
    evaluation = trace.get("evaluation")
    if not isinstance(evaluation, dict):
        raise ObservationError(Reason.MISSING_FIELD, "no evaluation")
    solution = _text(trace, "solution")
    uuid = _workload_id(workload)
    native = str(evaluation.get("status"))
    status = STATUSES.get(native) or STATUSES_2025.get(native)
    if status is None:
        raise ObservationError(Reason.BAD_VALUE, f"unknown status {evaluation.get('status')!r}")
    labels = {"flashinfer_status": native} if native in STATUSES_2025 else {}
    timestamp = evaluation.get("timestamp")
    if not isinstance(timestamp, str) or not timestamp.strip():
        raise ObservationError(Reason.MISSING_FIELD, "no evaluation timestamp")
    correctness, nonfinite = _correctness(evaluation.get("correctness"))
    latency, measurements = _performance(evaluation.get("performance"))
    return Observation(
        source=SOURCE,
        external_id=f"{definition}/{solution}/{uuid}",
        operation=operation,
        workload_axes=axes,
        implementation=implementation_of(solution),
        protocol=PROTOCOL,
        environment=_environment(evaluation.get("environment")),
        observed_at=utc_instant(timestamp),
        status=status,
        latency_ns=latency,
        measurements=measurements,
        correctness=correctness,
        benchmark=definition,
        parameters=_inputs(workload.get("inputs")),
        labels=nonfinite | labels,
    )


def _has_duplicates(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, KeyedObject) and item.duplicates:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _workload_id(workload: Mapping[str, Any]) -> str:
    """The workload's uuid, or (2025's schema has none) a digest of its axes and inputs."""
    uuid = workload.get("uuid")
    if isinstance(uuid, str) and uuid:
        return uuid
    if "uuid" in workload:
        raise ObservationError(Reason.BAD_VALUE, f"workload uuid is {uuid!r}")
    content = {"axes": workload.get("axes"), "inputs": workload.get("inputs")}
    canonical = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
    return "workload-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


# A torch device (`cuda:0`), not a GPU's name: the 2025 schema's name is then in libs.
_DEVICE_TYPE = re.compile(r"^(?:cuda|cpu|hip|rocm|xpu|mps)(?::\d+)?$")


def _workload_outcome(
    operation: Operation, axes: Mapping[str, int], line: int, raw: str
) -> RowOutcome:
    """A workload line (no solution, no evaluation): the definition's case, with no run."""

    curation = load()
    operation_digest = manifest_digest(operation_manifest(operation, curation))
    manifest = workload_manifest(operation, operation_digest, axes, curation)
    return manifest_outcome(line, "", raw, [manifest])


def _workload_axes(axes: Any) -> dict[str, int]:
    if axes is None:
        return {}
    if not isinstance(axes, dict):
        raise ObservationError(Reason.BAD_VALUE, "workload axes are an object")
    result = {}
    for axis, value in axes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ObservationError(Reason.BAD_VALUE, f"workload axis {axis!r} is {value!r}")
        result[key_of(axis)] = value
    return result


def _inputs(inputs: Any) -> dict[str, str]:
    """How each input was made (`random`, `scalar`, `safetensors`), as run labels."""
    if not isinstance(inputs, dict):
        return {}
    return {
        f"input_{key_of(name)}": str(spec["type"])
        for name, spec in inputs.items()
        if isinstance(spec, dict) and isinstance(spec.get("type"), str)
    }


def _correctness(correctness: Any) -> tuple[dict[str, float | str] | None, dict[str, str]]:
    """The run's correctness, and the errors flashinfer-bench wrote as not finite (as text:
    `"NaN"`, an output that is not a number at all), which are run labels instead."""
    if correctness is None:
        return None, {}
    if not isinstance(correctness, dict):
        raise ObservationError(Reason.BAD_VALUE, "correctness is an object")
    result: dict[str, float | str] = {"comparator": COMPARATOR}
    nonfinite: dict[str, str] = {}
    for field, target in (
        ("max_absolute_error", "maximumAbsoluteError"),
        ("max_relative_error", "maximumRelativeError"),
    ):
        value = correctness.get(field)
        if value is None:
            continue
        if isinstance(value, str) and value.strip().lower() in _NON_FINITE_TEXT:
            nonfinite[field] = value.strip()
            continue
        result[target] = number(value, field)
    return result, nonfinite


def _performance(performance: Any) -> tuple[dict[str, int], tuple[Measurement, ...]]:
    if performance is None:
        return {}, ()
    if not isinstance(performance, dict):
        raise ObservationError(Reason.BAD_VALUE, "performance is an object")
    latency = {"mean": to_ns(number(performance.get("latency_ms"), "latency_ms"), "ms")}
    measurements = []
    reference = performance.get("reference_latency_ms")
    if reference is not None:
        reference_ns = to_ns(number(reference, "reference_latency_ms"), "ms")
        measurements.append(Measurement("reference_latency", "ns", "mean", reference_ns))
    speedup = performance.get("speedup_factor")
    if speedup is not None:
        ratio = number(speedup, "speedup_factor")
        measurements.append(Measurement("speedup", "ratio", "ratio_of_means", ratio))
    return latency, tuple(measurements)


def _environment(environment: Any) -> Environment:
    if not isinstance(environment, dict):
        raise ObservationError(Reason.MISSING_FIELD, "no environment")
    libs = environment.get("libs") or {}
    if not isinstance(libs, dict):
        raise ObservationError(Reason.BAD_VALUE, "environment libs are an object")
    versions = {str(k): str(v) for k, v in libs.items() if v is not None}
    if "hardware" in environment or "device" not in environment:
        hardware = _text(environment, "hardware")
    else:  # the 2025 schema
        hardware = _text(environment, "device")
        if _DEVICE_TYPE.match(hardware.strip().lower()) and versions.get("device_name"):
            hardware = versions.pop("device_name")
    torch = versions.pop("torch", None)
    cuda = versions.pop("cuda", None)
    return Environment(
        gpu=hardware,
        cuda=cuda,
        framework=("pytorch", torch) if torch else None,
        libraries=versions,
    )


def _text(document: Mapping[str, Any], field: str) -> str:
    value = document.get(field)
    if not isinstance(value, str) or not value.strip():
        raise ObservationError(Reason.MISSING_FIELD, f"no {field}")
    return value
