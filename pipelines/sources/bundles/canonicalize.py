"""Authoring conveniences turned into canonical values before a manifest is validated and hashed.

DESIGN.md section 1: set-like lists of an ImplementationRevision are deduplicated and sorted by
UTF-16 code unit; durations written as `<number> ns|us|µs|ms|s` become integer nanoseconds (the
double-precision product of number and unit, refused when it is not a whole, safe integer);
`observedAt` must be a UTC instant ending in `Z` and is kept as written.

Functions here never mutate their input: a reader may share one object between several places
(YAML aliases), so every change is made on a copy.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipelines.records.rules import DURATION_NS, MAX_SAFE_INTEGER, Reason

# The schemas' own pattern for a duration string (JSON Schema `\d` is ASCII in practice).
DURATION_PATTERN = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s?(ns|us|µs|ms|s)$")

LATENCY_STATISTICS = ("median", "mean", "p05", "p95", "minimum", "maximum", "mad")
SET_LIKE_SUPPORT_LISTS = ("hardwareArchitectures", "productsTested", "axes", "dtypes", "layouts")


@dataclass(frozen=True, slots=True)
class Problem:
    pointer: str  # relative to the manifest
    reason: str
    detail: str


class AmbiguousDuration(ValueError):
    pass


def duration_ns(value: Any) -> Any:
    """Integer nanoseconds for a duration as authored; other types are returned unchanged (the
    schema reports them). Raises AmbiguousDuration when the value is not a whole, safe ns count."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        if not value.is_integer() or abs(value) > MAX_SAFE_INTEGER:
            raise AmbiguousDuration(f"{value!r} is not a whole number of nanoseconds")
        return int(value)
    if not isinstance(value, str):
        return value
    match = DURATION_PATTERN.match(value)
    if match is None:
        return value
    number, unit = match.groups()
    product = float(number) * DURATION_NS[unit]
    if not product.is_integer() or product > MAX_SAFE_INTEGER:
        raise AmbiguousDuration(f"{value!r} is {product!r} ns, not a whole, safe integer")
    return int(product)


def code_unit_key(text: str) -> bytes:
    """Sort key ordering strings by UTF-16 code units (as JCS and JavaScript do)."""
    return text.encode("utf-16-be")


def sorted_set(items: list[Any]) -> list[Any]:
    if not all(isinstance(item, str) for item in items):
        return items  # the schema reports the wrong item type
    return sorted(set(items), key=code_unit_key)


def canonicalize(manifest: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """A canonical copy of a manifest and the problems found converting it."""
    result = copy.deepcopy(manifest)
    problems = list(_canonicalize_in_place(result))
    return result, problems


def _canonicalize_in_place(manifest: dict[str, Any]) -> Iterator[Problem]:
    spec = manifest.get("spec")
    if not isinstance(spec, dict):
        return
    kind = manifest.get("kind")
    if kind == "BenchmarkRun":
        yield from _run_durations(spec)
        yield from _observed_at(spec)
    elif kind == "BenchmarkProtocol":
        measurement = spec.get("measurement")
        if isinstance(measurement, dict) and "warmupDuration" in measurement:
            yield from _convert(measurement, "warmupDuration", "/spec/measurement/warmupDuration")
    elif kind == "ImplementationRevision":
        support = spec.get("support")
        if isinstance(support, dict):
            for name in SET_LIKE_SUPPORT_LISTS:
                if isinstance(support.get(name), list):
                    support[name] = sorted_set(support[name])


def _convert(container: dict[str, Any] | list[Any], key: Any, pointer: str) -> Iterator[Problem]:
    try:
        container[key] = duration_ns(container[key])
    except AmbiguousDuration as error:
        yield Problem(pointer, Reason.AMBIGUOUS_DURATION, str(error))


def _run_durations(spec: dict[str, Any]) -> Iterator[Problem]:
    timing = spec.get("timing")
    latency = timing.get("latencyNs") if isinstance(timing, dict) else None
    if not isinstance(latency, dict):
        return
    base = "/spec/timing/latencyNs"
    for name in LATENCY_STATISTICS:
        if name in latency:
            yield from _convert(latency, name, f"{base}/{name}")
    interval = latency.get("confidence95")
    if isinstance(interval, list):
        for index in range(min(len(interval), 2)):
            yield from _convert(interval, index, f"{base}/confidence95/{index}")


def _observed_at(spec: dict[str, Any]) -> Iterator[Problem]:
    value = spec.get("observedAt")
    if isinstance(value, str) and not value.endswith("Z"):
        yield Problem(
            "/spec/observedAt",
            Reason.BAD_TIMESTAMP,
            f"observedAt {value!r} must be a UTC instant ending in 'Z' (offsets are not accepted)",
        )
