"""Steps 2–3 of the Liger source: turn each CSV record into kernelindex.dev/v1alpha1 records.

A row becomes a BenchmarkRun plus the six manifests it references, byte-identical (digest for
digest) to KernelIndex's own Liger importer for every row that importer imports. Memory rows,
which the importer skips, become runs under a memory protocol (see docs/memory-runs.md). Every
other row becomes a quarantine outcome with a stable reason code; no row is dropped unseen.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, BinaryIO

from pipelines import API_VERSION
from pipelines.canonical import (
    canonical_json_prechecked,
    digest_of_canonical,
    identity,
    manifest_digest,
    numbers_print_alike,
)
from pipelines.curation import Curation, ExpressionError, Kernel, load
from pipelines.liger.read import CsvRecord, LigerCsv, NotLigerCsv, open_liger_csv
from pipelines.records import Record, RowOutcome, RunFacts

PARSER_VERSION = "liger-csv/1"  # the code's version; see parser_version() for the full one
SOURCE = "liger-kernel-bench"
MIB = 2**20
NAME_LIMIT = 100  # metadata.name length the reference importer cuts at

__all__ = ["PARSER_VERSION", "NotLigerCsv", "normalize_bytes", "normalize_lines", "parser_version"]


def parser_version(curation: Curation | None = None) -> str:
    """The code's version plus the curation's fingerprint: records made by another curation (a
    GPU added since, say) are rebuilt by a backfill, not reused."""
    return f"{PARSER_VERSION}+{(curation or load()).fingerprint}"


# JavaScript's Number() grammar for decimal literals, without its leniencies Python adds
# (underscores, "nan", "infinity").
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})")
_SLUG_BREAK = re.compile(r"[^a-z0-9]+")


class RowRejected(Exception):
    """A row the normalizer cannot turn into records; becomes a quarantine outcome."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@lru_cache(maxsize=4096)
def slug(text: str) -> str:
    """Lowercase, every run of other characters one hyphen, none at the ends."""
    return _SLUG_BREAK.sub("-", text.lower()).strip("-")


def joined_slug(*parts: str) -> str:
    """slug("-".join(parts)) from cached per-part slugs (equal when no part slugs to empty)."""
    slugs = [slug(part) for part in parts]
    return "-".join(slugs) if all(slugs) else slug("-".join(parts))


def js_round(value: float) -> int:
    """JavaScript's Math.round: the nearest integer, halves toward +infinity."""
    floor = math.floor(value)
    return floor + 1 if value - floor >= 0.5 else floor


def parse_positive(text: str, column: str) -> float:
    if not _NUMBER.fullmatch(text.strip()):
        raise RowRejected("bad_number", f"{column} is not a number: {text[:80]!r}")
    value = float(text)
    if not math.isfinite(value):
        raise RowRejected("bad_number", f"{column} is out of range: {text[:80]!r}")
    if value <= 0:
        raise RowRejected("non_positive_value", f"{column} must be positive, got {text!r}")
    return value


@lru_cache(maxsize=1024)  # a benchmark script stamps all rows of one run alike
def parse_timestamp(text: str) -> tuple[str, str]:
    """Liger's naive timestamp, read as UTC: (observedAt, the form used in externalIds)."""
    match = _TIMESTAMP.fullmatch(text.strip())
    if not match:
        raise RowRejected("bad_timestamp", f"timestamp is not 'YYYY-MM-DD HH:MM:SS': {text[:80]!r}")
    year, month, day, hour, minute, second = match.groups()
    try:
        datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
    except ValueError as error:
        raise RowRejected("bad_timestamp", f"timestamp {text!r}: {error}") from None
    observed = f"{year}-{month}-{day}T{hour}:{minute}:{second}.000Z"
    return observed, f"{year}-{month}-{day}-{hour}-{minute}-{second}"


def _manifest(kind: str, metadata: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def _record(manifest: dict[str, Any]) -> Record:
    return Record(manifest["kind"], manifest_digest(manifest), manifest)


@dataclass(frozen=True, slots=True)
class Workload:
    case_key: str
    dtype: str
    record: Record


class Normalizer:
    """Builds records from rows; manifests shared by many rows are built once and cached."""

    def __init__(self, curation: Curation | None = None) -> None:
        self.curation = curation or load()
        self._operations = {k.name: _record(k.operation) for k in self.curation.kernels.values()}
        self.project = lru_cache(maxsize=None)(self._project)
        self.implementation = lru_cache(maxsize=None)(self._implementation)
        self.environment = lru_cache(maxsize=None)(self._environment)
        self.protocol = lru_cache(maxsize=None)(self._protocol)
        self.workload = lru_cache(maxsize=4096)(self._workload)
        self.series = lru_cache(maxsize=1024)(self._series)

    # --- shared manifests -------------------------------------------------------------------
    def operation(self, kernel: str) -> Record:
        return self._operations[kernel]

    def _project(self, provider: str) -> Record:
        entry = self.curation.providers[provider]
        return _record(
            _manifest("SoftwareProject", {"name": entry.project_slug}, dict(entry.project))
        )

    def _implementation(self, kernel_name: str, provider_name: str) -> Record:
        kernel = self.curation.kernels[kernel_name]
        provider = self.curation.providers[provider_name]
        metadata: dict[str, Any] = {
            "name": f"liger-bench-{slug(kernel_name)}-{slug(provider_name)}",
            "title": f"{kernel.title} · {provider.title}",
            "description": provider.description,
        }
        if provider.baseline:
            metadata["labels"] = {"role": "baseline"}
        metadata["sourceRefs"] = [{"url": self.curation.harness["repository"]}]
        spec = {
            "projectRevision": {},
            "operation": {"specDigest": self.operation(kernel_name).digest},
            **{k: v for k, v in provider.implementation.items() if k != "projectRevision"},
        }
        return _record(_manifest("ImplementationRevision", metadata, spec))

    def _environment(self, gpu_name: str) -> Record:
        gpu = self.curation.gpus[gpu_name]
        metadata = {
            "name": f"liger-bench-{slug(gpu_name)}",
            "title": f"Liger benchmark host · {gpu.title}",
        }
        return _record(
            _manifest(
                "ExecutionEnvironment", metadata, {"hardware": dict(gpu.hardware), "software": {}}
            )
        )

    def _protocol(self, metric: str, mode: str) -> Record:
        method, passing = self.curation.metrics[metric], self.curation.passes[mode]
        memory = metric == "memory"
        metadata = {
            "name": f"liger-bench-{'memory' if memory else 'do-bench'}-{mode}",
            "title": f"Liger benchmark harness · {passing.title}"
            + (" · peak memory" if memory else ""),
        }
        spec = {
            "harness": dict(self.curation.harness),
            "measurement": {"timer": method["timer"], "primaryStatistic": "median"},
            "comparability": {
                "family": method["family"],
                "notes": method["notes"].format(**{"pass": passing.timed}),
            },
        }
        return _record(_manifest("BenchmarkProtocol", metadata, spec))

    # --- the workload a row binds -----------------------------------------------------------
    def _workload(self, kernel_name: str, x_name: str, x_text: str, config_text: str) -> Workload:
        kernel = self.curation.kernels[kernel_name]
        config = _parse_config(config_text)
        axes, dtype, scalars = self._bind(kernel, x_name, x_text, config)
        case_key = "-".join(f"{name}{axes[name]}" for name in sorted(axes)) + f"-{dtype}"
        spec: dict[str, Any] = {
            "operationSpecDigest": self.operation(kernel_name).digest,
            "axes": axes,
            "tensors": _tensors(kernel, axes, dtype),
        }
        if scalars:
            spec["scalars"] = {
                name: {"dtype": "fp32", "value": value} for name, value in scalars.items()
            }
        spec["correctness"] = {"comparator": "not_asserted"}
        bound = ", ".join(f"{name}={value}" for name, value in axes.items())
        metadata = {
            "name": f"{kernel.slug}-{slug(case_key)}"[:NAME_LIMIT],
            "title": f"{kernel.title} · {bound} · {dtype}",
        }
        return Workload(case_key, dtype, _record(_manifest("WorkloadCase", metadata, spec)))

    def _bind(
        self, kernel: Kernel, x_name: str, x_text: str, config: dict[str, Any]
    ) -> tuple[dict[str, int], str, dict[str, float | int]]:
        binding = kernel.bindings.get(x_name)
        if binding is None:
            raise RowRejected(
                "unknown_config_shape",
                f"{kernel.name} has no curated binding for x_name {x_name!r}",
            )
        scalar_keys = frozenset().union(*(e.names for e in kernel.scalars.values()))
        allowed = binding.config_keys | scalar_keys | {"dtype"}
        _check_config_keys(kernel.name, x_name, allowed, binding.require, config)
        values = {k: v for k, v in config.items() if _is_integer(v)}
        values["x"] = _positive_integer(x_text, "x_value")
        try:
            axes = {
                axis: _axis_value(axis, expr.evaluate(values))
                for axis, expr in binding.axes.items()
            }
            scalars = {
                name: _scalar(name, expr.evaluate(config)) for name, expr in kernel.scalars.items()
            }
        except (ExpressionError, TypeError) as error:
            raise RowRejected("unknown_config_shape", f"{kernel.name}: {error}") from None
        return axes, self._dtype(kernel, config), scalars

    def _dtype(self, kernel: Kernel, config: dict[str, Any]) -> str:
        if "dtype" not in config:
            if kernel.default_dtype is None:
                raise RowRejected("unknown_config_shape", f"{kernel.name}: config names no dtype")
            return kernel.default_dtype
        dtype = (
            self.curation.dtypes.get(config["dtype"]) if isinstance(config["dtype"], str) else None
        )
        if dtype is None:
            raise RowRejected("unknown_config_shape", f"unknown dtype {config['dtype']!r}")
        return dtype

    # --- one row ----------------------------------------------------------------------------
    def normalize(self, row: dict[str, str]) -> tuple[list[Record], RunFacts]:
        series = self.series(
            row["kernel_name"],
            row["kernel_provider"],
            row["kernel_operation_mode"],
            row["gpu_name"],
            _metric(row["metric_name"], row["metric_unit"]),
        )
        stats = [parse_positive(row[c], c) for c in ("y_value_50", "y_value_20", "y_value_80")]
        observed_at, stamp = parse_timestamp(row["timestamp"])
        workload = self.workload(
            series.kernel, row["x_name"], row["x_value"], row["extra_benchmark_config_str"]
        )
        run, facts = series.run(stats, observed_at, stamp, workload, row["liger_version"].strip())
        operation, project, implementation, protocol, environment = series.references
        return [
            run,
            operation,
            project,
            implementation,
            workload.record,
            protocol,
            environment,
        ], facts

    def _series(self, kernel: str, provider: str, mode: str, gpu: str, metric: str) -> Series:
        """What every run of one kernel, provider, pass, GPU and metric shares."""
        self._check_known(kernel, provider, mode, gpu)
        return Series(
            kernel=kernel,
            provider=provider,
            mode=mode,
            gpu=gpu,
            memory=metric == "memory",
            kernel_title=self.curation.kernels[kernel].title,
            architecture=self.curation.gpus[gpu].hardware["architecture"],
            baseline=self.curation.providers[provider].baseline,
            references=(
                self.operation(kernel),
                self.project(provider),
                self.implementation(kernel, provider),
                self.protocol(metric, mode),
                self.environment(gpu),
            ),
        )

    def _check_known(self, kernel: str, provider: str, mode: str, gpu: str) -> None:
        curation = self.curation
        if kernel not in curation.kernels:
            raise RowRejected("unknown_kernel", f"kernel {kernel!r} is not curated")
        entry = curation.providers.get(provider)
        if entry is None or not entry.implements(kernel):
            raise RowRejected(
                "unknown_provider", f"provider {provider!r} is not curated for {kernel}"
            )
        if mode not in curation.passes:
            raise RowRejected(
                "unknown_mode",
                f"kernel_operation_mode {mode!r} is not one of {sorted(curation.passes)}",
            )
        if gpu not in curation.gpus:
            raise RowRejected("unknown_gpu", f"gpu_name {gpu!r} is not curated")


@dataclass(frozen=True, slots=True)
class Series:
    """A kernel × provider × pass × GPU × metric: the shared part of its runs."""

    kernel: str
    provider: str
    mode: str
    gpu: str
    memory: bool
    kernel_title: str
    architecture: str
    baseline: bool
    references: tuple[Record, Record, Record, Record, Record]  # operation … environment

    def run(
        self, stats: list[float], observed_at: str, stamp: str, workload: Workload, version: str
    ) -> tuple[Record, RunFacts]:
        kernel, provider, mode, memory = self.kernel, self.provider, self.mode, self.memory
        values = [js_round(v * (MIB if memory else 1e6)) for v in stats]
        external_id = f"{kernel}/{mode}/{provider}/{slug(self.gpu)}/{workload.case_key}/{stamp}"
        _, _, implementation, protocol, environment = self.references
        spec: dict[str, Any] = {
            "implementationDigest": implementation.digest,
            "workloadDigest": workload.record.digest,
            "protocolDigest": protocol.digest,
            "environmentDigest": environment.digest,
            "status": "passed",
        }
        if memory:
            external_id += "/memory"
            spec["measurements"] = [
                {"metric": "memory", "unit": "bytes", "statistic": s, "value": v}
                for s, v in zip(("median", "p20", "p80"), values, strict=True)
            ]
            native = dict(zip(("mb_50", "mb_20", "mb_80"), stats, strict=True))
        else:
            spec["timing"] = {"primaryStatistic": "median", "latencyNs": {"median": values[0]}}
            spec["measurements"] = [
                {"metric": "latency", "unit": "ns", "statistic": "p20", "value": values[1]},
                {"metric": "latency", "unit": "ns", "statistic": "p80", "value": values[2]},
            ]
            native = dict(zip(("ms_50", "ms_20", "ms_80"), stats, strict=True))
        spec["sourceNative"] = {
            "source": SOURCE,
            "benchmark": f"{kernel}/{mode}",
            "externalId": external_id,
            "metrics": native,
        }
        spec["observedAt"] = observed_at
        name_mode = f"{mode}-memory" if memory else mode
        metadata: dict[str, Any] = {
            "name": joined_slug(
                "liger", kernel, name_mode, provider, self.gpu, workload.case_key, stamp
            )[:NAME_LIMIT],
            "title": f"{self.kernel_title} · {provider} · {mode}" + (" · memory" if memory else ""),
        }
        if version:
            metadata["labels"] = {"liger_version": version}
        run = _run_record(_manifest("BenchmarkRun", metadata, spec), stats, values)
        facts = RunFacts(
            metric="memory" if memory else "latency",
            unit="bytes" if memory else "ns",
            kernel=kernel,
            provider=provider,
            mode=mode,
            gpu=self.gpu,
            architecture=self.architecture,
            dtype=workload.dtype,
            case_key=workload.case_key,
            median=values[0],
            p20=values[1],
            p80=values[2],
            observed_at=observed_at,
            external_id=external_id,
            liger_version=version or None,
            origin="reported",
            extra={"baseline": self.baseline},
        )
        return run, facts


def _run_record(manifest: dict[str, Any], floats: list[float], integers: list[int]) -> Record:
    """A run's record. Its keys are ASCII literals and its strings print alike in both
    serializers, so only its numbers decide whether the fast canonical path applies."""
    if numbers_print_alike(*floats, *integers):
        digest = digest_of_canonical(canonical_json_prechecked(identity(manifest)))
        return Record("BenchmarkRun", digest, manifest)
    return _record(manifest)


# --- helpers over config values -------------------------------------------------------------
def _is_integer(value: Any) -> bool:
    return type(value) is int or (type(value) is float and value.is_integer())


def _parse_config(text: str) -> dict[str, Any]:
    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        config = json.loads(text, parse_constant=reject_constant)
    except ValueError as error:
        raise RowRejected("bad_config_json", f"extra_benchmark_config_str: {error}") from None
    if not isinstance(config, dict):
        raise RowRejected("bad_config_json", "extra_benchmark_config_str is not a JSON object")
    return config


def _check_config_keys(
    kernel: str,
    x_name: str,
    allowed: frozenset[str],
    require: dict[str, Any],
    config: dict[str, Any],
) -> None:
    unexpected = sorted(set(config) - allowed)
    if unexpected:
        raise RowRejected(
            "unknown_config_shape", f"{kernel}/{x_name}: unexpected config key(s) {unexpected}"
        )
    for key, expected in require.items():
        value = config.get(key)
        if (
            value != expected
            or type(value) is not type(expected)
            and not (_is_integer(value) and _is_integer(expected))
        ):
            raise RowRejected(
                "unknown_config_shape",
                f"{kernel}/{x_name}: config {key}={value!r}, curated for {expected!r}",
            )


def _positive_integer(text: str, column: str) -> int:
    value = parse_positive(text, column)
    if not value.is_integer():
        raise RowRejected("unknown_config_shape", f"{column} {text!r} is not an integer size")
    return int(value)


def _axis_value(axis: str, value: Any) -> int:
    if not _is_integer(value) or value <= 0:
        raise RowRejected(
            "unknown_config_shape", f"axis {axis} is not a positive integer: {value!r}"
        )
    return int(value)


def _scalar(name: str, value: Any) -> float | int:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise RowRejected("unknown_config_shape", f"scalar {name} is not a number: {value!r}")
    return value


def _metric(name: str, unit: str) -> str:
    if (name, unit) == ("speed", "ms"):
        return "speed"
    if (name, unit) == ("memory", "MB"):
        return "memory"
    raise RowRejected(
        "unknown_metric", f"metric {name!r} in {unit!r}: expected speed/ms or memory/MB"
    )


def _tensors(kernel: Kernel, axes: dict[str, int], dtype: str) -> dict[str, Any]:
    sizes: dict[str, int] = dict(axes)
    try:
        for axis, expression in kernel.derived_axes.items():
            sizes[axis] = _axis_value(axis, expression.evaluate(sizes))
    except (ExpressionError, ZeroDivisionError) as error:
        raise RowRejected("unknown_config_shape", f"{kernel.name}: {error}") from None
    tensors = {}
    for entry in kernel.operation["spec"]["inputs"]:
        tensor = entry.get("tensor")
        if tensor is None:
            continue
        shape = [dim if isinstance(dim, int) else sizes[dim] for dim in tensor["shape"]]
        tensors[entry["name"]] = {
            "shape": shape,
            "dtype": dtype if tensor["dtype"] == "float" else tensor["dtype"],
        }
    return tensors


# --- the file ---------------------------------------------------------------------------------
def _outcomes(csv_file: LigerCsv, normalizer: Normalizer) -> Iterator[RowOutcome]:
    columns = csv_file.columns
    seen: set[str] = set()
    for record in csv_file.records:
        outcome = outcome_of(record, columns, normalizer)
        if outcome.facts is not None:
            external_id = outcome.facts.external_id
            if external_id in seen:
                outcome = duplicate_outcome(record.line, record.raw, external_id)
            else:
                seen.add(external_id)
        yield outcome


def duplicate_outcome(line: int, raw: str, external_id: str) -> RowOutcome:
    detail = f"externalId {external_id} already appeared earlier in this file (first one wins)"
    return RowOutcome(line, "quarantined", raw, "duplicate_external_id", detail)


def outcome_of(record: CsvRecord, columns: tuple[str, ...], normalizer: Normalizer) -> RowOutcome:
    """One record's outcome, judged alone (duplicates across the file are the caller's rule)."""
    if record.fields is None or record.error is not None:
        reason = (record.error or "unparseable_row").split(":", 1)[0]
        return RowOutcome(record.line, "quarantined", record.raw, reason, record.error)
    if len(record.fields) != len(columns):
        detail = f"expected {len(columns)} fields, found {len(record.fields)}"
        return RowOutcome(record.line, "quarantined", record.raw, "wrong_column_count", detail)
    row = dict(zip(columns, record.fields, strict=True))
    try:
        records, facts = normalizer.normalize(row)
    except RowRejected as rejected:
        return RowOutcome(record.line, "quarantined", record.raw, rejected.reason, rejected.detail)
    return RowOutcome(record.line, "ok", record.raw, records=records, facts=facts)


def normalize_lines(
    lines: Iterable[bytes], normalizer: Normalizer | None = None
) -> Iterator[RowOutcome]:
    """Normalize a Liger CSV given as binary lines (e.g. a file opened "rb"): streams.

    Raises NotLigerCsv before yielding anything when the header is not Liger's.
    """
    csv_file = open_liger_csv(lines)
    return _outcomes(csv_file, normalizer or Normalizer())


def normalize_stream(
    stream: BinaryIO, normalizer: Normalizer | None = None
) -> Iterator[RowOutcome]:
    return normalize_lines(stream, normalizer)


def normalize_bytes(data: bytes, normalizer: Normalizer | None = None) -> Iterator[RowOutcome]:
    return normalize_lines(io.BytesIO(data), normalizer)
