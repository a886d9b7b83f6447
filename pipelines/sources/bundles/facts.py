"""The readable columns of a worker-measured run (RunFacts), read from its records.

Bundles carry what Liger's CSV does not; it goes into `RunFacts.extra` under these keys:
`status`, `samples`, `mean`, `p05`, `p95`, `min`, `max`, `mad`, `ci95_low`, `ci95_high` (ns),
`correctness` (the run's correctness object), `software` (the environment's software object:
driver, cudaToolkit, framework, libraries...), `settings` (device settings), `memory_bytes`,
`gpu_count`, `protocol_family`, `timer`, `warmup_iterations`, `project`, `implementation`,
`implementation_version`, `implementation_commit`, `pointer` (JSON pointer of the run).
"""

from __future__ import annotations

from typing import Any

from pipelines.records import Record, RunFacts

UNKNOWN = "unknown"


def _dig(value: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _first(records: list[Record], kind: str) -> dict[str, Any]:
    return next((r.manifest for r in records if r.kind == kind), {})


def _label(manifest: dict[str, Any], name: str) -> str | None:
    value = _dig(manifest, "metadata", "labels", name)
    return value if isinstance(value, str) else None


def median_ns(run_spec: dict[str, Any]) -> int | None:
    median = _dig(run_spec, "timing", "latencyNs", "median")
    if isinstance(median, int):
        return median
    for measurement in run_spec.get("measurements") or []:
        if (measurement.get("metric"), measurement.get("unit"), measurement.get("statistic")) == (
            "latency",
            "ns",
            "median",
        ) and float(measurement.get("value", 0.5)).is_integer():
            return int(measurement["value"])
    return None


def dtype_of(workload_spec: dict[str, Any]) -> str | None:
    for tensor in (workload_spec.get("tensors") or {}).values():
        if isinstance(tensor, dict) and isinstance(tensor.get("dtype"), str):
            return str(tensor["dtype"])
    return None


def case_key_of(workload: dict[str, Any]) -> str:
    """Like Liger's case keys (`tokens4096-vocab128256-fp32`): the axes in order, then the dtype."""
    label = _label(workload, "case_key")
    if label:
        return label
    spec = workload.get("spec") or {}
    parts = [f"{name}{value}" for name, value in (spec.get("axes") or {}).items()]
    dtype = dtype_of(spec)
    if dtype:
        parts.append(dtype)
    return "-".join(parts) or _dig(workload, "metadata", "name") or UNKNOWN


def run_facts(records: list[Record], pointer: str | None = None) -> RunFacts | None:
    """Facts of the run that `records` start with; None when it carries no median latency."""
    run = records[0].manifest
    spec = run["spec"]
    median = median_ns(spec)
    if median is None:
        return None
    operation = _first(records, "OperationSpec")
    workload = _first(records, "WorkloadCase")
    implementation = _first(records, "ImplementationRevision")
    protocol = _first(records, "BenchmarkProtocol")
    environment = _first(records, "ExecutionEnvironment")
    project = _first(records, "SoftwareProject")
    hardware = _dig(environment, "spec", "hardware") or {}
    latency = _dig(spec, "timing", "latencyNs") or {}
    interval = latency.get("confidence95") or [None, None]
    project_name = _dig(project, "metadata", "name")
    extra: dict[str, Any] = {
        "status": spec.get("status"),
        "samples": _dig(spec, "timing", "samples")
        or _dig(protocol, "spec", "measurement", "samples"),
        "mean": latency.get("mean"),
        "p05": latency.get("p05"),
        "p95": latency.get("p95"),
        "min": latency.get("minimum"),
        "max": latency.get("maximum"),
        "mad": latency.get("mad"),
        "ci95_low": interval[0],
        "ci95_high": interval[1] if len(interval) > 1 else None,
        "correctness": spec.get("correctness"),
        "software": _dig(environment, "spec", "software"),
        "settings": _dig(environment, "spec", "settings"),
        "memory_bytes": hardware.get("memoryBytes"),
        "gpu_count": hardware.get("count"),
        "protocol_family": _dig(protocol, "spec", "comparability", "family"),
        "timer": _dig(protocol, "spec", "measurement", "timer"),
        "warmup_iterations": _dig(protocol, "spec", "measurement", "warmupIterations"),
        "project": project_name,
        "implementation": _dig(implementation, "metadata", "name"),
        "implementation_version": _dig(implementation, "spec", "projectRevision", "version"),
        "implementation_commit": _dig(implementation, "spec", "projectRevision", "commit"),
        "pointer": pointer,
    }
    return RunFacts(
        metric="latency",
        unit="ns",
        kernel=_dig(operation, "spec", "family") or _dig(operation, "metadata", "name") or UNKNOWN,
        provider=project_name
        or _label(implementation, "provider")
        or _dig(implementation, "metadata", "name")
        or UNKNOWN,
        mode=_label(run, "mode") or _label(protocol, "mode") or "unspecified",
        gpu=hardware.get("product") or UNKNOWN,
        architecture=hardware.get("architecture") or UNKNOWN,
        dtype=dtype_of(workload.get("spec") or {}),
        case_key=case_key_of(workload) if workload else UNKNOWN,
        median=median,
        p20=None,
        p80=None,
        observed_at=spec["observedAt"],
        external_id=_dig(spec, "sourceNative", "externalId") or _dig(run, "metadata", "name"),
        liger_version=_label(run, "liger_version"),
        origin="measured",
        extra={key: value for key, value in extra.items() if value is not None},
    )
